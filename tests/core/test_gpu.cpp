// attncore CUDA kernels against the CPU reference (label gpu: needs a CUDA device).
// Shapes are random within each case (lengths that are not multiples of any tile), outputs are
// poisoned with NaN before each call so that an element a kernel forgets to write fails the check,
// and rows a call must not touch must still hold the poison afterwards.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "attncore/cpu.h"
#include "attncore/cuda.h"
#include "problem.h"

using namespace coretest;

namespace {

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

template <class V> std::unique_ptr<DeviceBuffer> upload_vector(const std::vector<V>& v) {
  auto b = std::make_unique<DeviceBuffer>(v.size() * sizeof(V));
  if (!v.empty()) b->upload(v.data());
  return b;
}

// The problem's inputs on the device, with its segments and block list.
struct DeviceProblem {
  DeviceTensor q, k, v, d_o;
  std::unique_ptr<DeviceBuffer> segs, row_ptr, kv_block, masked, col_ptr, q_block, q_masked;
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
      blocks = p.blocks->view();
      blocks.row_ptr = static_cast<const int32_t*>(row_ptr->ptr);
      blocks.kv_block = static_cast<const int32_t*>(kv_block->ptr);
      blocks.masked = static_cast<const uint8_t*>(masked->ptr);
      blocks.col_ptr = static_cast<const int32_t*>(col_ptr->ptr);
      blocks.q_block = static_cast<const int32_t*>(q_block->ptr);
      blocks.q_masked = static_cast<const uint8_t*>(q_masked->ptr);
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

struct Outputs {
  Tensor o, o32;
  Stats lse, lse32, delta;
  Tensor dq, dk, dv;
};

// The CPU reference (float accumulation) of forward, delta (from the dtype O, as a training step
// would) and backward.
Outputs run_cpu(Problem& p, bool grads) {
  Outputs r;
  r.o = Tensor(p.dtype, p.B, p.Sq, p.Hq, p.D);
  r.o32 = Tensor(DType::fp32, p.B, p.Sq, p.Hq, p.D);
  r.lse = Stats(p.B, p.Hq, p.Sq, std::numeric_limits<float>::quiet_NaN());
  r.lse32 = r.lse;
  r.o.fill(std::numeric_limits<double>::quiet_NaN());
  r.o32.fill(std::numeric_limits<double>::quiet_NaN());
  cpu::forward<float>(p.forward_params(r.o, r.lse, false));
  cpu::forward<float>(p.forward_params(r.o32, r.lse32, true));
  if (!grads) return r;
  r.delta = Stats(p.B, p.Hq, p.Sq, 0.f);
  DeltaParams dp;
  dp.dtype = p.dtype;
  dp.batch = p.B;
  dp.heads = p.Hq;
  dp.head_dim = p.D;
  dp.seqlen = p.Sq;
  dp.o = r.o.ref();
  dp.d_o = p.d_o.ref();
  dp.delta = r.delta.ref();
  cpu::compute_delta<float>(dp);
  r.dq = Tensor(DType::fp32, p.B, p.Sq, p.Hq, p.D);
  r.dk = Tensor(DType::fp32, p.B, p.Skv, p.Hkv, p.D);
  r.dv = Tensor(DType::fp32, p.B, p.Skv, p.Hkv, p.D);
  cpu::backward<float>(p.backward_params(r.lse, r.delta, r.dq, r.dk, r.dv));
  return r;
}

// The same on the GPU. The backward takes the CPU's LSE and delta so that its check isolates it.
Outputs run_gpu(Problem& p, bool grads, bool deterministic, const Outputs* cpu_ref) {
  DeviceProblem dp(p);
  Outputs r;
  r.o = Tensor(p.dtype, p.B, p.Sq, p.Hq, p.D);
  r.o32 = Tensor(DType::fp32, p.B, p.Sq, p.Hq, p.D);
  r.lse = Stats(p.B, p.Hq, p.Sq);
  r.lse32 = r.lse;
  DeviceTensor o(r.o), o32(r.o32);
  DeviceStats lse(r.lse), lse32(r.lse32);
  o.buf->poison();
  o32.buf->poison();
  lse.buf->poison();
  lse32.buf->poison();
  ForwardParams f = p.forward_params(r.o, r.lse, false);
  dp.point(p, f);
  f.o = o.ref;
  f.lse = lse.ref;
  forward_cuda(f, nullptr);
  f.o = o32.ref;
  f.lse = lse32.ref;
  f.o_fp32 = true;
  forward_cuda(f, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  o.download(r.o);
  o32.download(r.o32);
  lse.download(r.lse);
  lse32.download(r.lse32);
  if (!grads) return r;

  // delta on the GPU from the GPU's dtype O
  r.delta = Stats(p.B, p.Hq, p.Sq);
  DeviceStats delta(r.delta);
  delta.buf->poison();
  DeltaParams dlt;
  dlt.dtype = p.dtype;
  dlt.batch = p.B;
  dlt.heads = p.Hq;
  dlt.head_dim = p.D;
  dlt.seqlen = p.Sq;
  dlt.o = o.ref;
  dlt.d_o = dp.d_o.ref;
  dlt.delta = delta.ref;
  compute_delta_cuda(dlt, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  delta.download(r.delta);

  Stats ref_lse = cpu_ref ? cpu_ref->lse : r.lse, ref_delta = cpu_ref ? cpu_ref->delta : r.delta;
  DeviceStats lse_in(ref_lse), delta_in(ref_delta);
  r.dq = Tensor(DType::fp32, p.B, p.Sq, p.Hq, p.D);
  r.dk = Tensor(DType::fp32, p.B, p.Skv, p.Hkv, p.D);
  r.dv = Tensor(DType::fp32, p.B, p.Skv, p.Hkv, p.D);
  DeviceTensor dq(r.dq), dk(r.dk), dv(r.dv); // zero: accumulators start empty
  BackwardParams g = p.backward_params(ref_lse, ref_delta, r.dq, r.dk, r.dv);
  dp.point(p, g);
  g.lse = lse_in.ref;
  g.delta = delta_in.ref;
  g.dq = dq.ref;
  g.dk = dk.ref;
  g.dv = dv.ref;
  g.deterministic = deterministic;
  backward_cuda(g, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  dq.download(r.dq);
  dk.download(r.dk);
  dv.download(r.dv);
  return r;
}

// Max error over max |ref|, and the error's norm over the reference's norm.
struct Diff {
  double max_abs = 0, ref_max = 0, sq = 0, ref_sq = 0;
  long nonfinite = 0;
  void add(double got, double want) {
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
  double rel_norm() const { return std::sqrt(sq / std::max(ref_sq, 1e-12)); }
};

struct Tolerance {
  double out_max, out_norm, grad_max, grad_norm;
};
Tolerance tolerance(DType t) {
  // bf16 keeps 8 significant bits: P and dS are rounded to it before their products.
  return t == DType::bf16 ? Tolerance{2e-2, 1e-2, 5e-2, 2.5e-2} : Tolerance{4e-3, 2e-3, 1e-2, 5e-3};
}

void check_forward(const Problem& p, const Outputs& want, const Outputs& got) {
  const Tolerance tol = tolerance(p.dtype);
  Diff o, o32;
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
          lse_bad += std::isinf(L) ? g != L : !(std::abs(g - L) <= 1e-4 * (1 + std::abs(L)));
        }
        for (int32_t d = 0; d < p.D; ++d) {
          o.add(got.o.get(b, i, h, d), want.o.get(b, i, h, d));
          o32.add(got.o32.get(b, i, h, d), want.o32.get(b, i, h, d));
          if (std::isinf(L)) untouched_bad += got.o.get(b, i, h, d) != 0.0 || got.o32.get(b, i, h, d) != 0.0;
        }
      }
  INFO("O: max ", o.rel_max(), " norm ", o.rel_norm(), "; O fp32: max ", o32.rel_max(), " norm ", o32.rel_norm());
  CHECK(o.nonfinite == 0);
  CHECK(o32.nonfinite == 0);
  CHECK(lse_bad == 0);
  CHECK(untouched_bad == 0);
  CHECK(o.rel_max() < tol.out_max);
  CHECK(o.rel_norm() < tol.out_norm);
  CHECK(o32.rel_max() < tol.out_max);
  CHECK(o32.rel_norm() < tol.out_norm);
}

void check_backward(const Problem& p, const Outputs& want, const Outputs& got) {
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

void check_all(Problem& p, bool grads = true) {
  REQUIRE(check_supported(p.dtype, p.D).empty());
  const Outputs want = run_cpu(p, grads);
  const Outputs got = run_gpu(p, grads, false, &want);
  check_forward(p, want, got);
  if (!grads) return;
  check_backward(p, want, got);
  const Outputs det = run_gpu(p, grads, true, &want);
  check_backward(p, want, det);
}

Problem random_problem(std::mt19937_64& rng, DType dt, int32_t D, int ratio, int64_t max_len) {
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

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  return n;
}

const char* name(DType t) { return t == DType::bf16 ? "bf16" : "fp16"; }

} // namespace

TEST_CASE("gpu: a CUDA device is present") { REQUIRE_MESSAGE(device_count() > 0, "the gpu tests need a CUDA device"); }

TEST_CASE("gpu: every head dim and dtype, random shapes, causal and windows") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(42);
  for (DType dt : {DType::bf16, DType::fp16})
    for (int32_t D : {64, 80, 96, 128, 256})
      for (int variant = 0; variant < 3; ++variant) {
        Problem p = random_problem(rng, dt, D, 1 + int(rng() % 3), 300);
        if (variant == 0) p.mask.causal = true;
        if (variant == 1) {
          p.mask.causal = rng() % 2 == 0;
          p.mask.window_left = int64_t(rng() % 100);
          p.mask.window_right = p.mask.causal ? -1 : int64_t(rng() % 50);
        }
        p.mask.q_pos0 = int64_t(rng() % 64);
        p.mask.kv_pos0 = int64_t(rng() % 64);
        CAPTURE(name(dt));
        CAPTURE(D);
        CAPTURE(variant);
        CAPTURE(p.Sq);
        CAPTURE(p.Skv);
        CAPTURE(p.Hq);
        CAPTURE(p.Hkv);
        check_all(p);
      }
}

TEST_CASE("gpu: GQA ratios 1 to 8") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(7);
  for (int ratio = 1; ratio <= 8; ++ratio) {
    Problem p = random_problem(rng, DType::bf16, 64, ratio, 200);
    p.mask.causal = ratio % 2 == 1;
    CAPTURE(ratio);
    check_all(p);
  }
}

TEST_CASE("gpu: rows with no key (keys after every query, and a window past the keys)") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(9);
  for (int32_t D : {64, 128}) {
    Problem p = random_problem(rng, DType::bf16, D, 2, 150);
    p.mask.causal = true;
    p.mask.kv_pos0 = 100; // rows at positions < 100 see nothing
    CAPTURE(D);
    check_all(p);
    p.mask.causal = false;
    p.mask.kv_pos0 = 0;
    p.mask.q_pos0 = 1000; // a window of 5 reaches no key
    p.mask.window_left = 5;
    check_all(p);
  }
}

TEST_CASE("gpu: segments (varlen), rows outside every segment untouched") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(11);
  for (int32_t D : {64, 96, 256})
    for (int causal = 0; causal < 2; ++causal) {
      Problem p;
      p.dtype = D == 96 ? DType::fp16 : DType::bf16;
      p.D = D;
      p.Hq = 4;
      p.Hkv = 2;
      p.Sq = p.Skv = 700;
      std::mt19937_64 data(rng());
      p.randomize(data);
      p.mask.causal = causal == 1;
      p.segments = {{0, 130, 0, 130, 0, 0},   {130, 130, 130, 130, 0, 0}, {130, 400, 130, 400, 0, 0},
                    {410, 411, 410, 411, 0, 0}, {420, 700, 420, 700, 0, 0}};
      if (causal) p.segments.push_back({400, 410, 0, 300, 500, 0}); // queries after a long context
      CAPTURE(D);
      CAPTURE(causal);
      check_all(p);
    }
}

