// naive_attention: an example attnhost plugin, written only against the installed
// <attnhost/plugin.h> and <attnhost/plugin.hpp>. Dense softmax attention, the obvious way:
// each rank holds a contiguous chunk of Q, K and V; forward all-gathers K and V and computes
// its rows; backward all-gathers them again and reduce-scatters the partial dK and dV.
// One thread per row on the GPU, plain loops on the CPU. A baseline and a template, not a
// fast kernel.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define NAIVE_HD __host__ __device__ inline
#else
#define NAIVE_HD inline
#endif

namespace naive {

constexpr int32_t kMaxHeadDim = 256;

// The element types of a call (attnhost dtype values): the inputs' (Q, K, V, dO) and the outputs'
// (O, dQ, dK, dV). They differ in an FP8 problem: FP8 inputs, each tensor with the descale that
// turns its elements into the values they stand for, and bf16 outputs.
struct Types {
  int32_t in, out;
  float descale_q = 1, descale_k = 1, descale_v = 1, descale_do = 1;
};

// An FP8 element (dtype 8: e4m3, 9: e5m2) as the float it encodes, before its tensor's descale.
NAIVE_HD float fp8_to_float(uint8_t b, int32_t dtype) {
  const int man = dtype == 8 ? 3 : 2, bias = dtype == 8 ? 7 : 15, top = dtype == 8 ? 15 : 31;
  const int exp = (b & 0x7f) >> man, m = b & ((1 << man) - 1);
  const float sign = (b & 0x80) ? -1.f : 1.f;
  if (dtype == 8 ? (b & 0x7f) == 0x7f : exp == top) return m || dtype == 8 ? NAN : sign * INFINITY;
  return sign * ldexpf(static_cast<float>(exp ? (1 << man) + m : m), (exp ? exp : 1) - bias - man);
}

// Everything a kernel needs to know about the problem and this rank's share of it.
struct Geometry {
  int64_t batch, seqlen_q, seqlen_kv;  // global
  int32_t heads_q, heads_kv, head_dim;
  int32_t causal;
  int64_t window_left, window_right;   // -1: unbounded
  float scale;
  int32_t world_size, rank;
  int64_t chunk_q, chunk_kv;           // tokens per rank (the last rank's tail is padding)
  int32_t num_seqs;                    // packed variable length when > 0
  const int64_t* cu_seqlens;           // num_seqs + 1 (same for queries and keys)

  NAIVE_HD int64_t q_begin() const { return rank * chunk_q; }
  NAIVE_HD int32_t kv_head(int32_t h) const { return h / (heads_q / heads_kv); }
  // Causal and windows are aligned to the bottom-right corner when seqlen_kv > seqlen_q.
  NAIVE_HD int64_t diagonal_offset() const { return seqlen_kv - seqlen_q; }
};

// The keys query i attends form one interval [lo, hi): intersect sequence, causal and window.
struct Interval {
  int64_t lo, hi;
};

NAIVE_HD Interval sequence_of(const Geometry& g, int64_t t) {
  if (g.num_seqs <= 0) return {0, g.seqlen_kv};
  int32_t lo = 0, hi = g.num_seqs;  // find s with cu[s] <= t < cu[s+1]
  while (hi - lo > 1) {
    int32_t mid = (lo + hi) / 2;
    if (g.cu_seqlens[mid] <= t) lo = mid; else hi = mid;
  }
  return {g.cu_seqlens[lo], g.cu_seqlens[lo + 1]};
}

NAIVE_HD Interval keys_of(const Geometry& g, int64_t i) {
  Interval r = sequence_of(g, i);
  int64_t d = i + (g.num_seqs > 0 ? 0 : g.diagonal_offset());
  if (g.causal && d + 1 < r.hi) r.hi = d + 1;
  if (g.window_right >= 0 && d + g.window_right + 1 < r.hi) r.hi = d + g.window_right + 1;
  if (g.window_left >= 0 && d - g.window_left > r.lo) r.lo = d - g.window_left;
  if (r.hi < r.lo) r.hi = r.lo;
  return r;
}

// The queries that attend key j: the inverse of keys_of, also one interval.
NAIVE_HD Interval queries_of(const Geometry& g, int64_t j) {
  Interval r = sequence_of(g, j);
  int64_t off = g.num_seqs > 0 ? 0 : g.diagonal_offset();
  if (g.num_seqs <= 0) r = {0, g.seqlen_q};
  if (g.causal && j - off > r.lo) r.lo = j - off;
  if (g.window_right >= 0 && j - off - g.window_right > r.lo) r.lo = j - off - g.window_right;
  if (g.window_left >= 0 && j - off + g.window_left + 1 < r.hi) r.hi = j - off + g.window_left + 1;
  if (r.hi < r.lo) r.hi = r.lo;
  return r;
}

// Local tensors are [B, chunk, H, D]; gathered K/V and the partial dK/dV are [P][B][chunk][Hkv][D].
NAIVE_HD int64_t gathered_row(const Geometry& g, int64_t b, int64_t j, int32_t kvh) {
  int64_t owner = j / g.chunk_kv, slot = j % g.chunk_kv;
  return (((owner * g.batch + b) * g.chunk_kv + slot) * g.heads_kv + kvh) * g.head_dim;
}

// ---- the two back ends ------------------------------------------------------------------------
// dtype: 1 bf16, 2 fp16, 3 fp32 (attnhost_dtype). `k`, `v` are gathered; `o` in dtype, lse fp32.
void forward_cpu(const Geometry& g, const Types& ty, const void* q, const void* k, const void* v, void* o, float* lse,
                 bool fp64);
// dq in dtype; dk_part, dv_part fp32 gathered layout (zeroed here), reduced by the caller.
void backward_cpu(const Geometry& g, const Types& ty, const void* q, const void* k, const void* v, const void* o,
                  const float* lse, const void* d_o, void* dq, float* dk_part, float* dv_part, bool fp64);
void convert_cpu(const float* in, void* out, int32_t dtype, int64_t n);

#if NAIVE_HAVE_CUDA
void forward_cuda(const Geometry& g, const Types& ty, const void* q, const void* k, const void* v, void* o, float* lse,
                  int threads, void* stream);
void backward_cuda(const Geometry& g, const Types& ty, const void* q, const void* k, const void* v, const void* o,
                   const float* lse, const void* d_o, void* dq, float* dk_part, float* dv_part, int threads, void* stream);
void convert_cuda(const float* in, void* out, int32_t dtype, int64_t n, void* stream);
void copy_cuda(void* dst, const void* src, int64_t bytes, void* stream);
void upload_cuda(void* dst, const void* host_src, int64_t bytes);  // synchronous
#endif

}  // namespace naive
