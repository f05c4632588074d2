// Test helpers shared by the CPU and GPU tests of attncore: host tensors in a dtype with random
// values, a whole attention problem, and a naive float64 attention written from the definitions
// in attention.h (pair by pair, no tiles, no online softmax) to check everything else against.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "attncore/attention.h"
#include "attncore/block_list.h"
#include "attncore/cpu.h"
#include "attncore/numeric.h"

namespace coretest {

using namespace attncore;

// [B, S, H, D] in `dtype`, with `pad` spare elements after each token's heads so that strides are
// not the packed ones.
struct Tensor {
  DType dtype = DType::fp32;
  int64_t B = 0, S = 0, H = 0, D = 0, pad = 0;
  std::vector<uint8_t> bytes;
  // FP8: what an element stands for per unit; set() stores v / descale, get() gives it back.
  double descale = 1;

  Tensor() = default;
  Tensor(DType t, int64_t b, int64_t s, int64_t h, int64_t d, int64_t pad_ = 0)
      : dtype(t), B(b), S(s), H(h), D(d), pad(pad_), bytes(size_t(b * s * (h * d + pad_)) * dtype_bytes(t)) {}

  int64_t token_stride() const { return H * D + pad; }
  int64_t index(int64_t b, int64_t i, int64_t h, int64_t d) const {
    return b * S * token_stride() + i * token_stride() + h * D + d;
  }
  TensorRef ref() {
    return TensorRef{bytes.data(), S * token_stride(), token_stride(), D};
  }
  double get(int64_t b, int64_t i, int64_t h, int64_t d) const {
    const int64_t e = index(b, i, h, d);
    switch (dtype) {
    case DType::bf16: { uint16_t x; std::memcpy(&x, &bytes[size_t(e) * 2], 2); return bf16_to_float(x); }
    case DType::fp16: { uint16_t x; std::memcpy(&x, &bytes[size_t(e) * 2], 2); return fp16_to_float(x); }
    case DType::fp32: { float x; std::memcpy(&x, &bytes[size_t(e) * 4], 4); return x; }
    case DType::fp8_e4m3: case DType::fp8_e5m2:
      return fp8_to_float(bytes[size_t(e)], dtype == DType::fp8_e4m3) * descale;
    default: { double x; std::memcpy(&x, &bytes[size_t(e) * 8], 8); return x; }
    }
  }
  void set(int64_t b, int64_t i, int64_t h, int64_t d, double v) {
    const int64_t e = index(b, i, h, d);
    switch (dtype) {
    case DType::bf16: { uint16_t x = float_to_bf16(float(v)); std::memcpy(&bytes[size_t(e) * 2], &x, 2); break; }
    case DType::fp16: { uint16_t x = float_to_fp16(float(v)); std::memcpy(&bytes[size_t(e) * 2], &x, 2); break; }
    case DType::fp32: { float x = float(v); std::memcpy(&bytes[size_t(e) * 4], &x, 4); break; }
    case DType::fp8_e4m3: case DType::fp8_e5m2: bytes[size_t(e)] = nearest_fp8(v / descale); break;
    default: std::memcpy(&bytes[size_t(e) * 8], &v, 8);
    }
  }
  // The FP8 code nearest v (saturating; of equally near ones the lowest code, so +0 before -0; 0
  // for a v that is not finite), by a search of the finite codes in order of value: the core only
  // reads FP8. (A scan of all 256 codes an element took the host 15 s for 8192 rows of Q, K, V, dO.)
  uint8_t nearest_fp8(double v) const {
    if (!std::isfinite(v)) return 0;
    const std::vector<std::pair<double, int>>& codes = fp8_codes_by_value(dtype == DType::fp8_e4m3);
    const auto above = std::lower_bound(codes.begin(), codes.end(), v,
                                        [](const std::pair<double, int>& c, double x) { return c.first < x; });
    const auto distance = [v](const std::pair<double, int>& c) { return std::abs(c.first - v); };
    double nearest = std::numeric_limits<double>::infinity();
    if (above != codes.end()) nearest = distance(*above);
    if (above != codes.begin()) nearest = std::min(nearest, distance(*(above - 1)));
    int best = 256;
    for (auto c = above; c != codes.end() && distance(*c) == nearest; ++c) best = std::min(best, c->second);
    for (auto c = above; c != codes.begin() && distance(*(c - 1)) == nearest; --c) best = std::min(best, (c - 1)->second);
    return uint8_t(best);
  }
  static const std::vector<std::pair<double, int>>& fp8_codes_by_value(bool e4m3) {
    static const auto make = [](bool e4) {
      std::vector<std::pair<double, int>> codes;
      for (int c = 0; c < 256; ++c)
        if (const double x = fp8_to_float(uint8_t(c), e4); std::isfinite(x)) codes.emplace_back(x, c);
      std::sort(codes.begin(), codes.end());
      return codes;
    };
    static const std::vector<std::pair<double, int>> e4m3_codes = make(true), e5m2_codes = make(false);
    return e4m3 ? e4m3_codes : e5m2_codes;
  }
  void fill_normal(std::mt19937_64& rng, double stddev) {
    std::normal_distribution<double> n(0.0, stddev);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < S; ++i)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < D; ++d) set(b, i, h, d, n(rng));
  }
  void fill(double v) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < S; ++i)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < D; ++d) set(b, i, h, d, v);
  }
};

