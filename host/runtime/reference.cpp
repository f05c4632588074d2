#include "runtime/reference.h"

#include "common/errors.h"
#include "runtime/device.h"

#include <cmath>
#include <limits>

namespace attnhost {

namespace {
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

double dot(const double* a, const float* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

template <class F>
void for_each_in(const std::vector<attnhost_span>& spans, int64_t limit, F f) {
  for (const attnhost_span& s : spans) {
    if (s.step < 1 || s.begin < 0 || s.end > limit || s.multiplicity < 1)
      throw PluginError(ATTNHOST_ERR_INTERNAL, "plugin enumerated an invalid span [" + std::to_string(s.begin) + ", " +
                                                   std::to_string(s.end) + ") step " + std::to_string(s.step));
    for (int64_t i = s.begin; i < s.end; i += s.step) f(i, s.head, s.multiplicity);
  }
}
}  // namespace

Reference::Reference(const attnhost_problem& problem, const data::Params& data, Instance& enumerator)
    : problem_(problem), data_(data), enumerator_(enumerator), heads_q_(problem.heads_q),
      heads_kv_(problem.heads_kv), d_(problem.head_dim) {}

void Reference::load(uint32_t tensor, int64_t b, int32_t h, int64_t t, int32_t, double* out) const {
  const int32_t dtype = input_dtype(problem_, tensor);
  for (int32_t d = 0; d < d_; ++d) out[d] = generated_element(data_, tensor, dtype, b, t, h, d);
}

void Reference::fill_head_cache(int64_t b, int32_t kvh) {
  if (b == cache_b_ && kvh == cache_h_) return;
  const int64_t n = problem_.seqlen_kv;
  k_cache_.resize(static_cast<size_t>(n) * d_);
  v_cache_.resize(static_cast<size_t>(n) * d_);
  for (int64_t t = 0; t < n; ++t)
    for (int32_t d = 0; d < d_; ++d) {
      k_cache_[t * d_ + d] = static_cast<float>(generated_element(data_, data::kK, problem_.dtype, b, t, kvh, d));
      v_cache_[t * d_ + d] = static_cast<float>(generated_element(data_, data::kV, problem_.dtype, b, t, kvh, d));
    }
  cache_b_ = b;
  cache_h_ = kvh;
}

const std::vector<float>& Reference::keys(int64_t b, int32_t kvh) {
  fill_head_cache(b, kvh);
  return k_cache_;
}
const std::vector<float>& Reference::values(int64_t b, int32_t kvh) {
  fill_head_cache(b, kvh);
  return v_cache_;
}

RowReference Reference::row(int64_t b, int32_t h, int64_t q, bool with_dq) {
  const int32_t kvh = h / (heads_q_ / heads_kv_);
  std::vector<attnhost_span> spans = enumerator_.enumerate_keys(b, h, q);
  const std::vector<float>& K = keys(b, kvh);
  const std::vector<float>& V = values(b, kvh);
  std::vector<double> qv(d_), dov(d_);
  load_q(b, h, q, qv.data());

  // Pass 1: scores and their maximum; pass 2: LSE; pass 3: O (and dQ).
  std::vector<double> scores;
  std::vector<int64_t> index;
  std::vector<int32_t> mult;
  double max_s = kNegInf;
  for_each_in(spans, problem_.seqlen_kv, [&](int64_t k, int32_t, int32_t m) {
    double s = problem_.softmax_scale * dot(qv.data(), &K[k * d_], d_);
    scores.push_back(s);
    index.push_back(k);
    mult.push_back(m);
    max_s = std::max(max_s, s);
  });
  RowReference r;
  r.o.assign(d_, 0.0);
  r.dq.assign(with_dq ? d_ : 0, 0.0);
  if (scores.empty()) {
    r.lse = kNegInf;
    return r;
  }
  double sum = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    sum += mult[i] * std::exp(scores[i] - max_s);
    r.keys += mult[i];
  }
  r.lse = max_s + std::log(sum);
  for (size_t i = 0; i < scores.size(); ++i) {
    double p = mult[i] * std::exp(scores[i] - r.lse);
    const float* v = &V[index[i] * d_];
    for (int32_t d = 0; d < d_; ++d) r.o[d] += p * v[d];
  }
  if (!with_dq) return r;
  load_do(b, h, q, dov.data());
  for (int32_t d = 0; d < d_; ++d) r.delta += dov[d] * r.o[d];
  for (size_t i = 0; i < scores.size(); ++i) {
    double p = mult[i] * std::exp(scores[i] - r.lse);
    double dp = dot(dov.data(), &V[index[i] * d_], d_);
    double g = problem_.softmax_scale * p * (dp - r.delta);
    const float* k = &K[index[i] * d_];
    for (int32_t d = 0; d < d_; ++d) r.dq[d] += g * k[d];
  }
  return r;
}

ColumnReference Reference::column(int64_t b, int32_t kvh, int64_t k, const RowStatsFn& stats) {
  std::vector<attnhost_span> spans = enumerator_.enumerate_queries(b, kvh, k);
  ColumnReference c;
  c.dk.assign(d_, 0.0);
  c.dv.assign(d_, 0.0);
  const std::vector<float>& K = keys(b, kvh);
  const std::vector<float>& V = values(b, kvh);
  std::vector<float> kv(K.begin() + k * d_, K.begin() + (k + 1) * d_);
  std::vector<float> vv(V.begin() + k * d_, V.begin() + (k + 1) * d_);
  std::vector<double> qv(d_), dov(d_);
  for_each_in(spans, problem_.seqlen_q, [&](int64_t q, int32_t h, int32_t m) {
    if (h < 0 || h >= heads_q_ || h / (heads_q_ / heads_kv_) != kvh)
      throw PluginError(ATTNHOST_ERR_INTERNAL, "plugin enumerated query head " + std::to_string(h) +
                                                   " for key/value head " + std::to_string(kvh));
    auto [lse, delta] = stats(b, h, q);
    if (!std::isfinite(lse)) return;
    load_q(b, h, q, qv.data());
    load_do(b, h, q, dov.data());
    double s = problem_.softmax_scale * dot(qv.data(), kv.data(), d_);
    double p = m * std::exp(s - lse);
    double dp = dot(dov.data(), vv.data(), d_);
    double g = problem_.softmax_scale * p * (dp - delta);
    for (int32_t d = 0; d < d_; ++d) {
      c.dv[d] += p * dov[d];
      c.dk[d] += g * qv[d];
    }
  });
  return c;
}

}  // namespace attnhost
