// The CUDA back end: one thread per (batch, head, row) for the forward and for dQ; one thread per
// (batch, kv head, key) for dK and dV. fp32 accumulation, online softmax. Simple on purpose.
#include "naive_attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace naive {

namespace {

__device__ float load(const void* p, int32_t dtype, int64_t i) {
  if (dtype == 1) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  if (dtype == 8 || dtype == 9) return fp8_to_float(static_cast<const uint8_t*>(p)[i], dtype);
  if (dtype == 2) return __half2float(static_cast<const __half*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

// An input element times its tensor's descale.
__device__ float load(const void* p, int32_t dtype, float descale, int64_t i) { return load(p, dtype, i) * descale; }

__device__ void store(void* p, int32_t dtype, int64_t i, float f) {
  if (dtype == 1) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(f);
  else if (dtype == 2) static_cast<__half*>(p)[i] = __float2half_rn(f);
  else static_cast<float*>(p)[i] = f;
}

__device__ int64_t local_row(const Geometry& g, int64_t b, int64_t slot, int32_t h) {
  return ((b * g.chunk_q + slot) * g.heads_q + h) * g.head_dim;
}

__global__ void forward_kernel(Geometry g, Types ty, const void* q, const void* k, const void* v, void* o, float* lse) {
  const int64_t rows = g.batch * g.heads_q * g.chunk_q;
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= rows) return;
  const int64_t slot = t % g.chunk_q;
  const int32_t h = static_cast<int32_t>((t / g.chunk_q) % g.heads_q);
  const int64_t b = t / (g.chunk_q * g.heads_q);
  const int64_t i = g.q_begin() + slot;
  const int64_t row = local_row(g, b, slot, h);
  Interval keys = i < g.seqlen_q ? keys_of(g, i) : Interval{0, 0};
  float acc[kMaxHeadDim];
  for (int d = 0; d < g.head_dim; ++d) acc[d] = 0.f;
  float m = -INFINITY, l = 0.f;
  for (int64_t j = keys.lo; j < keys.hi; ++j) {
    const int64_t kr = gathered_row(g, b, j, g.kv_head(h));
    float s = 0.f;
    for (int d = 0; d < g.head_dim; ++d) s += load(q, ty.in, ty.descale_q, row + d) * load(k, ty.in, ty.descale_k, kr + d);
    s *= g.scale;
    const float m_new = fmaxf(m, s);
    const float correction = __expf(m - m_new), p = __expf(s - m_new);
    l = l * correction + p;
    for (int d = 0; d < g.head_dim; ++d) acc[d] = acc[d] * correction + p * load(v, ty.in, ty.descale_v, kr + d);
    m = m_new;
  }
  for (int d = 0; d < g.head_dim; ++d) store(o, ty.out, row + d, l > 0.f ? acc[d] / l : 0.f);
  lse[(b * g.heads_q + h) * g.chunk_q + slot] = l > 0.f ? m + logf(l) : -INFINITY;
}

__global__ void dq_kernel(Geometry g, Types ty, const void* q, const void* k, const void* v, const void* o,
                          const float* lse, const void* d_o, void* dq) {
  const int64_t rows = g.batch * g.heads_q * g.chunk_q;
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= rows) return;
  const int64_t slot = t % g.chunk_q;
  const int32_t h = static_cast<int32_t>((t / g.chunk_q) % g.heads_q);
  const int64_t b = t / (g.chunk_q * g.heads_q);
  const int64_t i = g.q_begin() + slot;
  const int64_t row = local_row(g, b, slot, h);
  Interval keys = i < g.seqlen_q ? keys_of(g, i) : Interval{0, 0};
  const float row_lse = lse[(b * g.heads_q + h) * g.chunk_q + slot];
  float delta = 0.f, acc[kMaxHeadDim];
  for (int d = 0; d < g.head_dim; ++d) {
    delta += load(d_o, ty.in, ty.descale_do, row + d) * load(o, ty.out, 1.f, row + d);
    acc[d] = 0.f;
  }
  for (int64_t j = keys.lo; j < keys.hi; ++j) {
    const int64_t kr = gathered_row(g, b, j, g.kv_head(h));
    float s = 0.f, dp = 0.f;
    for (int d = 0; d < g.head_dim; ++d) {
      s += load(q, ty.in, ty.descale_q, row + d) * load(k, ty.in, ty.descale_k, kr + d);
      dp += load(d_o, ty.in, ty.descale_do, row + d) * load(v, ty.in, ty.descale_v, kr + d);
    }
    const float p = __expf(s * g.scale - row_lse);
    const float ds = p * (dp - delta) * g.scale;
    for (int d = 0; d < g.head_dim; ++d) acc[d] += ds * load(k, ty.in, ty.descale_k, kr + d);
  }
  for (int d = 0; d < g.head_dim; ++d) store(dq, ty.out, row + d, acc[d]);
}

// One thread per (batch, kv head, key) over this rank's query rows: no atomics, deterministic.
__global__ void dkdv_kernel(Geometry g, Types ty, const void* q, const void* k, const void* v, const void* o,
                            const float* lse, const void* d_o, float* dk_part, float* dv_part) {
  const int64_t cols = g.batch * g.heads_kv * g.seqlen_kv;
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= cols) return;
  const int64_t j = t % g.seqlen_kv;
  const int32_t kvh = static_cast<int32_t>((t / g.seqlen_kv) % g.heads_kv);
  const int64_t b = t / (g.seqlen_kv * g.heads_kv);
  const int64_t kr = gathered_row(g, b, j, kvh);
  float dk[kMaxHeadDim], dv[kMaxHeadDim];
  for (int d = 0; d < g.head_dim; ++d) dk[d] = dv[d] = 0.f;
  Interval queries = queries_of(g, j);
  const int64_t lo = max(queries.lo, g.q_begin()), hi = min(queries.hi, min(g.q_begin() + g.chunk_q, g.seqlen_q));
  const int32_t group = g.heads_q / g.heads_kv;
  for (int32_t h = kvh * group; h < (kvh + 1) * group; ++h)
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t slot = i - g.q_begin();
      const int64_t row = local_row(g, b, slot, h);
      float s = 0.f, dp = 0.f, delta = 0.f;
      for (int d = 0; d < g.head_dim; ++d) {
        const float dov = load(d_o, ty.in, ty.descale_do, row + d);
        s += load(q, ty.in, ty.descale_q, row + d) * load(k, ty.in, ty.descale_k, kr + d);
        dp += dov * load(v, ty.in, ty.descale_v, kr + d);
        delta += dov * load(o, ty.out, 1.f, row + d);
      }
      const float p = __expf(s * g.scale - lse[(b * g.heads_q + h) * g.chunk_q + slot]);
      const float ds = p * (dp - delta) * g.scale;
      for (int d = 0; d < g.head_dim; ++d) {
        dk[d] += ds * load(q, ty.in, ty.descale_q, row + d);
        dv[d] += p * load(d_o, ty.in, ty.descale_do, row + d);
      }
    }
  for (int d = 0; d < g.head_dim; ++d) {
    dk_part[kr + d] = dk[d];
    dv_part[kr + d] = dv[d];
  }
}

