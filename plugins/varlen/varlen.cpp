// varlen: packed variable-length sequences on the ring (docs/VARIANTS.md). Short sequences are
// placed whole on the ranks, balanced by their pairs; the longest are split over all ranks (zigzag
// within them when causal), as few as the balance needs (sharding.h, place_sequences). K/V blocks of
// the split sequences go round the ring of plugins/core/plugin (RingAttention: double-buffered,
// overlapped, fp32 merges, dK/dV travelling home), and each step attends only pairs of one sequence
// (schedule.h). The segment lists of every step are made and uploaded once, when the instance is
// created.
#include "schedule.h"
#include "sharding.h"

#include "attncore/plugin/engine.h"
#include "attncore/plugin/ring.h"
#include "attncore/plugin/ring_plugin.h"

#include <attnhost/plugin.hpp>

#include <iterator>
#include <limits>
#include <string>
#include <vector>

namespace {

using attncore::plugin::BlockCall;
using attncore::plugin::Interval;
using attnhost::fail;

// The packed lengths, or one sequence for a batch of one.
std::vector<int64_t> cu_seqlens(const attnhost::Problem& p) {
  if (p.packed()) return p.cu_seqlens_q();
  return {0, p->seqlen_q};
}

varlen::SequenceMask sequence_mask(const attnhost::Problem& p) {
  return {p->causal != 0, p->window_left, p->window_right};
}

varlen::Sharding sharding_of(const attnhost::Problem& p) {
  const std::vector<int64_t> cu = cu_seqlens(p);
  std::vector<int> owner;
  if (p.get_string("dispatch") == "balanced") owner = varlen::place_sequences(cu, sequence_mask(p), p->world_size);
  return varlen::Sharding(cu, p->world_size, p->causal != 0, std::move(owner));
}

inline constexpr auto kParams = attncore::plugin::with_packed_ring_params(std::array{attnhost_param_spec{
    ATTNHOST_STRUCT_SIZE(attnhost_param_spec, choices), "dispatch", ATTNHOST_PARAM_STRING, "\"balanced\"",
    "balanced: short sequences placed whole on the ranks by their pairs, only as many of the longest split over "
    "every rank as the balance needs; split: every sequence split over every rank",
    "balanced|split"}});

class Varlen {
 public:
  static const attnhost_plugin_info& info() {
    static const attnhost_plugin_info info = {
        ATTNHOST_STRUCT_SIZE(attnhost_plugin_info, params),
        "varlen",
        "1.0.0",
        "packed variable-length ring attention: short sequences whole on a rank, balanced by pairs, long ones "
        "split over the ranks (zigzag when causal); per-sequence segments, fp32 merges",
        {ATTNHOST_STRUCT_SIZE(attnhost_capabilities, head_dims), attncore::plugin::kRingDevices,
         attncore::plugin::kRingDtypesFp8,
         ATTNHOST_FEATURE_CAUSAL | ATTNHOST_FEATURE_NONCAUSAL | ATTNHOST_FEATURE_WINDOW | ATTNHOST_FEATURE_GQA |
             ATTNHOST_FEATURE_VARLEN | ATTNHOST_FEATURE_BACKWARD | ATTNHOST_FEATURE_DETERMINISTIC,
         1, 0, 0, nullptr},
        static_cast<int32_t>(kParams.size()),
        kParams.data(),
    };
    return info;
  }

