// Hopper FP8 (e4m3) forward kernel for head dim 128 (one translation unit per head dim).
#include "forward_sm90_fp8.cuh"

namespace attncore::cuda::sm90 {
template void launch_forward_sm90_fp8<128>(const ForwardParams&, cudaStream_t);
} // namespace attncore::cuda::sm90
