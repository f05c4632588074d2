// Hopper backward kernels for head dim 128: bf16 and fp16, and FP8 calls' e4m3 products (one
// translation unit per head dim).
#include <cstdlib>
#include <string>

#include "backward_sm90.cuh"

namespace attncore::cuda::sm90 {
template bool launch_backward_sm90<__nv_bfloat16, 128>(const BackwardParams&, cudaStream_t);
template bool launch_backward_sm90<__half, 128>(const BackwardParams&, cudaStream_t);
template bool launch_backward_sm90_fp8<128>(const BackwardParams&, const BackwardParams&, cudaStream_t);

// Rows a call needs for the FP8 products (docs/KERNELS.md, "FP8 backward"). ATTNCORE_FP8_PRODUCTS=0
// keeps every FP8 call on widened inputs: dV's rel L2 there is about 0.0024 against the products'
// 0.026-0.029 (P^T rounded to e4m3, as the forward's P is for O), for about 5% more time.
constexpr int64_t kFp8ProductRows = 1024;

bool fp8_products_serve(const BackwardParams& p) {
  const char* products = std::getenv("ATTNCORE_FP8_PRODUCTS");
  if (products && std::string(products) == "0") return false;
  // (The e4m3 tensors are mapped for the copy engine as given, not read by the widening's loads.)
  const bool mappable = tma_readable(p.q, 1) && tma_readable(p.k, 1) && tma_readable(p.v, 1) && tma_readable(p.d_o, 1);
  return p.head_dim == 128 && p.dtype == DType::fp8_e4m3 && do_dtype(p) == DType::fp8_e4m3 && plain_call(p) &&
         !p.deterministic && p.seqlen_q >= kFp8ProductRows && mappable;
}
} // namespace attncore::cuda::sm90
