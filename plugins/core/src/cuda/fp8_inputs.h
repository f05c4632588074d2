// The FP8 backward's inputs widened for its bf16 products (fp8_inputs.cu), and the widening of a
// 16-byte unit that the pass and the backward with e4m3 products share.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "attncore/attention.h"

namespace attncore::cuda {

// Enqueues the widening of p's Q, dO, K and V (times their descales) into bf16 at `at`, which
// holds widened_inputs_bytes(p) bytes (workspace_bytes.h), and returns p as the bf16 call on them
// (descales 1). The inputs must be 16-byte aligned with strides that are multiples of 16 elements;
// head_dim a multiple of 16.
// fp8_products: only Q (the backward with e4m3 products, which widens K itself a key tile,
// widen_fp8_unit), the returned k, d_o and v pointing at their slots unwritten (bf16 in name only:
// the caller writes dO^T into dO's).
enum class WidenFor { bf16_kernels, fp8_products };
BackwardParams widen_fp8_inputs(const BackwardParams& p, void* at, cudaStream_t stream,
                                WidenFor use = WidenFor::bf16_kernels);

// The column of K that column c of its interleaved widening holds: 8g + 2i and 8g + 2i + 1 hold
// 8g + i and 8g + 4 + i. The backward with e4m3 products widens K so, read only by dQ's product
// there, so that dQ's accumulator comes out in stmatrix's order (BackwardConfig::kDqByStmatrix).
__host__ __device__ constexpr int interleaved_column(int c) { return c / 8 * 8 + 4 * (c % 2) + c % 8 / 2; }

// Sixteen FP8 codes (a 16-byte unit, the low byte first) times `descale`, rounded to bf16 as two
// 16-byte units of eight columns; kInterleaved: each eight in interleaved_column's order. FP8 to
// half is exact, and so is half to float: one rounding, the bf16's.
template <bool kInterleaved>
__device__ __forceinline__ void widen_fp8_unit(uint4 raw, bool e4m3, float descale, uint4 (&out)[2]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  float x[16];
#pragma unroll
  for (int w = 0; w < 4; ++w)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(words[w] >> (16 * half)),
                                                       e4m3 ? __NV_E4M3 : __NV_E5M2);
      const float2 pair = __half22float2(__half2(h));
      x[4 * w + 2 * half] = pair.x * descale;
      x[4 * w + 2 * half + 1] = pair.y * descale;
    }
  uint32_t y[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) { // columns 2k, 2k + 1
    const int c0 = kInterleaved ? interleaved_column(2 * k) : 2 * k;
    const int c1 = kInterleaved ? interleaved_column(2 * k + 1) : 2 * k + 1;
    const __nv_bfloat162 b = __floats2bfloat162_rn(x[c0], x[c1]);
    y[k] = *reinterpret_cast<const uint32_t*>(&b);
  }
  out[0] = make_uint4(y[0], y[1], y[2], y[3]);
  out[1] = make_uint4(y[4], y[5], y[6], y[7]);
}

} // namespace attncore::cuda