// [B, H, S] fp32 row statistics.
struct Stats {
  int64_t B = 0, H = 0, S = 0;
  std::vector<float> v;
  Stats() = default;
  Stats(int64_t b, int64_t h, int64_t s, float init = 0.f) : B(b), H(h), S(s), v(size_t(b * h * s), init) {}
  RowStatsRef ref() { return RowStatsRef{v.data(), H * S, S}; }
  float& at(int64_t b, int64_t h, int64_t i) { return v[size_t((b * H + h) * S + i)]; }
  float at(int64_t b, int64_t h, int64_t i) const { return v[size_t((b * H + h) * S + i)]; }
};

struct Problem {
  DType dtype = DType::bf16;
  DType dtype_do = DType::invalid;  // dO's, where not dtype (e5m2 beside e4m3: the hybrid recipe)
  int32_t B = 1, Hq = 1, Hkv = 1, D = 64;
  int64_t Sq = 0, Skv = 0;
  float scale = 0.f; // 0: 1/sqrt(D)
  Mask mask;
  std::vector<Segment> segments;
  std::optional<BlockListData> blocks;
  Tensor q, k, v, d_o;

  BlockList block_view; // what params point at; refreshed by params()

  double softmax_scale() const { return scale != 0.f ? scale : 1.0 / std::sqrt(double(D)); }

  // Parameters for a call on host memory (the GPU tests swap the pointers for device copies).
  ForwardParams forward_params(Tensor& o, Stats& lse, bool o_fp32) {
    ForwardParams f;
    f.dtype = dtype;
    f.batch = B;
    f.heads_q = Hq;
    f.heads_kv = Hkv;
    f.head_dim = D;
    f.seqlen_q = Sq;
    f.seqlen_kv = Skv;
    f.softmax_scale = scale;
    f.q = q.ref();
    f.k = k.ref();
    f.v = v.ref();
    f.descale_q = float(q.descale);
    f.descale_k = float(k.descale);
    f.descale_v = float(v.descale);
    f.o = o.ref();
    f.o_fp32 = o_fp32;
    f.lse = lse.ref();
    f.mask = mask;
    f.segments = segments.empty() ? nullptr : segments.data();
    f.num_segments = int32_t(segments.size());
    if (blocks) block_view = blocks->view();
    f.blocks = blocks ? &block_view : nullptr;
    return f;
  }
  DeltaParams delta_params(TensorRef o, bool o_fp32, TensorRef d_o_ref, RowStatsRef delta) const {
    DeltaParams g;
    g.dtype = d_o.dtype;
    g.batch = B;
    g.heads = Hq;
    g.head_dim = D;
    g.seqlen = Sq;
    g.o = o;
    g.o_fp32 = o_fp32;
    g.d_o = d_o_ref;
    g.descale_do = float(d_o.descale);
    g.delta = delta;
    return g;
  }
  BackwardParams backward_params(Stats& lse, Stats& delta, Tensor& dq, Tensor& dk, Tensor& dv) {
    BackwardParams g;
    g.dtype = dtype;
    g.batch = B;
    g.heads_q = Hq;
    g.heads_kv = Hkv;
    g.head_dim = D;
    g.seqlen_q = Sq;
    g.seqlen_kv = Skv;
    g.softmax_scale = scale;
    g.q = q.ref();
    g.k = k.ref();
    g.v = v.ref();
    g.d_o = d_o.ref();
    if (d_o.dtype != dtype) g.dtype_do = d_o.dtype;
    g.descale_q = float(q.descale);
    g.descale_k = float(k.descale);
    g.descale_v = float(v.descale);
    g.descale_do = float(d_o.descale);
    g.lse = lse.ref();
    g.delta = delta.ref();
    g.dq = dq.ref();
    g.dk = dk.ref();
    g.dv = dv.ref();
    g.mask = mask;
    g.segments = segments.empty() ? nullptr : segments.data();
    g.num_segments = int32_t(segments.size());
    if (blocks) block_view = blocks->view();
    g.blocks = blocks ? &block_view : nullptr;
    return g;
  }

