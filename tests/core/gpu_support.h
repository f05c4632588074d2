// What the GPU tests of attncore share: device twins of the test problems (problem.h), the CPU
// reference run of a whole problem, and the checks with their dtype tolerances. Used by the native
// kernels' tests (test_gpu.cpp) and the cuDNN engine's (test_cudnn.cpp).
#pragma once

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "attncore/cpu.h"
#include "problem.h"

namespace coretest {

#define CUDA_OK(expr)                                                                              \
  do {                                                                                             \
    const cudaError_t e_ = (expr);                                                                 \
    REQUIRE_MESSAGE(e_ == cudaSuccess, #expr, ": ", cudaGetErrorString(e_));                       \
  } while (0)

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    if (n) CUDA_OK(cudaMalloc(&ptr, n));
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void upload(const void* src) { CUDA_OK(cudaMemcpy(ptr, src, bytes, cudaMemcpyHostToDevice)); }
  void download(void* dst) const { CUDA_OK(cudaMemcpy(dst, ptr, bytes, cudaMemcpyDeviceToHost)); }
  void poison() { CUDA_OK(cudaMemset(ptr, 0xff, bytes)); } // NaN in bf16, fp16 and fp32
};

// A host tensor's device twin: same layout, so the strides carry over.
struct DeviceTensor {
  std::unique_ptr<DeviceBuffer> buf;
  TensorRef ref;
  explicit DeviceTensor(const Tensor& t) : buf(std::make_unique<DeviceBuffer>(t.bytes.size())) {
    buf->upload(t.bytes.data());
    ref = TensorRef{buf->ptr, t.S * t.token_stride(), t.token_stride(), t.D};
  }
  void download(Tensor& t) const { buf->download(t.bytes.data()); }
};
struct DeviceStats {
  std::unique_ptr<DeviceBuffer> buf;
  RowStatsRef ref;
  explicit DeviceStats(const Stats& s) : buf(std::make_unique<DeviceBuffer>(s.v.size() * 4)) {
    buf->upload(s.v.data());
    ref = RowStatsRef{static_cast<float*>(buf->ptr), s.H * s.S, s.S};
  }
  void download(Stats& s) const { buf->download(s.v.data()); }
};

template <class V> inline std::unique_ptr<DeviceBuffer> upload_vector(const std::vector<V>& v) {
  auto b = std::make_unique<DeviceBuffer>(v.size() * sizeof(V));
  if (!v.empty()) b->upload(v.data());
  return b;
}

// The problem's inputs on the device, with its segments and block list.
struct DeviceProblem {
  DeviceTensor q, k, v, d_o;
  std::unique_ptr<DeviceBuffer> segs, row_ptr, kv_block, masked, col_ptr, q_block, q_masked, pieces, piece_col_ptr,
      piece_q_block, piece_q_masked;
  BlockList blocks;