  static void validate(const attnhost::Problem& p) {
    if (!p.packed() && p->batch != 1)
      fail(ATTNHOST_ERR_UNSUPPORTED, "varlen takes packed sequences (a [varlen] table) or one sequence, not a batch of " +
                                         std::to_string(p->batch));
    if (p.packed() && (p.cu_seqlens_q().empty() || p.cu_seqlens_q() != p.cu_seqlens_kv()))
      fail(ATTNHOST_ERR_UNSUPPORTED, "varlen needs the same sequence lengths for queries and keys");
    if (p->seqlen_q != p->seqlen_kv)
      fail(ATTNHOST_ERR_UNSUPPORTED, "seqlen_kv (" + std::to_string(p->seqlen_kv) + ") must equal seqlen_q (" +
                                         std::to_string(p->seqlen_q) + "): self-attention only");
    if (p->heads_kv <= 0 || p->heads_q % p->heads_kv != 0)
      fail(ATTNHOST_ERR_INVALID_ARGUMENT, "heads_q must be a multiple of heads_kv");
    const attncore::DType dtype = attncore::plugin::core_dtype(p->dtype);
    const std::string why = p->device_type == ATTNHOST_DEVICE_CUDA ? attncore::check_supported(dtype, p->head_dim)
                                                                   : attncore::check_supported_cpu(dtype, p->head_dim);
    if (!why.empty()) fail(ATTNHOST_ERR_UNSUPPORTED, why);
    if (p->device_type == ATTNHOST_DEVICE_CUDA && attncore::is_fp8(dtype))
      fail(ATTNHOST_ERR_UNSUPPORTED, "varlen: FP8 runs on the CPU path only (the core's FP8 forward on CUDA takes calls "
                                     "without segments)");
    if (p->device_type == ATTNHOST_DEVICE_CUDA && !(attncore::plugin::kRingDevices & ATTNHOST_CAP_DEVICE_CUDA))
      fail(ATTNHOST_ERR_UNSUPPORTED, "this plugin was built without CUDA");
    const std::vector<int64_t> cu = cu_seqlens(p);
    for (size_t s = 1; s < cu.size(); ++s)
      if (cu[s] < cu[s - 1]) fail(ATTNHOST_ERR_INVALID_ARGUMENT, "cu_seqlens must not decrease");
    if (cu.back() != p->seqlen_q)
      fail(ATTNHOST_ERR_INVALID_ARGUMENT, "cu_seqlens ends at " + std::to_string(cu.back()) + ", not at seqlen " +
                                              std::to_string(p->seqlen_q));
    // Segments index local slots with 32-bit integers.
    const varlen::Sharding sharding = sharding_of(p);
    if (sharding.local_tokens() > std::numeric_limits<int32_t>::max())
      fail(ATTNHOST_ERR_UNSUPPORTED, std::to_string(sharding.local_tokens()) + " tokens a rank (with padding) is more "
                                         "than 2^31 - 1: use more ranks");
  }

  Varlen(const attnhost::Problem& p, attnhost::Host host)
      : problem_(p), mask_(sequence_mask(p)), sharding_(sharding_of(p)),
        layout_(sharding_.layout(p->rank)), steps_(plan_steps(p, host)),
        ring_(shape(p), [this](int rank, int source) { return calls(rank, source); },
              attncore::plugin::schedule_options(p, host)) {
    total_pairs_ = varlen::total_pairs(sharding_, mask_) * p->heads_q;
  }

  attnhost_layout layout(int32_t) { return layout_.view(); }
  void forward(const attnhost_forward_args& a) { ring_.forward(a); }
  void backward(const attnhost_backward_args& a) { ring_.backward(a); }

  attnhost::PairCount count_pairs() { return {ring_.rank_pairs(), total_pairs_}; }

  attnhost_span_list enumerate_keys(int64_t, int32_t, int64_t q) {
    spans_.clear();
    const int64_t s = sharding_.sequence_of(q), start = sharding_.start(s);
    const Interval k = mask_.of(sharding_.length(s)).keys_of(q - start);
    spans_.add(start + k.lo, start + k.hi);
    return spans_.view();
  }
  attnhost_span_list enumerate_queries(int64_t, int32_t kv_head, int64_t key) {
    spans_.clear();
    const int64_t s = sharding_.sequence_of(key), start = sharding_.start(s);
    const Interval q = mask_.of(sharding_.length(s)).queries_of(key - start);
    const int32_t group = problem_->heads_q / problem_->heads_kv;
    for (int32_t h = kv_head * group; h < (kv_head + 1) * group; ++h) spans_.add(start + q.lo, start + q.hi, 1, h);
    return spans_.view();
  }