TEST_CASE("gpu: block lists (64 and 128, shared and per head, random with masked edges)") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(13);
  for (int32_t D : {64, 128, 256})
    for (int bq : {64, 128})
      for (int bk : {64, 128}) {
        Problem p = random_problem(rng, DType::bf16, D, 2, 600);
        p.Sq = 300 + int64_t(rng() % 300);
        p.Skv = 300 + int64_t(rng() % 300);
        std::mt19937_64 data(rng());
        p.randomize(data);
        p.mask.causal = true;
        p.mask.q_pos0 = 200;
        const int32_t nq = int32_t((p.Sq + bq - 1) / bq), nk = int32_t((p.Skv + bk - 1) / bk);
        const int32_t heads = rng() % 2 ? p.Hq : 1;
        std::vector<BlockState> st(size_t(heads * nq * nk));
        for (auto& s : st) s = BlockState(rng() % 3);
        p.blocks = make_block_list(bq, bk, nq, nk, heads,
                                   [&](int32_t h, int32_t qb, int32_t kb) { return st[size_t((h * nq + qb) * nk + kb)]; });
        CAPTURE(D);
        CAPTURE(bq);
        CAPTURE(bk);
        CAPTURE(heads);
        check_all(p);
      }
}

TEST_CASE("gpu: long causal sequence (many tiles, the pipeline)") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(17);
  Problem p = random_problem(rng, DType::bf16, 128, 2, 10);
  p.B = 1;
  p.Hkv = 1;
  p.Hq = 2;
  p.Sq = p.Skv = 2000;
  std::mt19937_64 data(rng());
  p.randomize(data);
  p.mask.causal = true;
  check_all(p);
}