  // FP8: Q's, K's, V's and dO's descales (values of a few units stored around 64 by default: the
  // descale matters).
  std::array<double, 4> fp8_descales{1.0 / 64, 1.0 / 64, 1.0 / 64, 1.0 / 64};
  void randomize(std::mt19937_64& rng, int64_t pad = 0, double stddev = 1.0) {
    q = Tensor(dtype, B, Sq, Hq, D, pad);
    k = Tensor(dtype, B, Skv, Hkv, D, pad);
    v = Tensor(dtype, B, Skv, Hkv, D, pad);
    d_o = Tensor(dtype_do == DType::invalid ? dtype : dtype_do, B, Sq, Hq, D, pad);
    Tensor* const tensors[4] = {&q, &k, &v, &d_o};
    for (int t = 0; t < 4; ++t)
      if (is_fp8(tensors[t]->dtype)) tensors[t]->descale = fp8_descales[size_t(t)];
    q.fill_normal(rng, stddev);
    k.fill_normal(rng, stddev);
    v.fill_normal(rng, 1.0);
    d_o.fill_normal(rng, 1.0);
  }

  // Row i of the call: its segment (or -1 when segments are given and none holds it).
  int segment_of(int64_t i) const {
    for (size_t s = 0; s < segments.size(); ++s)
      if (i >= segments[s].q_begin && i < segments[s].q_end) return int(s);
    return -1;
  }
  bool row_covered(int64_t i) const { return segments.empty() || segment_of(i) >= 0; }

  // Whether query head h, row i sees key j: the definitions of attention.h, pair by pair.
  bool sees(int32_t h, int64_t i, int64_t j) const {
    const auto mask_ok = [&](int64_t qp, int64_t kp) {
      return (!mask.causal || kp <= qp) && (mask.window_left < 0 || kp >= qp - mask.window_left) &&
             (mask.window_right < 0 || kp <= qp + mask.window_right);
    };
    if (!segments.empty()) {
      const int s = segment_of(i);
      if (s < 0) return false;
      const Segment& g = segments[size_t(s)];
      if (j < g.kv_begin || j >= g.kv_end) return false;
      return mask_ok(g.q_pos0 + (i - g.q_begin), g.kv_pos0 + (j - g.kv_begin));
    }
    if (blocks) {
      const BlockListData& bl = *blocks;
      const int64_t row = int64_t(bl.heads == 1 ? 0 : h) * bl.num_q_blocks + i / bl.block_q;
      for (int32_t e = bl.row_ptr[size_t(row)]; e < bl.row_ptr[size_t(row) + 1]; ++e)
        if (bl.kv_block[size_t(e)] == j / bl.block_kv)
          return !bl.masked[size_t(e)] || mask_ok(mask.q_pos0 + i, mask.kv_pos0 + j);
      return false;
    }
    return mask_ok(mask.q_pos0 + i, mask.kv_pos0 + j);
  }
};

// Naive float64 attention: outputs [B, Sq, Hq, D], lse [B, Hq, Sq], gradients like their inputs.
struct Naive {
  std::vector<double> o, lse, dq, dk, dv, delta;
  const Problem* p = nullptr;
  double O(int64_t b, int64_t i, int64_t h, int64_t d) const { return o[size_t(((b * p->Sq + i) * p->Hq + h) * p->D + d)]; }
  double L(int64_t b, int64_t h, int64_t i) const { return lse[size_t((b * p->Hq + h) * p->Sq + i)]; }
  double Dl(int64_t b, int64_t h, int64_t i) const { return delta[size_t((b * p->Hq + h) * p->Sq + i)]; }
  double dQ(int64_t b, int64_t i, int64_t h, int64_t d) const { return dq[size_t(((b * p->Sq + i) * p->Hq + h) * p->D + d)]; }
  double dK(int64_t b, int64_t j, int64_t h, int64_t d) const { return dk[size_t(((b * p->Skv + j) * p->Hkv + h) * p->D + d)]; }
  double dV(int64_t b, int64_t j, int64_t h, int64_t d) const { return dv[size_t(((b * p->Skv + j) * p->Hkv + h) * p->D + d)]; }
};

