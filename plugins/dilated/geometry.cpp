#include "geometry.h"

#include <algorithm>
#include <tuple>

namespace dilated {

namespace {

// ceil(a / b) for b > 0 and any sign of a.
int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

}  // namespace

std::pair<int64_t, int64_t> Lattice::within(int64_t x, int64_t y) const {
  const int64_t lo = std::clamp<int64_t>(ceil_div(x - first, step), 0, count);
  const int64_t hi = std::clamp<int64_t>(ceil_div(y - first, step), lo, count);
  return {lo, hi};
}

Geometry::Geometry(int64_t seqlen, int32_t heads, bool causal, OffsetMode mode, std::vector<Pattern> patterns,
                   int world)
    : seqlen_(seqlen), heads_(heads), causal_(causal), mode_(mode), patterns_(std::move(patterns)), world_(world),
      chunk_((seqlen + world - 1) / world) {}

int64_t Geometry::offset(size_t p, int32_t head) const {
  const int64_t r = patterns_[p].r;
  if (mode_ == OffsetMode::paper) return head % r;
  // torchscale pads the heads to a multiple of r and gives each of r contiguous groups one offset.
  const int64_t group = (heads_ + r - 1) / r;
  return head / group;
}

Lattice Geometry::lattice(size_t p, int32_t head, int64_t segment) const {
  const Pattern& pt = patterns_[p];
  const int64_t end = std::min(seqlen_, (segment + 1) * pt.w);
  Lattice l;
  l.first = segment * pt.w + offset(p, head);
  l.step = pt.r;
  l.count = l.first < end ? ceil_div(end - l.first, pt.r) : 0;
  return l;
}

bool Geometry::selects(size_t p, int32_t head, int64_t pos, int64_t* t) const {
  const Pattern& pt = patterns_[p];
  const int64_t u = pos - (pos / pt.w) * pt.w - offset(p, head);
  if (u < 0 || u % pt.r != 0) return false;
  *t = u / pt.r;
  return true;
}

int64_t Geometry::begin(int rank) const { return std::min(seqlen_, rank * chunk_); }
int64_t Geometry::end(int rank) const { return std::min(seqlen_, (rank + 1) * chunk_); }

PatternPlan Geometry::plan(size_t p, int rank) const {
  PatternPlan plan;
  const int64_t a = begin(rank), b = end(rank), w = patterns_[p].w;
  if (a >= b) return plan;
  const int64_t g_lo = a / w, g_hi = (b - 1) / w;
  std::vector<int64_t> q_rows(g_hi - g_lo + 1, 0), kv_rows(g_hi - g_lo + 1, 0);
  for (int32_t h = 0; h < heads_; ++h)
    for (int64_t g = g_lo; g <= g_hi; ++g) {
      Region reg;
      reg.head = h;
      reg.segment = g;
      reg.rows = lattice(p, h, g);
      std::tie(reg.tq_lo, reg.tq_hi) = reg.rows.within(a, b);
      if (reg.tq_lo == reg.tq_hi) continue;
      reg.kv_hi = causal_ ? reg.tq_hi : reg.rows.count;
      if (reg.rows.position(0) < a || reg.rows.position(reg.kv_hi - 1) >= b) plan.remote = true;
      q_rows[g - g_lo] = std::max(q_rows[g - g_lo], reg.tq_hi - reg.tq_lo);
      kv_rows[g - g_lo] = std::max(kv_rows[g - g_lo], reg.kv_hi);
      plan.regions.push_back(reg);
    }
  // Every head gives segment g the same rows in the gathered buffers: the widest head's.
  std::vector<int64_t> q_base(q_rows.size()), kv_base(kv_rows.size());
  for (size_t i = 0; i < q_rows.size(); ++i) {
    q_base[i] = plan.nq;
    kv_base[i] = plan.nk;
    plan.nq += q_rows[i];
    plan.nk += kv_rows[i];
  }
  for (Region& reg : plan.regions) {
    reg.q_slot = q_base[reg.segment - g_lo];
    reg.kv_slot = kv_base[reg.segment - g_lo];
  }
  return plan;
}

std::vector<Run> Geometry::runs(const PatternPlan& receiver, int sender) const {
  std::vector<Run> out;
  const int64_t a = begin(sender), b = end(sender);
  for (size_t i = 0; i < receiver.regions.size(); ++i) {
    const Region& reg = receiver.regions[i];
    auto [lo, hi] = reg.rows.within(a, b);
    hi = std::min(hi, reg.kv_hi);
    if (lo < hi) out.push_back({static_cast<int32_t>(i), lo, hi});
  }
  return out;
}

int64_t Geometry::pairs(const PatternPlan& plan, bool causal) {
  int64_t n = 0;
  for (const Region& reg : plan.regions)
    n += causal ? (reg.tq_hi * (reg.tq_hi + 1) - reg.tq_lo * (reg.tq_lo + 1)) / 2
                : (reg.tq_hi - reg.tq_lo) * reg.kv_hi;
  return n;
}

int64_t Geometry::total_pairs() const {
  int64_t n = 0;
  for (size_t p = 0; p < patterns_.size(); ++p)
    for (int32_t h = 0; h < heads_; ++h)
      for (int64_t g = 0; g < segments(p); ++g) {
        const int64_t c = lattice(p, h, g).count;
        n += causal_ ? c * (c + 1) / 2 : c * c;
      }
  return n;
}

std::string check_patterns(const std::vector<int64_t>& w, const std::vector<int64_t>& r) {
  if (w.empty()) return "segment_lengths is empty: give at least one pattern";
  if (w.size() != r.size())
    return "segment_lengths has " + std::to_string(w.size()) + " entries but dilation_rates has " +
           std::to_string(r.size()) + ": they pair up one to one";
  if (w.size() > static_cast<size_t>(kMaxPatterns))
    return "at most " + std::to_string(kMaxPatterns) + " patterns, got " + std::to_string(w.size());
  for (size_t i = 0; i < w.size(); ++i)
    if (w[i] < 1 || r[i] < 1 || r[i] > w[i])
      return "pattern " + std::to_string(i) + " (w = " + std::to_string(w[i]) + ", r = " + std::to_string(r[i]) +
             ") needs 1 <= r <= w";
  return "";
}

}  // namespace dilated
