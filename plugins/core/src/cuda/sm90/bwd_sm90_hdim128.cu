// Hopper backward kernels for head dim 128: bf16 and fp16, and FP8 calls' e4m3 products (one
// translation unit per head dim).
#include <cstdlib>
#include <string>

#include "backward_sm90.cuh"

namespace attncore::cuda::sm90 {
template void launch_backward_sm90<__nv_bfloat16, 128>(const BackwardParams&, cudaStream_t);
template void launch_backward_sm90<__half, 128>(const BackwardParams&, cudaStream_t);
template void launch_backward_sm90_fp8<128>(const BackwardParams&, const BackwardParams&, cudaStream_t);

// Rows a call needs for the FP8 products (docs/KERNELS.md, "FP8 backward").
constexpr int64_t kFp8ProductRows = 1024;

bool fp8_products_serve(const BackwardParams& p) {
  if (const char* on = std::getenv("ATTNCORE_FP8_PRODUCTS"); on && std::string(on) == "0") return false;
  const bool plain = !p.blocks && p.num_segments == 0 && p.mask.window_left < 0 && p.mask.window_right < 0;
  return p.head_dim == 128 && p.dtype == DType::fp8_e4m3 && do_dtype(p) == DType::fp8_e4m3 && plain &&
         !p.deterministic && p.seqlen_q >= kFp8ProductRows && tma_readable(p.dq, 4);
}
} // namespace attncore::cuda::sm90
