// Hopper FP8 (e4m3) forward kernel for head dim 64 (one translation unit per head dim).
#include "forward_sm90_fp8.cuh"

namespace attncore::cuda::sm90 {
template void launch_forward_sm90_fp8<64>(const ForwardParams&, cudaStream_t);
} // namespace attncore::cuda::sm90