inline Naive naive_attention(const Problem& p, bool grads) {
  Naive n;
  n.p = &p;
  const int64_t D = p.D, group = p.Hq / p.Hkv;
  n.o.assign(size_t(p.B * p.Sq * p.Hq * D), 0.0);
  n.lse.assign(size_t(p.B * p.Hq * p.Sq), -std::numeric_limits<double>::infinity());
  n.delta.assign(size_t(p.B * p.Hq * p.Sq), 0.0);
  if (grads) {
    n.dq.assign(n.o.size(), 0.0);
    n.dk.assign(size_t(p.B * p.Skv * p.Hkv * D), 0.0);
    n.dv.assign(n.dk.size(), 0.0);
  }
  const double scale = p.softmax_scale();
  std::vector<double> s(size_t(p.Skv)), dpv(size_t(p.Skv));
  for (int64_t b = 0; b < p.B; ++b)
    for (int32_t h = 0; h < p.Hq; ++h) {
      const int32_t hk = int32_t(h / group);
      for (int64_t i = 0; i < p.Sq; ++i) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < p.Skv; ++j) {
          if (!p.sees(h, i, j)) { s[size_t(j)] = -std::numeric_limits<double>::infinity(); continue; }
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += p.q.get(b, i, h, d) * p.k.get(b, j, hk, d);
          s[size_t(j)] = scale * dot;
          mx = std::max(mx, s[size_t(j)]);
        }
        if (mx == -std::numeric_limits<double>::infinity()) continue; // no key: O = 0, LSE = -inf
        double sum = 0;
        for (int64_t j = 0; j < p.Skv; ++j) sum += std::exp(s[size_t(j)] - mx);
        const double lse = mx + std::log(sum);
        n.lse[size_t((b * p.Hq + h) * p.Sq + i)] = lse;
        for (int64_t j = 0; j < p.Skv; ++j) {
          const double pj = std::exp(s[size_t(j)] - lse);
          if (pj == 0) continue;
          for (int64_t d = 0; d < D; ++d) n.o[size_t(((b * p.Sq + i) * p.Hq + h) * D + d)] += pj * p.v.get(b, j, hk, d);
        }
        if (!grads) continue;
        // dP_j = dO.v_j, delta = sum_j P_j dP_j, dS_j = P_j (dP_j - delta).
        double delta = 0;
        for (int64_t j = 0; j < p.Skv; ++j) {
          const double pj = std::exp(s[size_t(j)] - lse);
          double dp = 0;
          if (pj != 0)
            for (int64_t d = 0; d < D; ++d) dp += p.d_o.get(b, i, h, d) * p.v.get(b, j, hk, d);
          dpv[size_t(j)] = dp;
          delta += pj * dp;
        }
        n.delta[size_t((b * p.Hq + h) * p.Sq + i)] = delta;
        for (int64_t j = 0; j < p.Skv; ++j) {
          const double pj = std::exp(s[size_t(j)] - lse);
          if (pj == 0) continue;
          const double ds = pj * (dpv[size_t(j)] - delta);
          for (int64_t d = 0; d < D; ++d) {
            n.dq[size_t(((b * p.Sq + i) * p.Hq + h) * D + d)] += scale * ds * p.k.get(b, j, hk, d);
            n.dk[size_t(((b * p.Skv + j) * p.Hkv + hk) * D + d)] += scale * ds * p.q.get(b, i, h, d);
            n.dv[size_t(((b * p.Skv + j) * p.Hkv + hk) * D + d)] += pj * p.d_o.get(b, i, h, d);
          }
        }
      }
    }
  return n;
}

// Max |a - b| over max(|b|, floor): an error relative to the size of the reference.
struct ErrorStat {
  double max_abs = 0, ref_max = 0;
  bool finite = true;
  void add(double got, double want) {
    if (!std::isfinite(got)) finite = false;
    max_abs = std::max(max_abs, std::abs(got - want));
    ref_max = std::max(ref_max, std::abs(want));
  }
  // `floor` keeps a reference that is zero in theory (self-only attention has dS = 0) from turning
  // rounding noise into a large relative error.
  double rel(double floor = 1e-6) const { return max_abs / std::max(ref_max, floor); }
};

// Random fp32 values of spread `sigma` in every element of `t`: another call's share of a gradient.
inline void fill_normal(Tensor& t, std::mt19937_64& rng, float sigma) {
  std::normal_distribution<float> normal(0.f, sigma);
  for (int64_t b = 0; b < t.B; ++b)
    for (int64_t i = 0; i < t.S; ++i)
      for (int64_t h = 0; h < t.H; ++h)
        for (int64_t d = 0; d < t.D; ++d) t.set(b, i, h, d, normal(rng));
}

