// A ring-shaped plugin (ring, zigzag): the attnhost table around RingAttention. A variant brings
// its self-description, its extra validation, its layout and its step plan; everything else —
// the dense mask's semantics, parameters, pair counts and the reference enumeration — is here.
//
//   struct Variant {
//     static const attnhost_plugin_info& info();          // name, capabilities, kRingParams
//     static void validate(const attnhost::Problem&);     // what the variant adds
//     explicit Variant(const attnhost::Problem&);
//     const attnhost::Layout& layout() const;             // same for Q and K/V
//     std::vector<BlockCall> calls(int rank, int source) const;
//   };
#pragma once

#include "attncore/plugin/ring.h"

#include <attnhost/plugin.hpp>

#include <algorithm>
#include <array>
#include <string_view>
#include <vector>

namespace attncore::plugin {

// The parameters of the ring-shaped plugins; batch_slices last.
inline constexpr attnhost_param_spec kRingParams[] = {
    {ATTNHOST_STRUCT_SIZE(attnhost_param_spec, choices), "overlap", ATTNHOST_PARAM_BOOL, "true",
     "send the next K/V block on its own stream while this one computes (false: one stream)", nullptr},
    {ATTNHOST_STRUCT_SIZE(attnhost_param_spec, choices), "cpu_accumulate", ATTNHOST_PARAM_STRING, "\"fp32\"",
     "accumulation type of the CPU path", "fp32|fp64"},
    {ATTNHOST_STRUCT_SIZE(attnhost_param_spec, choices), "engine", ATTNHOST_PARAM_STRING, "\"auto\"",
     "what runs the attention blocks on a GPU: the core's kernels (native), cuDNN where it serves the call, or "
     "cuDNN where it also measured faster (auto); the log says which served how many calls",
     "auto|native|cudnn"},
    {ATTNHOST_STRUCT_SIZE(attnhost_param_spec, choices), "partials", ATTNHOST_PARAM_STRING, "\"fp32\"",
     "a GPU block's partial output and gradients before they are merged in fp32: fp32 (exact; cuDNN serves no "
     "such call on the libraries measured), or the problem's dtype (rounded once per block, as PyTorch's context "
     "parallelism does, so that cuDNN can serve the blocks)",
     "fp32|dtype"},
    {ATTNHOST_STRUCT_SIZE(attnhost_param_spec, choices), "batch_slices", ATTNHOST_PARAM_INT, "0",
     "run the ring over this many slices of the batch, one after another, so that its receive buffers and fp32 "
     "workspace hold one slice; 0: one at world size 1, else the fewest that keep a rank's memory within 1.3x of "
     "its Q, K, V, O, dO, dQ, dK, dV and two K/V blocks, but no slice so small that a backward call has under 256 "
     "blocks of work (key tiles x kv heads x entries), and the forward the fewest that fit in the backward's buffers",
     nullptr},
    {ATTNHOST_STRUCT_SIZE(attnhost_param_spec, choices), "head_slices", ATTNHOST_PARAM_INT, "0",
     "and over this many slices of the key/value heads within a batch slice, each packed into buffers of its own "
     "(for a batch too small to slice); 0: one, or where batch slices alone do not meet the rule above, the fewest "
     "that do",
     nullptr},
    {ATTNHOST_STRUCT_SIZE(attnhost_param_spec, choices), "join", ATTNHOST_PARAM_BOOL, "true",
     "at two ranks without a window, where the plugin says where its blocks lie (zigzag): the forward gathers the "
     "keys a rank's rows reach in sequence order and makes one call a run of rows, with no merge (false: the "
     "ring's two steps, merged)",
     nullptr},
};
// One of kRingParams by name, for a plugin that takes some of them; an unknown name does not compile.
consteval attnhost_param_spec ring_param(std::string_view name) {
  for (const attnhost_param_spec& p : kRingParams)
    if (std::string_view(p.name) == name) return p;
  throw "no ring parameter of that name";
}
inline constexpr int32_t kNumRingParams = 6;        // ring: all but join
inline constexpr int32_t kNumJoinedRingParams = 7;  // zigzag: all of them
inline constexpr int32_t kNumPackedRingParams = 4;  // all but the slices: what any schedule on the ring takes

// A plugin's parameters: the first kNumPackedRingParams of kRingParams (overlap, cpu_accumulate,
// engine, partials), then its own.
template <size_t N>
consteval std::array<attnhost_param_spec, kNumPackedRingParams + N> with_packed_ring_params(
    const std::array<attnhost_param_spec, N>& own) {
  std::array<attnhost_param_spec, kNumPackedRingParams + N> params{};
  for (int32_t i = 0; i < kNumPackedRingParams; ++i) params[i] = kRingParams[i];
  for (size_t i = 0; i < N; ++i) params[kNumPackedRingParams + i] = own[i];
  return params;
}

inline constexpr uint32_t kRingDtypes = ATTNHOST_CAP_DTYPE(ATTNHOST_DTYPE_BF16) |
                                        ATTNHOST_CAP_DTYPE(ATTNHOST_DTYPE_FP16) |
                                        ATTNHOST_CAP_DTYPE(ATTNHOST_DTYPE_FP32);
// ring, zigzag and varlen take FP8 inputs too (K/V travel in FP8; partials, merges and gradients
// stay fp32, outputs bf16): e4m3 on GPUs (Hopper, head dims 64, 128 and 256; varlen on the CPU path
// only), both formats on the CPU path; validate says what a GPU does not take.
inline constexpr uint32_t kRingDtypesFp8 =
    kRingDtypes | ATTNHOST_CAP_DTYPE(ATTNHOST_DTYPE_FP8_E4M3) | ATTNHOST_CAP_DTYPE(ATTNHOST_DTYPE_FP8_E5M2);
inline constexpr uint32_t kRingDevices = ATTNHOST_CAP_DEVICE_CPU
#if ATTNCORE_HAVE_CUDA
                                         | ATTNHOST_CAP_DEVICE_CUDA
#endif
    ;

// Checks shared by the dense variants: self-attention in batch format, a dtype and head dim the
// core runs on this device.
void validate_dense(const attnhost::Problem& p);
// The same for packed documents, where a plugin takes them: one sequence of cu_seqlens for queries
// and keys alike.
void validate_packed(const attnhost::Problem& p);
DenseMask dense_mask(const attnhost::Problem& p);
// Fills batch_slices and head_slices where they are 0 (auto): one each at world size 1; above, the
// fewest batch slices, then the fewest head slices, with which the tensors a rank holds plus the
// ring's workspace stay within 1.3x of its working set (Q, K, V, O, dO, dQ, dK, dV and two K/V
// blocks), or as many as there are when none does; but never so many that a slice's backward call
// has under `min_ctas` CTAs (kMinBackwardCtas on GPUs, 0 on the CPU, which has no grid to starve).
// Batch slices asked for are both passes'; chosen, they are the backward's
// (RingShape::forward_batch_slices). Sets double_rows where there is more than one batch slice and
// no head slice, and keeps own_last (set_own_last) only there and where its slices, its third row
// set counted, meet the rule with at most one batch slice more than the backward without it.
void choose_slices(RingShape& s, int world_size, int64_t min_ctas);
void choose_slices(RingShape& s, int world_size);  // (5.0) without the floor
// The GPU backward runs a CTA a (key tile of 128, kv head, batch entry). GQA 16:1 at d64 on two
// H200s (B=2 S=16384, 2 kv heads) ran 32.954 ms in slices of one entry and one kv head, 64 CTAs a
// call on 132 SMs, and 17.760 with the batch whole (the kv heads still cut in two); world size 1
// took 17.906 (docs/KERNELS.md, "Batch and head slices").
constexpr int64_t kMinBackwardCtas = 256;
// The ring's shape of a dense problem whose ranks hold `local_tokens` tokens each; one slice of each
// kind.
RingShape dense_shape(const attnhost::Problem& p, int64_t local_tokens);

// What every dense plugin tells the host's check, whatever its sharding: the pairs of the whole
// problem, and the keys of a query and the queries of a key under the problem's mask. Packed
// documents (cu_seqlens) are as many sequences side by side: the mask applies within each.
class DenseReference {
 public:
  explicit DenseReference(const attnhost::Problem& p)
      : problem_(p), mask_(dense_mask(p)),
        starts_(p.packed() ? p.cu_seqlens_q() : std::vector<int64_t>{0, p->seqlen_q}) {}
  const DenseMask& mask() const { return mask_; }
  // Document d: tokens [starts()[d], starts()[d + 1]).
  const std::vector<int64_t>& starts() const { return starts_; }
  // (query, key) pairs of one batch entry and head.
  int64_t pairs_per_head() const {
    int64_t pairs = 0;
    for (size_t d = 0; d + 1 < starts_.size(); ++d) {
      const DenseMask m = within(d);
      for (int64_t i = 0; i < m.seqlen; ++i) pairs += m.keys_of(i).size();
    }
    return pairs;
  }
  int64_t total_pairs() const { return pairs_per_head() * problem_->batch * problem_->heads_q; }
  attnhost_span_list enumerate_keys(int64_t, int32_t, int64_t q) {
    spans_.clear();
    const size_t d = document_of(q);
    const Interval k = within(d).keys_of(q - starts_[d]);
    spans_.add(starts_[d] + k.lo, starts_[d] + k.hi);
    return spans_.view();
  }
  attnhost_span_list enumerate_queries(int64_t, int32_t kv_head, int64_t key) {
    spans_.clear();
    const size_t d = document_of(key);
    const Interval q = within(d).queries_of(key - starts_[d]);
    const int32_t group = problem_->heads_q / problem_->heads_kv;
    for (int32_t h = kv_head * group; h < (kv_head + 1) * group; ++h) spans_.add(starts_[d] + q.lo, starts_[d] + q.hi, 1, h);
    return spans_.view();
  }

