// The FP8 backward's inputs for the bf16 kernels: Q, K, V and dO widened once per call (Q only for
// the backward with e4m3 products), each element times its tensor's descale, into packed bf16
// tensors in the call's workspace (docs/KERNELS.md, "FP8 backward").
#include "fp8_inputs.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "../workspace_bytes.h"
#include "launch.h"

namespace attncore::cuda {

namespace {

constexpr int kUnit = 16; // FP8 elements a strided step widens: one 16-byte load, two 16-byte stores
// Loads of eight codes a thread has in flight where the source is one run (WidenJob::packed).
constexpr int kInFlight = 4;

struct WidenJob {
  TensorRef src;        // FP8, 16-byte aligned, strides multiples of 16 elements
  __nv_bfloat16* dst;   // packed [batch, tokens, heads, head_dim]
  float descale;
  int32_t heads;
  int64_t tokens, units; // units: batch * tokens * heads * head_dim / kUnit
  bool e4m3;             // else e5m2 (dO of the hybrid recipe)
  bool packed;           // src's rows back to back, as dst's: element e at byte e of src, 2 e of dst
};

struct WidenJobs {
  WidenJob job[4];
  int32_t head_dim;
};

// blockIdx.y picks the tensor; the grid strides over its 16-element units in memory order. A packed
// source (the usual case) is read as one run, eight codes a thread, kInFlight loads before the first
// store: unit by unit through its strides, Q at B=4 H=32 S=16384 D=128 took 409 us against 331
// (docs/KERNELS.md, "FP8 backward").
__global__ void __launch_bounds__(256) widen_fp8_kernel(const __grid_constant__ WidenJobs jobs) {
  const WidenJob& j = jobs.job[blockIdx.y];
  const int64_t threads = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  uint4* dst = reinterpret_cast<uint4*>(j.dst);
  if (j.packed) { // eight elements a thread a load: a warp's loads 256 bytes, its stores 512, whole sectors
    const uint2* src = static_cast<const uint2*>(j.src.data);
    const int64_t halves = 2 * j.units;
    for (int64_t h0 = first; h0 < halves; h0 += kInFlight * threads) {
      uint2 raw[kInFlight];
#pragma unroll
      for (int k = 0; k < kInFlight; ++k)
        if (h0 + k * threads < halves) raw[k] = src[h0 + k * threads];
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        const int64_t h = h0 + k * threads;
        if (h >= halves) break;
        uint4 out[2];
        widen_fp8_unit<false>(make_uint4(raw[k].x, raw[k].y, 0, 0), j.e4m3, j.descale, out);
        dst[h] = out[0];
      }
    }
    return;
  }
  const int32_t per_row = jobs.head_dim / kUnit;
  for (int64_t u = first; u < j.units; u += threads) {
    const int64_t row = u / per_row, bi = row / j.heads;
    const int64_t h = row - bi * j.heads, b = bi / j.tokens, i = bi - b * j.tokens;
    const int64_t col = (u - row * per_row) * kUnit;
    const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(j.src.data) + b * j.src.batch_stride +
                                                      i * j.src.token_stride + h * j.src.head_stride + col);
    uint4 out[2];
    widen_fp8_unit<false>(raw, j.e4m3, j.descale, out);
    dst[2 * u] = out[0];
    dst[2 * u + 1] = out[1];
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
    if (products && t > 0) continue;
    const int64_t units = int64_t(p.batch) * x.tokens * x.heads * (p.head_dim / kUnit);
    const int64_t row = int64_t(x.heads) * p.head_dim;
    const bool packed = x.src.head_stride == p.head_dim && x.src.token_stride == row &&
                        (p.batch == 1 || x.src.batch_stride == x.tokens * row);
    jobs.job[jobs_n++] = WidenJob{x.src, static_cast<__nv_bfloat16*>(x.dst.data), x.descale, x.heads, x.tokens, units,
                                  x.type == DType::fp8_e4m3, packed};
    most = std::max(most, units);
  }
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((2 * most + threads * kInFlight - 1) / (threads * kInFlight), 4096);
  if (blocks > 0) {
    widen_fp8_kernel<<<dim3(unsigned(blocks), unsigned(jobs_n)), threads, 0, stream>>>(jobs);
    check_launch("widening the FP8 backward's inputs");
  }
  return w;
}

} // namespace attncore::cuda
