// Hopper backward kernels for head dim 80, bf16 and fp16 (one translation unit per head dim).
#include "backward_sm90.cuh"

namespace attncore::cuda::sm90 {
template bool launch_backward_sm90<__nv_bfloat16, 80>(const BackwardParams&, cudaStream_t);
template bool launch_backward_sm90<__half, 80>(const BackwardParams&, cudaStream_t);
} // namespace attncore::cuda::sm90