 private:
  size_t document_of(int64_t token) const {
    return static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), token) - starts_.begin()) - 1;
  }
  DenseMask within(size_t d) const {
    DenseMask m = mask_;
    m.seqlen = starts_[d + 1] - starts_[d];
    return m;
  }

  attnhost::Problem problem_;
  DenseMask mask_;
  std::vector<int64_t> starts_;
  attnhost::SpanList spans_;
};

template <class Variant>
class RingPlugin {
 public:
  static const attnhost_plugin_info& info() { return Variant::info(); }
  static void validate(const attnhost::Problem& p) {
    validate_dense(p);
    for (const char* name : {"batch_slices", "head_slices"})
      if (p.get_int(name) < 0) attnhost::fail(ATTNHOST_ERR_INVALID_ARGUMENT, std::string(name) + " must be 0 (auto) or more");
    Variant::validate(p);
  }

  RingPlugin(const attnhost::Problem& p, attnhost::Host host)
      : reference_(p), variant_(p),
        ring_(shape(p), [this](int rank, int source) { return variant_.calls(rank, source); },
              schedule_options(p, host)) {
    if constexpr (says_where_blocks_lie) ring_.set_block_runs([this](int member) { return variant_.block(member); });
  }

  attnhost_layout layout(int32_t) { return variant_.layout().view(); }
  void forward(const attnhost_forward_args& a) { ring_.forward(a); }
  void backward(const attnhost_backward_args& a) { ring_.backward(a); }

