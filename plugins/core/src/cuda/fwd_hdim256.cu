// Forward kernels for head dim 256, bf16 and fp16. One translation unit per (head dim, direction):
// a 2-core machine compiles them side by side.
#include "forward.cuh"

namespace attncore::cuda {
template void launch_forward<__nv_bfloat16, 256>(const ForwardParams&, cudaStream_t);
template void launch_forward<__half, 256>(const ForwardParams&, cudaStream_t);
} // namespace attncore::cuda