// Elements where `out` (a dtype) differs from the fp32 tensor `acc` rounded into it (NaN differs):
// dq_out against the accumulator after the call (BackwardParams::dq_out).
inline int64_t differ_from_rounded(const Tensor& out, const Tensor& acc) {
  Tensor one(out.dtype, 1, 1, 1, 1);
  int64_t differ = 0;
  for (int64_t b = 0; b < out.B; ++b)
    for (int64_t i = 0; i < out.S; ++i)
      for (int64_t h = 0; h < out.H; ++h)
        for (int64_t d = 0; d < out.D; ++d) {
          one.set(0, 0, 0, 0, acc.get(b, i, h, d));
          differ += !(out.get(b, i, h, d) == one.get(0, 0, 0, 0));
        }
  return differ;
}

// Elements where dK or dV, written in their dtype by a call given other calls' shares of keys
// [begin, end) (BackwardParams::dk_add), differ from the call's own fp32 gradients `grad_k`,
// `grad_v` plus those shares, rounded once (NaN differs).
inline int64_t differ_from_shared(const Tensor& dk, const Tensor& dv, const Tensor& grad_k, const Tensor& grad_v,
                                  const Tensor& share_k, const Tensor& share_v, int64_t begin, int64_t end) {
  Tensor one(dk.dtype, 1, 1, 1, 2);
  int64_t differ = 0;
  for (int64_t b = 0; b < dk.B; ++b)
    for (int64_t j = 0; j < dk.S; ++j)
      for (int64_t h = 0; h < dk.H; ++h)
        for (int64_t d = 0; d < dk.D; ++d) {
          const bool added = j >= begin && j < end;
          one.set(0, 0, 0, 0, float(grad_k.get(b, j, h, d)) + (added ? float(share_k.get(b, j, h, d)) : 0.f));
          one.set(0, 0, 0, 1, float(grad_v.get(b, j, h, d)) + (added ? float(share_v.get(b, j, h, d)) : 0.f));
          differ += !(dk.get(b, j, h, d) == one.get(0, 0, 0, 0)) || !(dv.get(b, j, h, d) == one.get(0, 0, 0, 1));
        }
  return differ;
}

// What a whole problem's run gives: O in dtype and in fp32 (partial mode) with their LSE, delta, and
// the gradients (fp32 accumulators started at zero).
struct Outputs {
  Tensor o, o32;
  Stats lse, lse32, delta;
  Tensor dq, dk, dv;
};

// Which O the reference's delta (rowsum dO * O) comes from: the fp32 partial (the CPU tests: no
// rounding in the way), or the dtype O, as a training step computes it (the GPU tests' reference).
enum class DeltaFrom { o_fp32, o_dtype };

// The CPU reference run of a problem with Acc accumulation: both forwards over `poison` (what a row
// the call must not touch keeps), then delta and the backward.
template <class Acc> Outputs cpu_outputs(Problem& p, bool grads, DeltaFrom from, float poison) {
  Outputs r;
  r.o = Tensor(output_dtype(p.dtype), p.B, p.Sq, p.Hq, p.D);
  r.o32 = Tensor(DType::fp32, p.B, p.Sq, p.Hq, p.D);
  r.o.fill(poison);
  r.o32.fill(poison);
  r.lse = Stats(p.B, p.Hq, p.Sq, poison);
  r.lse32 = Stats(p.B, p.Hq, p.Sq, poison);
  cpu::forward<Acc>(p.forward_params(r.o, r.lse, false));
  cpu::forward<Acc>(p.forward_params(r.o32, r.lse32, true));
  if (!grads) return r;
  const bool fp32 = from == DeltaFrom::o_fp32;
  r.delta = Stats(p.B, p.Hq, p.Sq, 0.f);
  cpu::compute_delta<Acc>(p.delta_params(fp32 ? r.o32.ref() : r.o.ref(), fp32, p.d_o.ref(), r.delta.ref()));
  r.dq = Tensor(DType::fp32, p.B, p.Sq, p.Hq, p.D);
  r.dk = Tensor(DType::fp32, p.B, p.Skv, p.Hkv, p.D);
  r.dv = Tensor(DType::fp32, p.B, p.Skv, p.Hkv, p.D);
  cpu::backward<Acc>(p.backward_params(fp32 ? r.lse32 : r.lse, r.delta, r.dq, r.dk, r.dv));
  return r;
}

} // namespace coretest