 private:
  // Every step's calls, their segments in one upload to the instance's device (into segments_).
  std::vector<std::vector<BlockCall>> plan_steps(const attnhost::Problem& p, attnhost::Host host) {
    std::vector<std::vector<varlen::StepCall>> plans(p->world_size);
    std::vector<attncore::Segment> all;
    for (int source = 0; source < p->world_size; ++source) {
      plans[source] = varlen::plan_step(sharding_, mask_, p->rank, source, p->deterministic != 0);
      for (const varlen::StepCall& c : plans[source]) {
        all.insert(all.end(), c.forward.begin(), c.forward.end());
        all.insert(all.end(), c.backward.begin(), c.backward.end());
      }
    }
    segments_ = attnhost::HostBuffer(host, all.size() * sizeof(attncore::Segment));
    if (!all.empty())
      attncore::plugin::Engine::make(p->device_type == ATTNHOST_DEVICE_CUDA, false)
          ->upload(segments_.get(), all.data(), segments_.bytes());
    const attncore::Segment* at = segments_.as<attncore::Segment>();
    std::vector<std::vector<BlockCall>> steps(p->world_size);
    for (int source = 0; source < p->world_size; ++source)
      for (const varlen::StepCall& c : plans[source]) {
        const int64_t n = extent(p->rank, source);
        BlockCall call{0, n, 0, n, 0, 0, c.masked};
        call.segments = at;
        call.num_segments = static_cast<int32_t>(c.forward.size());
        at += c.forward.size();
        call.backward_segments = at;
        call.num_backward_segments = static_cast<int32_t>(c.backward.size());
        at += c.backward.size();
        call.pairs = c.pairs;
        steps[source].push_back(call);
      }
    return steps;
  }

  // The rows and columns a step's calls span: every slot with the rank's own block; with another's,
  // the split sequences' slots alone, which are all of the block that travels.
  int64_t extent(int rank, int source) const {
    return rank == source ? sharding_.local_tokens() : sharding_.split_slots();
  }
  // This rank's calls as uploaded; another rank's only as far as the ring asks (which columns of the
  // block it reaches: all it spans when it makes any call).
  std::vector<BlockCall> calls(int rank, int source) const {
    if (rank == problem_->rank) return steps_[source];
    if (varlen::plan_step(sharding_, mask_, rank, source, false).empty()) return {};
    const int64_t n = extent(rank, source);
    return {BlockCall{0, n, 0, n, 0, 0, true}};
  }

  attncore::plugin::RingShape shape(const attnhost::Problem& p) const {
    attncore::plugin::RingShape s;
    s.dtype = p->dtype;
    s.batch = 1;
    s.heads_q = p->heads_q;
    s.heads_kv = p->heads_kv;
    s.head_dim = p->head_dim;
    s.local_q = s.local_kv = sharding_.local_tokens();
    s.softmax_scale = static_cast<float>(p->softmax_scale);
    s.mask = {0, mask_.causal, mask_.window_left, mask_.window_right};  // pairs come with each call
    s.deterministic = p->deterministic != 0;
    // Where little is split, the gradients of the split slots go home rather than round the ring.
    attncore::plugin::set_block_reach(s, [this](int rank, int source) { return calls(rank, source); }, p->world_size);
    return s;
  }

  attnhost::Problem problem_;
  varlen::SequenceMask mask_;
  varlen::Sharding sharding_;
  attnhost::Layout layout_;
  attnhost::HostBuffer segments_;              // what steps_ point into, on the device
  std::vector<std::vector<BlockCall>> steps_;  // by source rank
  int64_t total_pairs_ = 0;
  attncore::plugin::RingAttention ring_;
  attnhost::SpanList spans_;
};

}  // namespace

ATTNHOST_EXPORT_PLUGIN(Varlen)