  attnhost::PairCount count_pairs() { return {ring_.rank_pairs(), reference_.total_pairs()}; }
  attnhost_span_list enumerate_keys(int64_t b, int32_t h, int64_t q) { return reference_.enumerate_keys(b, h, q); }
  attnhost_span_list enumerate_queries(int64_t b, int32_t kv_head, int64_t key) {
    return reference_.enumerate_queries(b, kv_head, key);
  }

 private:
  RingShape shape(const attnhost::Problem& p) const {
    RingShape s = dense_shape(p, variant_.layout().local_tokens());
    s.batch_slices = static_cast<int32_t>(std::min<int64_t>(p.get_int("batch_slices"), s.batch));
    s.head_slices = static_cast<int32_t>(std::min<int64_t>(p.get_int("head_slices"), s.heads_kv));
    const RingPlan plan = [this](int rank, int source) { return variant_.calls(rank, source); };
    set_block_reach(s, plan, p->world_size);
    set_own_last(s, plan, p->world_size, p.has("partials") && p.get_string("partials") == "dtype");
    if constexpr (says_where_blocks_lie)
      if (!p.has("join") || p.get_bool("join")) set_joined_forward(s, p->world_size);
    choose_slices(s, p->world_size, p->device_type == ATTNHOST_DEVICE_CUDA ? kMinBackwardCtas : 0);
    return s;
  }

  // A variant that says where each member's block lies (`attnhost::Layout block(int member)`) has
  // its forward joined at two ranks (RingShape::joined_forward).
  static constexpr bool says_where_blocks_lie = requires(const Variant& v) { v.block(0); };

  DenseReference reference_;
  Variant variant_;
  RingAttention ring_;
};

}  // namespace attncore::plugin
