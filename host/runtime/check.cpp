#include "runtime/check.h"

#include "common/errors.h"
#include "runtime/device.h"
#include "runtime/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <sstream>

namespace attnhost {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
// Above this many multiply-adds the reference samples instead of recomputing everything
// (about a second of one core).
constexpr double kCompleteCheckBudget = 4e8;

// ---- a tiny binary stream for the gather ------------------------------------------------------
class Writer {
 public:
  template <class T> void put(T v) { buf_.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void put_values(const std::vector<char>& t, int32_t dtype, size_t first, size_t n) {
    for (size_t i = 0; i < n; ++i) put(load_element(t.data(), dtype, first + i));
  }
  std::string take() { return std::move(buf_); }

 private:
  std::string buf_;
};

class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  bool done() const { return pos_ >= s_.size(); }
  template <class T> T get() {
    if (pos_ + sizeof(T) > s_.size()) throw std::runtime_error("truncated check data");
    T v;
    std::memcpy(&v, s_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }

 private:
  const std::string& s_;
  size_t pos_ = 0;
};

enum Record : uint8_t { kRow = 1, kColumn = 2, kStats = 3 };

// Local slot of a global token, or -1.
int64_t local_slot(const Instance::Layout& layout, int64_t global) {
  for (const attnhost_token_range& r : layout.ranges)
    if (global >= r.global_begin && global < r.global_begin + r.length) return r.local_begin + (global - r.global_begin);
  return -1;
}

// Error accumulator of one tensor.
struct ErrorSum {
  int64_t n = 0;
  double sq_err = 0, sq_ref = 0, max_err = 0, max_ref = 0;
  std::string worst;
  void add(double x, double ref, const std::string& where) {
    ++n;
    double e;
    if (std::isinf(ref) && std::isinf(x) && (ref < 0) == (x < 0)) e = 0;  // both -inf: an empty row
    else if (std::isnan(x) || std::isinf(x) || std::isinf(ref)) e = std::numeric_limits<double>::infinity();
    else e = std::fabs(x - ref);
    if (std::isfinite(ref)) {
      sq_ref += ref * ref;
      max_ref = std::max(max_ref, std::fabs(ref));
    }
    sq_err += std::isfinite(e) ? e * e : std::numeric_limits<double>::infinity();
    if (e > max_err || (n == 1 && e == 0)) {
      if (e > max_err) worst = where;
      max_err = std::max(max_err, e);
    }
  }
};

std::string where(int64_t b, int32_t h, int64_t t, int32_t d = -1) {
  std::ostringstream s;
  s << "b=" << b << " h=" << h << " t=" << t;
  if (d >= 0) s << " d=" << d;
  return s.str();
}

// Positions at the chunk boundaries of contiguous and zigzag shardings for P = 1..16.
std::vector<int64_t> boundary_positions(int64_t n) {
  std::set<int64_t> out;
  for (int64_t chunks : {2, 4, 6, 8, 16, 32})
    for (int64_t i = 0; i <= chunks; ++i) {
      int64_t p = n * i / chunks;
      if (p < n) out.insert(p);
      if (p > 0) out.insert(p - 1);
    }
  return {out.begin(), out.end()};
}

}  // namespace

namespace {

Tolerance fp8_tolerance(double u, bool grad) {
  const double rounded_products = grad ? 2 : 1;
  return {rounded_products * 2 * u / std::sqrt(3.0), rounded_products * u};
}

}  // namespace

Tolerance tolerance(const std::string& tensor, int32_t dtype) {
  const bool grad = tensor[0] == 'd';
  if (tensor == "LSE") {  // fp32 statistics of rounded inputs: an absolute bound
    return dtype == ATTNHOST_DTYPE_FP32 ? Tolerance{1e-6, 1e-4} : Tolerance{1e-4, 2e-3};
  }
  switch (dtype) {
    // FP8 inputs are exact in the reference (it reads them dequantized); what a plugin may round is
    // P and dS to the format for their products (docs/SUITES.md, "FP8 tolerances"): a relative
    // error of at most u = 2^-(mantissa bits + 1) per term, whose RMS over many terms is u / sqrt(3)
    // of the result's. The rel L2 bound is twice that, the largest error's u of the largest
    // reference value; gradients twice again (dS rounded, and made from a delta whose O was).
    case ATTNHOST_DTYPE_FP8_E4M3: return fp8_tolerance(1.0 / 16, grad);
    case ATTNHOST_DTYPE_FP8_E5M2: return fp8_tolerance(1.0 / 8, grad);
    case ATTNHOST_DTYPE_BF16: return grad ? Tolerance{3e-2, 1e-1} : Tolerance{1.5e-2, 5e-2};
    case ATTNHOST_DTYPE_FP16: return grad ? Tolerance{8e-3, 3e-2} : Tolerance{4e-3, 1.5e-2};
    default: return grad ? Tolerance{2e-4, 2e-3} : Tolerance{5e-5, 5e-4};
  }
}

CheckPlan plan_check(const attnhost_problem& p, const suite::Check& settings, uint64_t seed, int64_t total_pairs,
                     bool gradients) {
  CheckPlan plan;
  plan.gradients = gradients;
  const double cost = static_cast<double>(total_pairs) * p.head_dim * (gradients ? 6.0 : 2.0);
  plan.complete = cost <= kCompleteCheckBudget;
  if (plan.complete) {
    for (int64_t b = 0; b < p.batch; ++b)
      for (int32_t h = 0; h < p.heads_q; ++h)
        for (int64_t t = 0; t < p.seqlen_q; ++t) plan.rows.push_back({b, h, t});
    if (gradients)
      for (int64_t b = 0; b < p.batch; ++b)
        for (int32_t h = 0; h < p.heads_kv; ++h)
          for (int64_t t = 0; t < p.seqlen_kv; ++t) plan.cols.push_back({b, h, t});
    return plan;
  }
  // Sampled: the same on every rank, from the seed alone.
  uint64_t state = data::mix(seed ^ 0x636865636bULL);
  auto next = [&](int64_t n) { state = data::mix(state + 0x9e3779b97f4a7c15ULL); return static_cast<int64_t>(state % n); };
  std::set<std::tuple<int64_t, int32_t, int64_t>> rows, cols;
  // Boundary rows share two (batch, head) pairs: the reference generates K and V once per
  // (batch, kv head), which is what a sampled check spends its time on.
  const std::pair<int64_t, int32_t> heads[2] = {{next(p.batch), static_cast<int32_t>(next(p.heads_q))},
                                                {next(p.batch), static_cast<int32_t>(next(p.heads_q))}};
  int k = 0;
  for (int64_t t : boundary_positions(p.seqlen_q)) {
    auto [b, h] = heads[k++ % 2];
    rows.insert({b, h, t});
  }
  for (int i = 0; i < settings.query_rows; ++i)
    rows.insert({next(p.batch), static_cast<int32_t>(next(p.heads_q)), next(p.seqlen_q)});
  for (auto [b, h, t] : rows) plan.rows.push_back({b, h, t});
  if (gradients) {
    std::vector<int64_t> edges = boundary_positions(p.seqlen_kv);
    for (int i = 0; i < settings.key_columns; ++i) {
      int64_t t = i % 2 == 0 && !edges.empty() ? edges[next(static_cast<int64_t>(edges.size()))] : next(p.seqlen_kv);
      cols.insert({next(p.batch), static_cast<int32_t>(next(p.heads_kv)), t});
    }
    for (auto [b, h, t] : cols) plan.cols.push_back({b, h, t});
  }
  return plan;
}

std::string pack_samples(const CheckPlan& plan, const RankOutputs& out) {
  Writer w;
  const int64_t D = out.head_dim;
  const int64_t sq = out.q_layout.local_tokens, skv = out.kv_layout.local_tokens;
  auto q_offset = [&](int64_t b, int64_t slot, int32_t h) {
    return static_cast<size_t>(((b * sq + slot) * out.heads_q + h) * D);
  };
  for (const RowId& r : plan.rows) {
    int64_t slot = local_slot(out.q_layout, r.t);
    if (slot < 0) continue;
    w.put(kRow); w.put(r.b); w.put(r.h); w.put(r.t);
    w.put(load_element(out.lse.data(), ATTNHOST_DTYPE_FP32, (r.b * out.heads_q + r.h) * sq + slot));
    w.put_values(out.o, out.dtype, q_offset(r.b, slot, r.h), D);
    if (plan.gradients) w.put_values(out.dq, out.dtype, q_offset(r.b, slot, r.h), D);
  }
  for (const RowId& c : plan.cols) {
    int64_t slot = local_slot(out.kv_layout, c.t);
    if (slot < 0) continue;
    w.put(kColumn); w.put(c.b); w.put(c.h); w.put(c.t);
    w.put_values(out.dk, out.dtype, (static_cast<size_t>(c.b * skv + slot) * out.heads_kv + c.h) * D, D);
    w.put_values(out.dv, out.dtype, (static_cast<size_t>(c.b * skv + slot) * out.heads_kv + c.h) * D, D);
  }
  // Sampled columns need every attending row's LSE and dO.O: send this rank's.
  if (plan.gradients && !plan.complete && !plan.cols.empty()) {
    for (int64_t b = 0; b < out.batch; ++b)
      for (int32_t h = 0; h < out.heads_q; ++h)
        for (const attnhost_token_range& range : out.q_layout.ranges)
          for (int64_t i = 0; i < range.length; ++i) {
            int64_t slot = range.local_begin + i;
            size_t off = q_offset(b, slot, h);
            double delta = 0;
            for (int64_t d = 0; d < D; ++d)
              delta += load_element(out.d_o.data(), out.input_dtype, off + d) * out.descale_do *
                       load_element(out.o.data(), out.dtype, off + d);
            w.put(kStats); w.put(b); w.put(h); w.put(range.global_begin + i);
            w.put(load_element(out.lse.data(), ATTNHOST_DTYPE_FP32, (b * out.heads_q + h) * sq + slot));
            w.put(delta);
          }
  }
  return w.take();
}

CheckResult evaluate_check(const CheckPlan& plan, const std::vector<std::string>& packed,
                           const attnhost_problem& p, const data::Params& data, Instance& enumerator,
                           const suite::Check& settings, const std::vector<std::pair<std::string, int64_t>>& nonfinite) {
  const int32_t D = p.head_dim;
  struct RowOut { double lse; std::vector<double> o, dq; };
  struct ColOut { std::vector<double> dk, dv; };
  std::map<std::tuple<int64_t, int32_t, int64_t>, RowOut> rows;
  std::map<std::tuple<int64_t, int32_t, int64_t>, ColOut> cols;
  const size_t stats_size = static_cast<size_t>(p.batch) * p.heads_q * p.seqlen_q;
  std::vector<float> plugin_lse, plugin_delta;
  for (const std::string& rank_data : packed) {
    Reader r(rank_data);
    while (!r.done()) {
      auto kind = r.get<uint8_t>();
      auto b = r.get<int64_t>();
      auto h = r.get<int32_t>();
      auto t = r.get<int64_t>();
      if (kind == kRow) {
        RowOut row;
        row.lse = r.get<double>();
        for (int d = 0; d < D; ++d) row.o.push_back(r.get<double>());
        if (plan.gradients) for (int d = 0; d < D; ++d) row.dq.push_back(r.get<double>());
        rows.emplace(std::make_tuple(b, h, t), std::move(row));
      } else if (kind == kColumn) {
        ColOut col;
        for (int d = 0; d < D; ++d) col.dk.push_back(r.get<double>());
        for (int d = 0; d < D; ++d) col.dv.push_back(r.get<double>());
        cols.emplace(std::make_tuple(b, h, t), std::move(col));
      } else if (kind == kStats) {
        if (plugin_lse.empty()) {
          plugin_lse.assign(stats_size, std::numeric_limits<float>::quiet_NaN());
          plugin_delta.assign(stats_size, 0.f);
        }
        size_t i = (static_cast<size_t>(b) * p.heads_q + h) * p.seqlen_q + t;
        plugin_lse[i] = static_cast<float>(r.get<double>());
        plugin_delta[i] = static_cast<float>(r.get<double>());
      } else {
        throw std::runtime_error("corrupt check data");
      }
    }
  }

  CheckResult result;
  result.ran = true;
  result.rows = static_cast<int64_t>(plan.rows.size());
  result.columns = static_cast<int64_t>(plan.cols.size());
  Reference ref(p, data, enumerator);
  ErrorSum e_o, e_lse, e_dq, e_dk, e_dv;
  std::vector<std::string> missing;

  // Reference rows, kept for the columns when the check is complete.
  // In double: a gradient that is exactly zero (one token attending only itself) must come out
  // exactly zero from the reference too, not as fp32 rounding noise.
  std::vector<double> ref_lse, ref_delta;
  if (plan.complete && plan.gradients) {
    ref_lse.assign(stats_size, kNegInf);
    ref_delta.assign(stats_size, 0.0);
  }
  std::vector<RowId> ordered = plan.rows;  // by (b, kv head) so the reference reuses its K/V cache
  std::stable_sort(ordered.begin(), ordered.end(), [&](const RowId& a, const RowId& b) {
    int32_t ga = a.h / (p.heads_q / p.heads_kv), gb = b.h / (p.heads_q / p.heads_kv);
    return std::tie(a.b, ga) < std::tie(b.b, gb);
  });
  for (const RowId& id : ordered) {
    RowReference want = ref.row(id.b, id.h, id.t, plan.gradients);
    if (!ref_lse.empty()) {
      size_t i = (static_cast<size_t>(id.b) * p.heads_q + id.h) * p.seqlen_q + id.t;
      ref_lse[i] = want.lse;
      ref_delta[i] = want.delta;
    }
    auto it = rows.find({id.b, id.h, id.t});
    if (it == rows.end()) {
      if (missing.size() < 3) missing.push_back("row " + where(id.b, id.h, id.t));
      continue;
    }
    const RowOut& got = it->second;
    e_lse.add(got.lse, want.lse, where(id.b, id.h, id.t));
    for (int d = 0; d < D; ++d) e_o.add(got.o[d], want.o[d], where(id.b, id.h, id.t, d));
    if (plan.gradients)
      for (int d = 0; d < D; ++d) e_dq.add(got.dq[d], want.dq[d], where(id.b, id.h, id.t, d));
  }

  if (plan.gradients && !plan.cols.empty()) {
    const bool have_stats = !ref_lse.empty() || !plugin_lse.empty();
    RowStatsFn stats = [&](int64_t b, int32_t h, int64_t q) {
      size_t i = (static_cast<size_t>(b) * p.heads_q + h) * p.seqlen_q + q;
      if (!ref_lse.empty()) return std::make_pair(ref_lse[i], ref_delta[i]);
      return std::make_pair(static_cast<double>(plugin_lse[i]), static_cast<double>(plugin_delta[i]));
    };
    if (!plan.complete) result.note = "dK/dV columns use the plugin's LSE and dO.O of the rows that attend them";
    for (const RowId& id : plan.cols) {
      auto it = cols.find({id.b, id.h, id.t});
      if (it == cols.end() || !have_stats) {
        if (missing.size() < 3) missing.push_back("column " + where(id.b, id.h, id.t));
        continue;
      }
      ColumnReference want = ref.column(id.b, id.h, id.t, stats);
      for (int d = 0; d < D; ++d) {
        e_dk.add(it->second.dk[d], want.dk[d], where(id.b, id.h, id.t, d));
        e_dv.add(it->second.dv[d], want.dv[d], where(id.b, id.h, id.t, d));
      }
    }
  }

  auto finish = [&](const std::string& name, const ErrorSum& e) {
    TensorCheck t;
    t.tensor = name;
    t.values = e.n;
    t.max_abs_err = e.max_err;
    t.max_ref = e.max_ref;
    t.rel_l2_err = e.sq_ref > 0 ? std::sqrt(e.sq_err / e.sq_ref) : std::sqrt(e.sq_err);
    // The hybrid FP8 recipe's gradients: dS rounded to dO's format (e5m2) for its products.
    Tolerance tol = tolerance(name, name[0] == 'd' && p.grad_dtype ? p.grad_dtype : p.dtype);
    t.tol_rel_l2 = tol.rel_l2 * settings.tolerance_scale;
    t.tol_max = tol.max * settings.tolerance_scale;
    t.worst = e.worst;
    for (const auto& [tensor, count] : nonfinite)
      if (tensor == name) t.nonfinite = count;
    const double max_bound = name == "LSE" ? t.tol_max : t.tol_max * std::max(e.max_ref, 1e-30);
    t.ok = t.nonfinite == 0 && e.max_err <= max_bound && t.rel_l2_err <= t.tol_rel_l2 && std::isfinite(e.sq_err);
    result.ok = result.ok && t.ok;
    result.tensors.push_back(std::move(t));
  };
  finish("O", e_o);
  finish("LSE", e_lse);
  if (plan.gradients) {
    finish("dQ", e_dq);
    finish("dK", e_dk);
    finish("dV", e_dv);
  }
  if (!missing.empty()) {
    result.ok = false;
    std::string list;
    for (const std::string& m : missing) list += (list.empty() ? "" : ", ") + m;
    result.note = "no rank holds " + list + (result.note.empty() ? "" : "; " + result.note);
  }
  return result;
}

}  // namespace attnhost
