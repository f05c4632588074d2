// Hopper backward kernels for head dim 128: bf16 and fp16, and FP8 calls' e4m3 products (one
// translation unit per head dim).
#include <cstdlib>
#include <string>

#include "backward_sm90.cuh"

namespace attncore::cuda::sm90 {
template void launch_backward_sm90<__nv_bfloat16, 128>(const BackwardParams&, cudaStream_t);
template void launch_backward_sm90<__half, 128>(const BackwardParams&, cudaStream_t);
template void launch_backward_sm90_fp8<128>(const BackwardParams&, const BackwardParams&, cudaStream_t);

// Rows a call needs for the FP8 products (docs/KERNELS.md, "FP8 backward"). The products are taken
// only on ATTNCORE_FP8_PRODUCTS=1: P^T in e4m3 (times 2^8) loses dV's precision as rows grow, rel L2
// 0.026 / 0.031 / 0.097 at 4096 / 16384 / 65536 keys without a mask against 0.0023 on widened inputs,
// and a ring step's P is normalized over every rank's keys, which its call cannot see.
constexpr int64_t kFp8ProductRows = 1024;

bool fp8_products_serve(const BackwardParams& p) {
  const char* on = std::getenv("ATTNCORE_FP8_PRODUCTS");
  if (!on || std::string(on) != "1") return false;
  // (The e4m3 tensors are mapped for the copy engine as given, not read by the widening's loads.)
  const bool mappable = tma_readable(p.q, 1) && tma_readable(p.k, 1) && tma_readable(p.v, 1) && tma_readable(p.d_o, 1);
  return p.head_dim == 128 && p.dtype == DType::fp8_e4m3 && do_dtype(p) == DType::fp8_e4m3 && plain_call(p) &&
         !p.deterministic && p.seqlen_q >= kFp8ProductRows && mappable;
}
} // namespace attncore::cuda::sm90
