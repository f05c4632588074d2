// dilated: LongNet dilated attention (arXiv 2307.02486; docs/VARIANTS.md). Patterns (w, r): in every
// segment of w tokens each head attends every r-th row from its own offset; the patterns are
// combined by LSE, so a key two patterns select counts twice. Contiguous sharding: rank k holds
// tokens [k*n, (k+1)*n), n = ceil(S / P) (the last rank's tail is padding); a segment wider than a
// rank is attended by the ranks it spans, which exchange only its dilated K/V rows.
#include "dilated_attention.h"
#include "geometry.h"

#include "attncore/plugin/ring_plugin.h"  // validate_dense, kRingDtypes, kRingDevices

#include <algorithm>
#include <climits>
#include <tuple>

namespace {

using dilated::Geometry;

constexpr uint32_t kSpec = ATTNHOST_STRUCT_SIZE(attnhost_param_spec, choices);
constexpr attnhost_param_spec kParams[] = {
    {kSpec, "segment_lengths", ATTNHOST_PARAM_INT_LIST, "[2048, 4096, 8192, 16384, 32768]",
     "segment length w of each pattern (default: LongNet's language model); the last segment is padded", nullptr},
    {kSpec, "dilation_rates", ATTNHOST_PARAM_INT_LIST, "[1, 2, 4, 6, 12]",
     "dilation rate r of each pattern, 1 <= r <= w; where w % r != 0 a segment's rows past its last full stride "
     "select nothing, like padding",
     nullptr},
    {kSpec, "offset_mode", ATTNHOST_PARAM_STRING, "\"paper\"",
     "head offsets: paper (head h starts at h mod r) or torchscale (r contiguous groups of heads)", "paper|torchscale"},
    {kSpec, "torchscale_backward", ATTNHOST_PARAM_BOOL, "false",
     "torchscale's approximate backward (combine weights held constant, each pattern's delta from its own "
     "output); not the gradient of the forward where patterns overlap",
     nullptr},
    {kSpec, "overlap", ATTNHOST_PARAM_BOOL, "true",
     "exchange dilated K/V rows on their own stream while the local patterns compute (false: one stream)", nullptr},
    {kSpec, "cpu_accumulate", ATTNHOST_PARAM_STRING, "\"fp32\"", "accumulation type of the CPU path", "fp32|fp64"},
};

std::vector<dilated::Pattern> patterns_of(const attnhost::Problem& p) {
  const auto& w = p.get_int_list("segment_lengths");
  const auto& r = p.get_int_list("dilation_rates");
  std::vector<dilated::Pattern> out;
  for (size_t i = 0; i < w.size() && i < r.size(); ++i) out.push_back({w[i], r[i]});
  return out;
}

Geometry geometry_of(const attnhost::Problem& p) {
  const auto mode = p.get_string("offset_mode") == "torchscale" ? dilated::OffsetMode::torchscale
                                                                 : dilated::OffsetMode::paper;
  return Geometry(p->seqlen_q, p->heads_q, p->causal != 0, mode, patterns_of(p), p->world_size);
}

dilated::Shape shape_of(const attnhost::Problem& p) {
  dilated::Shape s;
  s.dtype = p->dtype;
  s.batch = static_cast<int32_t>(p->batch);
  s.heads_q = p->heads_q;
  s.heads_kv = p->heads_kv;
  s.head_dim = p->head_dim;
  s.softmax_scale = static_cast<float>(p->softmax_scale);
  s.torchscale_backward = p.get_bool("torchscale_backward");
  return s;
}

class Dilated {
 public:
  static const attnhost_plugin_info& info() {
    static const attnhost_plugin_info info = {
        ATTNHOST_STRUCT_SIZE(attnhost_plugin_info, params),
        "dilated",
        "1.0.0",
        "LongNet dilated attention: patterns (w, r) gathered into dense flash calls, combined by LSE in fp32, "
        "exact backward; ranks share only dilated K/V rows",
        {ATTNHOST_STRUCT_SIZE(attnhost_capabilities, head_dims), attncore::plugin::kRingDevices,
         attncore::plugin::kRingDtypes,
         ATTNHOST_FEATURE_CAUSAL | ATTNHOST_FEATURE_NONCAUSAL | ATTNHOST_FEATURE_GQA | ATTNHOST_FEATURE_BACKWARD, 1, 0,
         0, nullptr},
        static_cast<int32_t>(std::size(kParams)),
        kParams,
    };
    return info;
  }