__global__ void convert_kernel(const float* in, void* out, int32_t dtype, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) store(out, dtype, i, in[i]);
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

unsigned blocks(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace

void forward_cuda(const Geometry& g, const Types& ty, const void* q, const void* k, const void* v, void* o, float* lse,
                  int threads, void* stream) {
  const int64_t rows = g.batch * g.heads_q * g.chunk_q;
  if (rows == 0) return;
  forward_kernel<<<blocks(rows, threads), threads, 0, static_cast<cudaStream_t>(stream)>>>(g, ty, q, k, v, o, lse);
  check(cudaGetLastError(), "naive_attention forward kernel");
}

void backward_cuda(const Geometry& g, const Types& ty, const void* q, const void* k, const void* v, const void* o,
                   const float* lse, const void* d_o, void* dq, float* dk_part, float* dv_part, int threads,
                   void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t rows = g.batch * g.heads_q * g.chunk_q, cols = g.batch * g.heads_kv * g.seqlen_kv;
  const int64_t gathered = static_cast<int64_t>(g.world_size) * g.batch * g.chunk_kv * g.heads_kv * g.head_dim;
  check(cudaMemsetAsync(dk_part, 0, gathered * sizeof(float), s), "cudaMemsetAsync");  // padding stays zero
  check(cudaMemsetAsync(dv_part, 0, gathered * sizeof(float), s), "cudaMemsetAsync");
  if (rows > 0) dq_kernel<<<blocks(rows, threads), threads, 0, s>>>(g, ty, q, k, v, o, lse, d_o, dq);
  if (cols > 0) dkdv_kernel<<<blocks(cols, threads), threads, 0, s>>>(g, ty, q, k, v, o, lse, d_o, dk_part, dv_part);
  check(cudaGetLastError(), "naive_attention backward kernels");
}

void convert_cuda(const float* in, void* out, int32_t dtype, int64_t n, void* stream) {
  if (n == 0) return;
  convert_kernel<<<blocks(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(in, out, dtype, n);
  check(cudaGetLastError(), "naive_attention convert kernel");
}

void copy_cuda(void* dst, const void* src, int64_t bytes, void* stream) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)), "cudaMemcpyAsync");
}

void upload_cuda(void* dst, const void* src, int64_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}

}  // namespace naive