TEST_CASE("gpu: partial fp32 forward + merge + convert equals the CPU's") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(19);
  Problem p = random_problem(rng, DType::bf16, 128, 2, 10);
  p.Sq = 190;
  p.Skv = 450;
  std::mt19937_64 data(rng());
  p.randomize(data);
  p.mask.causal = true;
  p.mask.q_pos0 = 200;
  const Outputs want = run_cpu(p, false);
  DeviceProblem dp(p);
  Tensor acc(DType::fp32, p.B, p.Sq, p.Hq, p.D), part = acc;
  Stats lse_acc(p.B, p.Hq, p.Sq, -std::numeric_limits<float>::infinity()), lse_part(p.B, p.Hq, p.Sq);
  acc.fill(0);
  DeviceTensor acc_d(acc), part_d(part);
  DeviceStats lse_acc_d(lse_acc), lse_part_d(lse_part);
  const int64_t starts[] = {0, 150, 300, 450};
  for (int s = 0; s < 3; ++s) {
    ForwardParams f = p.forward_params(part, lse_part, true);
    dp.point(p, f);
    const int64_t off = starts[s] * p.k.token_stride() * 2;
    f.k.data = static_cast<uint8_t*>(f.k.data) + off;
    f.v.data = static_cast<uint8_t*>(f.v.data) + off;
    f.seqlen_kv = starts[s + 1] - starts[s];
    f.mask.kv_pos0 = starts[s];
    f.o = part_d.ref;
    f.lse = lse_part_d.ref;
    forward_cuda(f, nullptr);
    MergeParams m;
    m.batch = p.B;
    m.heads = p.Hq;
    m.head_dim = p.D;
    m.seqlen = p.Sq;
    m.o_acc = acc_d.ref;
    m.lse_acc = lse_acc_d.ref;
    m.o_part = part_d.ref;
    m.lse_part = lse_part_d.ref;
    merge_partial_cuda(m, nullptr);
  }
  Tensor out(p.dtype, p.B, p.Sq, p.Hq, p.D);
  DeviceTensor out_d(out);
  out_d.buf->poison();
  ConvertParams cv;
  cv.dtype = p.dtype;
  cv.batch = p.B;
  cv.heads = p.Hq;
  cv.head_dim = p.D;
  cv.seqlen = p.Sq;
  cv.src = acc_d.ref;
  cv.dst = out_d.ref;
  convert_cuda(cv, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  Outputs got;
  got.o = out;
  got.o32 = acc;
  out_d.download(got.o);
  acc_d.download(got.o32);
  lse_acc_d.download(lse_acc);
  got.lse = lse_acc;
  got.lse32 = lse_acc;
  check_forward(p, want, got);
  long convert_bad = 0;
  for (int64_t i = 0; i < p.Sq; ++i)
    for (int32_t d = 0; d < p.D; ++d)
      convert_bad += got.o.get(0, i, 0, d) != bf16_to_float(float_to_bf16(float(got.o32.get(0, i, 0, d))));
  CHECK(convert_bad == 0);
}

