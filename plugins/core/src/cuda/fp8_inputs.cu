// The FP8 backward's inputs for the bf16 kernels: Q, K, V and dO widened once per call (Q and K only
// for the backward with e4m3 products), each element times its tensor's descale, into packed bf16
// tensors in the call's workspace (docs/KERNELS.md, "FP8 backward").
#include "fp8_inputs.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "../workspace_bytes.h"
#include "launch.h"

namespace attncore::cuda {

namespace {

constexpr int kUnit = 16; // FP8 elements a thread widens at a time: one 16-byte load, two 16-byte stores

struct WidenJob {
  TensorRef src;        // FP8, 16-byte aligned, strides multiples of 16 elements
  __nv_bfloat16* dst;   // packed [batch, tokens, heads, head_dim]
  float descale;
  int32_t heads;
  int64_t tokens, units; // units: batch * tokens * heads * head_dim / kUnit
  bool e4m3;             // else e5m2 (dO of the hybrid recipe)
  bool interleave;       // columns as interleaved_column places them
};

struct WidenJobs {
  WidenJob job[4];
  int32_t head_dim;
};

// Two FP8 codes (the low byte first) as floats: FP8 to half is exact, and so is half to float.
__device__ __forceinline__ float2 fp8x2_to_float2(uint16_t pair, bool e4m3) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(pair), e4m3 ? __NV_E4M3 : __NV_E5M2);
  return __half22float2(__half2(h));
}

// blockIdx.y picks the tensor; the grid strides over its 16-element units in memory order.
__global__ void __launch_bounds__(256) widen_fp8_kernel(const __grid_constant__ WidenJobs jobs) {
  const WidenJob& j = jobs.job[blockIdx.y];
  const int32_t per_row = jobs.head_dim / kUnit;
  for (int64_t u = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; u < j.units; u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = u / per_row, bi = row / j.heads;
    const int64_t h = row - bi * j.heads, b = bi / j.tokens, i = bi - b * j.tokens;
    const int64_t col = (u - row * per_row) * kUnit;
    const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(j.src.data) + b * j.src.batch_stride +
                                                      i * j.src.token_stride + h * j.src.head_stride + col);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
    float x[kUnit];
#pragma unroll
    for (int w = 0; w < 4; ++w)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float2 pair = fp8x2_to_float2(uint16_t(words[w] >> (16 * half)), j.e4m3);
        x[4 * w + 2 * half] = pair.x * j.descale;
        x[4 * w + 2 * half + 1] = pair.y * j.descale;
      }
    uint32_t out[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) { // columns 2k, 2k + 1 (the unit is whole groups of eight)
      const __nv_bfloat162 y = j.interleave ? __floats2bfloat162_rn(x[interleaved_column(2 * k)], x[interleaved_column(2 * k + 1)])
                                            : __floats2bfloat162_rn(x[2 * k], x[2 * k + 1]);
      out[k] = *reinterpret_cast<const uint32_t*>(&y);
    }
    uint4* dst = reinterpret_cast<uint4*>(j.dst + u * kUnit);
    dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
    dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
  }
}

TensorRef packed(void* at, int64_t tokens, int32_t heads, int32_t head_dim) {
  const int64_t token = int64_t(heads) * head_dim;
  return TensorRef{at, tokens * token, token, head_dim};
}

} // namespace

BackwardParams widen_fp8_inputs(const BackwardParams& p, void* at, cudaStream_t stream, WidenFor use) {
  const bool products = use == WidenFor::fp8_products;
  BackwardParams w = p;
  w.dtype = DType::bf16;
  w.dtype_do = DType::invalid;
  w.descale_q = w.descale_k = w.descale_v = w.descale_do = 1.f;
  char* next = static_cast<char*>(at);
  WidenJobs jobs{};
  jobs.head_dim = p.head_dim;
  const struct {
    const TensorRef& src;
    TensorRef& dst;
    float descale;
    int64_t tokens;
    int32_t heads;
    DType type;
  } tensors[4] = {{p.q, w.q, p.descale_q, p.seqlen_q, p.heads_q, p.dtype},
                  {p.d_o, w.d_o, p.descale_do, p.seqlen_q, p.heads_q, do_dtype(p)},
                  {p.k, w.k, p.descale_k, p.seqlen_kv, p.heads_kv, p.dtype},
                  {p.v, w.v, p.descale_v, p.seqlen_kv, p.heads_kv, p.dtype}};
  int64_t most = 0; // the tensors in the order of widened_inputs_bytes
  int jobs_n = 0;
  for (int t = 0; t < 4; ++t) {
    const auto& x = tensors[t];
    x.dst = packed(next, x.tokens, x.heads, p.head_dim);
    next += widened_tensor_bytes(p, x.tokens, x.heads);
    if (products && (t == 1 || t == 3)) continue;
    const int64_t units = int64_t(p.batch) * x.tokens * x.heads * (p.head_dim / kUnit);
    jobs.job[jobs_n++] = WidenJob{x.src, static_cast<__nv_bfloat16*>(x.dst.data), x.descale, x.heads, x.tokens, units,
                                  x.type == DType::fp8_e4m3, products && t == 2};
    most = std::max(most, units);
  }
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((most + threads - 1) / threads, 4096);
  if (blocks > 0) {
    widen_fp8_kernel<<<dim3(unsigned(blocks), unsigned(jobs_n)), threads, 0, stream>>>(jobs);
    check_launch("widening the FP8 backward's inputs");
  }
  return w;
}

} // namespace attncore::cuda