  static void validate(const attnhost::Problem& p) {
    using attnhost::fail;
    attncore::plugin::validate_dense(p);
    if (p->window_left >= 0 || p->window_right >= 0)
      fail(ATTNHOST_ERR_UNSUPPORTED, "dilated attention takes no sliding window (its segments are the locality)");
    if (p->deterministic)
      fail(ATTNHOST_ERR_UNSUPPORTED, "dilated attention has no deterministic mode (dK/dV partials from other ranks "
                                     "and GQA heads are added atomically)");
    const std::string bad = dilated::check_patterns(p.get_int_list("segment_lengths"), p.get_int_list("dilation_rates"));
    if (!bad.empty()) fail(ATTNHOST_ERR_INVALID_ARGUMENT, bad);
    if (static_cast<double>(p->heads_q) * p->seqlen_q > INT32_MAX)
      fail(ATTNHOST_ERR_UNSUPPORTED, "heads x sequence length must stay below 2^31 (32-bit row tables)");
  }

  Dilated(const attnhost::Problem& p, attnhost::Host host)
      : problem_(p), geometry_(geometry_of(p)),
        attention_(geometry_, shape_of(p), attncore::plugin::schedule_options(p, host)) {
    const int64_t begin = geometry_.begin(p->rank), real = geometry_.end(p->rank) - begin;
    layout_.add(begin, real);
    layout_.pad(geometry_.chunk() - real);
  }

  attnhost_layout layout(int32_t) { return layout_.view(); }
  void forward(const attnhost_forward_args& a) { attention_.forward(a); }
  void backward(const attnhost_backward_args& a) { attention_.backward(a); }

  attnhost::PairCount count_pairs() {
    return {attention_.rank_pairs(), geometry_.total_pairs() * problem_->batch};
  }

  // Each pattern that selects the query adds its segment's rows (up to the query when causal);
  // a key two patterns select comes out once with multiplicity 2.
  attnhost_span_list enumerate_keys(int64_t, int32_t h, int64_t q) {
    std::vector<attnhost_span> found;
    for (size_t p = 0; p < geometry_.patterns().size(); ++p) {
      int64_t t = 0;
      if (!geometry_.selects(p, h, q, &t)) continue;
      const dilated::Lattice l = geometry_.lattice(p, h, q / geometry_.patterns()[p].w);
      const int64_t end = geometry_.causal() ? q + 1 : l.position(l.count - 1) + 1;
      found.push_back({l.first, end, l.step, -1, 1});
    }
    return merged(found);
  }

  attnhost_span_list enumerate_queries(int64_t, int32_t kv_head, int64_t k) {
    std::vector<attnhost_span> found;
    const int32_t group = problem_->heads_q / problem_->heads_kv;
    for (int32_t h = kv_head * group; h < (kv_head + 1) * group; ++h)
      for (size_t p = 0; p < geometry_.patterns().size(); ++p) {
        int64_t t = 0;
        if (!geometry_.selects(p, h, k, &t)) continue;
        const dilated::Lattice l = geometry_.lattice(p, h, k / geometry_.patterns()[p].w);
        found.push_back({geometry_.causal() ? k : l.first, l.position(l.count - 1) + 1, l.step, h, 1});
      }
    return merged(found);
  }

 private:
  attnhost_span_list merged(std::vector<attnhost_span>& found) {
    auto key = [](const attnhost_span& s) { return std::tuple(s.head, s.begin, s.end, s.step); };
    std::sort(found.begin(), found.end(), [&](const auto& x, const auto& y) { return key(x) < key(y); });
    spans_.clear();
    for (size_t i = 0; i < found.size();) {
      size_t j = i;
      while (j < found.size() && key(found[j]) == key(found[i])) ++j;
      spans_.add(found[i].begin, found[i].end, found[i].step, found[i].head, static_cast<int32_t>(j - i));
      i = j;
    }
    return spans_.view();
  }

  attnhost::Problem problem_;
  Geometry geometry_;
  dilated::DilatedAttention attention_;
  attnhost::Layout layout_;
  attnhost::SpanList spans_;
};

}  // namespace

ATTNHOST_EXPORT_PLUGIN(Dilated)
