// Backward kernels (dK/dV, and dQ for deterministic mode) for head dim 128, bf16 and fp16.
#include "backward.cuh"

namespace attncore::cuda {
template void launch_backward<__nv_bfloat16, 128>(const BackwardParams&, cudaStream_t);
template void launch_backward<__half, 128>(const BackwardParams&, cudaStream_t);
} // namespace attncore::cuda