  explicit DeviceProblem(Problem& p) : q(p.q), k(p.k), v(p.v), d_o(p.d_o) {
    segs = upload_vector(p.segments);
    if (p.blocks) {
      row_ptr = upload_vector(p.blocks->row_ptr);
      kv_block = upload_vector(p.blocks->kv_block);
      masked = upload_vector(p.blocks->masked);
      col_ptr = upload_vector(p.blocks->col_ptr);
      q_block = upload_vector(p.blocks->q_block);
      q_masked = upload_vector(p.blocks->q_masked);
      pieces = upload_vector(p.blocks->pieces);
      piece_col_ptr = upload_vector(p.blocks->piece_col_ptr);
      piece_q_block = upload_vector(p.blocks->piece_q_block);
      piece_q_masked = upload_vector(p.blocks->piece_q_masked);
      blocks = p.blocks->view();
      blocks.row_ptr = static_cast<const int32_t*>(row_ptr->ptr);
      blocks.kv_block = static_cast<const int32_t*>(kv_block->ptr);
      blocks.masked = static_cast<const uint8_t*>(masked->ptr);
      blocks.col_ptr = static_cast<const int32_t*>(col_ptr->ptr);
      blocks.q_block = static_cast<const int32_t*>(q_block->ptr);
      blocks.q_masked = static_cast<const uint8_t*>(q_masked->ptr);
      blocks.pieces = static_cast<const int32_t*>(pieces->ptr);
      blocks.piece_col_ptr = static_cast<const int32_t*>(piece_col_ptr->ptr);
      blocks.piece_q_block = static_cast<const int32_t*>(piece_q_block->ptr);
      blocks.piece_q_masked = static_cast<const uint8_t*>(piece_q_masked->ptr);
    }
  }
  void point(const Problem& p, ForwardParams& f) const {
    f.q = q.ref;
    f.k = k.ref;
    f.v = v.ref;
    f.segments = p.segments.empty() ? nullptr : static_cast<const Segment*>(segs->ptr);
    f.blocks = p.blocks ? &blocks : nullptr;
  }
  void point(const Problem& p, BackwardParams& g) const {
    g.q = q.ref;
    g.k = k.ref;
    g.v = v.ref;
    g.d_o = d_o.ref;
    g.segments = p.segments.empty() ? nullptr : static_cast<const Segment*>(segs->ptr);
    g.blocks = p.blocks ? &blocks : nullptr;
  }
};

// The CPU reference (float accumulation) of forward, delta (from the dtype O, as a training step
// would) and backward.
inline Outputs run_cpu(Problem& p, bool grads) {
  return cpu_outputs<float>(p, grads, DeltaFrom::o_dtype, std::numeric_limits<float>::quiet_NaN());
}

// Max error over max |ref| (at least 1e-3), and the error's norm over the reference's norm (its
// RMS at least 1e-5): a tensor that is zero in exact arithmetic (dK and dQ of a single key, whose
// dS cancels to rounding) carries only the fp32 sums' noise on both sides, about 1e-6 at the FP8
// tests' magnitudes.
struct Diff {
  double max_abs = 0, ref_max = 0, sq = 0, ref_sq = 0;
  long count = 0, nonfinite = 0;
  void add(double got, double want) {
    ++count;
    if (!std::isfinite(got)) {
      ++nonfinite;
      return;
    }
    max_abs = std::max(max_abs, std::abs(got - want));
    ref_max = std::max(ref_max, std::abs(want));
    sq += (got - want) * (got - want);
    ref_sq += want * want;
  }
  double rel_max() const { return max_abs / std::max(ref_max, 1e-3); }
  double rel_norm() const { return std::sqrt(sq / std::max(ref_sq, 1e-10 * double(count))); }
};

struct Tolerance {
  double out_max, out_norm, grad_max, grad_norm;
};
inline Tolerance tolerance(DType t) {
  // bf16 keeps 8 significant bits: P and dS are rounded to it before their products. FP8 (e4m3,
  // u = 2^-4) rounds P too: O's error is at most u and, over many keys, about u / sqrt(3) of its
  // norm (docs/SUITES.md, "FP8 tolerances", whose rel L2 bound 2u / sqrt(3) this takes).
  if (is_fp8(t)) return Tolerance{0.0625, 0.072, 0.125, 0.144};
  return t == DType::bf16 ? Tolerance{2e-2, 1e-2, 5e-2, 2.5e-2} : Tolerance{4e-3, 2e-3, 1e-2, 5e-3};
}

inline void check_forward(const Problem& p, const Outputs& want, const Outputs& got) {
  const Tolerance tol = tolerance(p.dtype);
  // LSE: fp32 scores, except that Hopper's FP8 products add their terms in fewer bits than fp32's
  // 24 (about 14, as measured for FP8 GEMMs on Hopper): a score keeps about 2^-13 of the sum of
  // |q_d k_d| x scale, some units at the tests' data and head dims, so 2^-10 of 1 + |LSE|.
  const double lse_tol = is_fp8(p.dtype) ? 1.0 / 1024 : 1e-4;
  Diff o, o32;
  double lse_err = 0;
  long lse_bad = 0, untouched_bad = 0;
  for (int64_t b = 0; b < p.B; ++b)
    for (int32_t h = 0; h < p.Hq; ++h)
      for (int64_t i = 0; i < p.Sq; ++i) {
        if (!p.row_covered(i)) { // never written: still NaN
          untouched_bad += !std::isnan(got.lse.at(b, h, i)) || !std::isnan(got.o.get(b, i, h, 0)) ||
                           !std::isnan(got.o32.get(b, i, h, p.D - 1));
          continue;
        }
        const float L = want.lse.at(b, h, i);
        for (const Stats* s : {&got.lse, &got.lse32}) {
          const float g = s->at(b, h, i);
          if (!std::isinf(L)) lse_err = std::max(lse_err, double(std::abs(g - L) / (1 + std::abs(L))));
          lse_bad += std::isinf(L) ? g != L : !(std::abs(g - L) <= lse_tol * (1 + std::abs(L)));
        }
        for (int32_t d = 0; d < p.D; ++d) {
          o.add(got.o.get(b, i, h, d), want.o.get(b, i, h, d));
          o32.add(got.o32.get(b, i, h, d), want.o32.get(b, i, h, d));
          if (std::isinf(L)) untouched_bad += got.o.get(b, i, h, d) != 0.0 || got.o32.get(b, i, h, d) != 0.0;
        }
      }
  INFO("O: max ", o.rel_max(), " norm ", o.rel_norm(), "; O fp32: max ", o32.rel_max(), " norm ", o32.rel_norm(),
       "; LSE: max ", lse_err);
  CHECK(o.nonfinite == 0);
  CHECK(o32.nonfinite == 0);
  CHECK(lse_bad == 0);
  CHECK(untouched_bad == 0);
  CHECK(o.rel_max() < tol.out_max);
  CHECK(o.rel_norm() < tol.out_norm);
  CHECK(o32.rel_max() < tol.out_max);
  CHECK(o32.rel_norm() < tol.out_norm);
}

inline void check_backward(const Problem& p, const Outputs& want, const Outputs& got) {
  const Tolerance tol = tolerance(p.dtype);
  Diff dq, dk, dv, delta;
  for (int64_t b = 0; b < p.B; ++b)
    for (int32_t h = 0; h < p.Hq; ++h)
      for (int64_t i = 0; i < p.Sq; ++i) {
        if (!p.row_covered(i)) continue;
        delta.add(got.delta.at(b, h, i), want.delta.at(b, h, i));
        for (int32_t d = 0; d < p.D; ++d) dq.add(got.dq.get(b, i, h, d), want.dq.get(b, i, h, d));
      }
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t j = 0; j < p.Skv; ++j)
      for (int32_t h = 0; h < p.Hkv; ++h)
        for (int32_t d = 0; d < p.D; ++d) {
          dk.add(got.dk.get(b, j, h, d), want.dk.get(b, j, h, d));
          dv.add(got.dv.get(b, j, h, d), want.dv.get(b, j, h, d));
        }
  INFO("dQ: max ", dq.rel_max(), " norm ", dq.rel_norm(), "; dK: max ", dk.rel_max(), " norm ", dk.rel_norm(),
       "; dV: max ", dv.rel_max(), " norm ", dv.rel_norm(), "; delta: max ", delta.rel_max());
  CHECK(dq.nonfinite + dk.nonfinite + dv.nonfinite + delta.nonfinite == 0);
  CHECK(delta.rel_max() < tol.out_max);
  CHECK(dq.rel_max() < tol.grad_max);
  CHECK(dk.rel_max() < tol.grad_max);
  CHECK(dv.rel_max() < tol.grad_max);
  CHECK(dq.rel_norm() < tol.grad_norm);
  CHECK(dk.rel_norm() < tol.grad_norm);
  CHECK(dv.rel_norm() < tol.grad_norm);
}

inline Problem random_problem(std::mt19937_64& rng, DType dt, int32_t D, int ratio, int64_t max_len) {
  Problem p;
  p.dtype = dt;
  p.D = D;
  p.B = 1 + int32_t(rng() % 2);
  p.Hkv = 1 + int32_t(rng() % 2);
  p.Hq = p.Hkv * ratio;
  p.Sq = 1 + int64_t(rng() % uint64_t(max_len));
  p.Skv = 1 + int64_t(rng() % uint64_t(max_len));
  std::mt19937_64 data(rng());
  p.randomize(data, /*pad=*/8 * int64_t(rng() % 2));
  return p;
}

inline int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  return n;
}

inline const char* name(DType t) { return t == DType::bf16 ? "bf16" : "fp16"; }
} // namespace coretest