TEST_CASE("gpu: deterministic backward is bitwise reproducible") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(23);
  for (int32_t D : {64, 128}) {
    Problem p = random_problem(rng, DType::bf16, D, 4, 10);
    p.Sq = p.Skv = 777;
    std::mt19937_64 data(rng());
    p.randomize(data);
    p.mask.causal = true;
    const Outputs want = run_cpu(p, true);
    const Outputs a = run_gpu(p, true, true, &want);
    const Outputs b = run_gpu(p, true, true, &want);
    CAPTURE(D);
    CHECK(a.dq.bytes == b.dq.bytes);
    CHECK(a.dk.bytes == b.dk.bytes);
    CHECK(a.dv.bytes == b.dv.bytes);
    check_backward(p, want, a);
  }
}

TEST_CASE("gpu: unsupported calls throw attncore::Error with a one-line reason") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(29);
  Problem p = random_problem(rng, DType::bf16, 64, 1, 50);
  DeviceProblem dp(p);
  Tensor o(p.dtype, p.B, p.Sq, p.Hq, p.D);
  Stats lse(p.B, p.Hq, p.Sq);
  DeviceTensor o_d(o);
  DeviceStats lse_d(lse);
  ForwardParams f = p.forward_params(o, lse, false);
  dp.point(p, f);
  f.o = o_d.ref;
  f.lse = lse_d.ref;
  f.head_dim = 72;
  CHECK_THROWS_AS(forward_cuda(f, nullptr), Error);
  f.head_dim = 64;
  f.dtype = DType::fp32;
  CHECK_THROWS_AS(forward_cuda(f, nullptr), Error);
  f.dtype = DType::bf16;
  f.q.token_stride += 1;
  CHECK_THROWS_AS(forward_cuda(f, nullptr), Error);
}

TEST_CASE("gpu: one-stage dK/dV pipeline (what an sm_80 gets), with segments and block lists") {
  REQUIRE(device_count() > 0);
  setenv("ATTNCORE_BWD_STAGES", "1", 1);
  std::mt19937_64 rng(31);
  for (int32_t D : {80, 128, 256}) {
    Problem p = random_problem(rng, DType::fp16, D, 2, 400);
    p.mask.causal = true;
    CAPTURE(D);
    check_all(p);
    p.blocks = block_list_from_mask(p.mask, p.Sq, p.Skv, 64, 64);
    check_all(p);
  }
  unsetenv("ATTNCORE_BWD_STAGES");
}
