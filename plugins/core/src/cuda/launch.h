// Host-side contract between the dispatcher (api.cu) and the per-head-dim translation units
// (fwd_hdim*.cu, bwd_hdim*.cu): one launcher per (element type, head dim), instantiated there.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "attncore/attention.h"

namespace attncore::cuda {

template <class T, int D> void launch_forward(const ForwardParams& p, cudaStream_t stream);
template <class T, int D> void launch_backward(const BackwardParams& p, cudaStream_t stream);

// Throws attncore::Error naming the operation when the last launch failed.
void check_launch(const char* what);

// Shared memory a block may opt into on the current device: launchers pick a kernel shape by it.
size_t max_smem_per_block();

// Throws attncore::Error, one line naming the kernel, the head dim and both figures, when `bytes`
// of shared memory exceed what the device allows a block (`allowed`, max_smem_per_block()).
void require_smem(size_t bytes, size_t allowed, const char* what, int head_dim);

// The least shared memory a block may opt into on a device the mma.sync kernels serve: 99 KB on
// sm_86, sm_89 and sm_120 (163 KB on sm_80, 227 KB on sm_90 and sm_100).
inline constexpr size_t kSmallestSmem = 99 * 1024;

#define ATTNCORE_DECLARE_HDIM(D)                                                                   \
  extern template void launch_forward<__nv_bfloat16, D>(const ForwardParams&, cudaStream_t);    \
  extern template void launch_forward<__half, D>(const ForwardParams&, cudaStream_t);           \
  extern template void launch_backward<__nv_bfloat16, D>(const BackwardParams&, cudaStream_t);  \
  extern template void launch_backward<__half, D>(const BackwardParams&, cudaStream_t);

ATTNCORE_DECLARE_HDIM(64)
ATTNCORE_DECLARE_HDIM(80)
ATTNCORE_DECLARE_HDIM(96)
ATTNCORE_DECLARE_HDIM(128)
ATTNCORE_DECLARE_HDIM(256)
#undef ATTNCORE_DECLARE_HDIM

#if ATTNCORE_HAVE_SM90
// The Hopper path (sm90/): launched only where sm90::hopper_path_enabled() says it runs.
namespace sm90 {
template <class T, int D> void launch_forward_sm90(const ForwardParams& p, cudaStream_t stream);
// Not deterministic (dQ is added with atomics). True where the kernel wrote dq_out itself
// (BackwardParams::dq_out; else the caller's pass).
template <class T, int D> bool launch_backward_sm90(const BackwardParams& p, cudaStream_t stream);
#define ATTNCORE_DECLARE_SM90_HDIM(D)                                                              \
  extern template void launch_forward_sm90<__nv_bfloat16, D>(const ForwardParams&, cudaStream_t); \
  extern template void launch_forward_sm90<__half, D>(const ForwardParams&, cudaStream_t);
ATTNCORE_DECLARE_SM90_HDIM(64)
ATTNCORE_DECLARE_SM90_HDIM(80)
ATTNCORE_DECLARE_SM90_HDIM(96)
ATTNCORE_DECLARE_SM90_HDIM(128)
ATTNCORE_DECLARE_SM90_HDIM(256)
#undef ATTNCORE_DECLARE_SM90_HDIM
// FP8 e4m3 inputs, bf16 (or fp32) O; head dims 64, 128, 256 (fwd_sm90_fp8_hdim*.cu).
template <int D> void launch_forward_sm90_fp8(const ForwardParams& p, cudaStream_t stream);
extern template void launch_forward_sm90_fp8<64>(const ForwardParams&, cudaStream_t);
extern template void launch_forward_sm90_fp8<128>(const ForwardParams&, cudaStream_t);
extern template void launch_forward_sm90_fp8<256>(const ForwardParams&, cudaStream_t);
#define ATTNCORE_DECLARE_SM90_BWD_HDIM(D)                                                          \
  extern template bool launch_backward_sm90<__nv_bfloat16, D>(const BackwardParams&, cudaStream_t); \
  extern template bool launch_backward_sm90<__half, D>(const BackwardParams&, cudaStream_t);
ATTNCORE_DECLARE_SM90_BWD_HDIM(64)
ATTNCORE_DECLARE_SM90_BWD_HDIM(80)
ATTNCORE_DECLARE_SM90_BWD_HDIM(96)
ATTNCORE_DECLARE_SM90_BWD_HDIM(128)
ATTNCORE_DECLARE_SM90_BWD_HDIM(256)
#undef ATTNCORE_DECLARE_SM90_BWD_HDIM
// The backward of an FP8 call with e4m3 products (bwd_sm90_hdim128.cu; docs/KERNELS.md, "FP8
// backward"): d128, e4m3 dO, plain calls (no segments, block list or window) of at least
// kFp8ProductRows rows, not deterministic, its FP8 tensors mappable by the copy engine, and not on
// ATTNCORE_FP8_PRODUCTS=0; else the bf16 kernels on widened inputs.
bool fp8_products_serve(const BackwardParams& p);
template <int D> bool launch_backward_sm90_fp8(const BackwardParams& fp8, const BackwardParams& widened, cudaStream_t stream);
extern template bool launch_backward_sm90_fp8<128>(const BackwardParams&, const BackwardParams&, cudaStream_t);
} // namespace sm90
#endif

} // namespace attncore::cuda
