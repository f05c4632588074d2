// An all-to-all plugin (ulysses, usp): the attnhost table around UlyssesAttention. A variant brings
// its self-description and the size of its Ulysses groups; the layout, the ring plan across the
// groups and the reference enumeration are here.
//
//   struct Variant {
//     static const attnhost_plugin_info& info();             // name, capabilities, kUlyssesParams
//     static int32_t ulysses_degree(const attnhost::Problem&); // u, a divisor of the world size
//   };
#pragma once

#include "attncore/plugin/dense_plans.h"
#include "attncore/plugin/ring_plugin.h"
#include "attncore/plugin/ulysses.h"

#include <array>
#include <variant>

namespace attncore::plugin {

// The ring's parameters that apply across Ulysses groups (overlap, cpu_accumulate, engine,
// partials), then the pipeline's, then usp's group size (last, so ulysses can leave it out).
inline constexpr std::array<attnhost_param_spec, kNumPackedRingParams + 4> kUlyssesParams =
    with_packed_ring_params(std::array{
        attnhost_param_spec{ATTNHOST_STRUCT_SIZE(attnhost_param_spec, choices), "head_groups", ATTNHOST_PARAM_INT,
                            "0",
                            "heads go through the all-to-alls in this many groups, each group's exchange under the "
                            "previous group's attention; 0: two where they cut a rank's kv heads evenly and one batch "
                            "entry's call over a group attends at least 2^29 pairs, else one",
                            nullptr},
        attnhost_param_spec{ATTNHOST_STRUCT_SIZE(attnhost_param_spec, choices), "taper", ATTNHOST_PARAM_STRING,
                            "\"auto\"",
                            "the first group's first batch entry and the last group's last go through the pipeline "
                            "alone (on), so that only one entry's exchange waits before the first call and after the "
                            "last, or whole groups do (off); auto: the forward on, the backward on where one entry's "
                            "call over a group holds at least 1024 query tiles of 128 rows",
                            "auto|on|off"},
        attnhost_param_spec{ATTNHOST_STRUCT_SIZE(attnhost_param_spec, choices), "exchange", ATTNHOST_PARAM_STRING,
                            "\"auto\"",
                            "how the all-to-alls move a peer's rows: auto: each tensor's as they lie, one copy by "
                            "the copy engines, where the host moves strided blocks (GPUs that reach one another's "
                            "memory, the CPU), else packed; packed: into one message a peer by the copy kernel",
                            "auto|packed"},
        attnhost_param_spec{ATTNHOST_STRUCT_SIZE(attnhost_param_spec, choices), "ulysses_degree",
                            ATTNHOST_PARAM_INT, "0",
                            "ranks of a Ulysses group (all-to-all inside it, a zigzag ring across the groups); it "
                            "divides the world size (a smaller world is one group); 0: the ranks on one machine",
                            nullptr}});
inline constexpr int32_t kNumUlyssesParams = kNumPackedRingParams + 3;  // ulysses: all but ulysses_degree
inline constexpr int32_t kNumUspParams = kNumPackedRingParams + 4;

template <class Variant>
class UlyssesPlugin {
 public:
  static const attnhost_plugin_info& info() { return Variant::info(); }

  static void validate(const attnhost::Problem& p) {
    using attnhost::fail;
    if (p.packed()) validate_packed(p);
    else validate_dense(p);
    if (p.get_int("head_groups") < 0) fail(ATTNHOST_ERR_INVALID_ARGUMENT, "head_groups must be 0 (auto) or more");
    const int32_t u = Variant::ulysses_degree(p), r = p->world_size / u;
    if (u < 1 || p->world_size % u != 0)
      fail(ATTNHOST_ERR_INVALID_ARGUMENT, "a Ulysses group of " + std::to_string(u) + " ranks does not divide world size " +
                                              std::to_string(p->world_size));
    if (std::string why = check_ulysses_heads(p->heads_q, p->heads_kv, u); !why.empty())
      fail(ATTNHOST_ERR_UNSUPPORTED, why);
    if (p.packed() && p->device_type == ATTNHOST_DEVICE_CUDA && is_fp8(core_dtype(p->dtype)))
      fail(ATTNHOST_ERR_UNSUPPORTED, "packed documents in FP8 run on the CPU path only (the core's FP8 forward on "
                                     "CUDA takes calls without segments)");
    if (p.packed() && r > 1)
      fail(ATTNHOST_ERR_UNSUPPORTED, "packed documents take one Ulysses group of every rank (ulysses_degree " +
                                         std::to_string(u) + " leaves a ring of " + std::to_string(r) + " groups)");
    if (zigzag(p, r) && p->seqlen_q % (2 * r) != 0)
      fail(ATTNHOST_ERR_UNSUPPORTED, "sequence length " + std::to_string(p->seqlen_q) + " is not divisible by 2 x " +
                                         std::to_string(r) + " (the zigzag ring across the Ulysses groups)");
  }

  UlyssesPlugin(const attnhost::Problem& p, attnhost::Host host)
      : reference_(p), u_(Variant::ulysses_degree(p)), plan_(make_plan(p, reference_.mask(), p->world_size / u_)),
        packed_(p.packed()), documents_(document_call(p, host)),
        attention_(shape_of(p), [this](int member, int source) { return calls(member, source); },
                   schedule_options(p, host)) {}

  attnhost_layout layout(int32_t) { return layout_.view(); }
  void forward(const attnhost_forward_args& a) { attention_.forward(a); }
  void backward(const attnhost_backward_args& a) { attention_.backward(a); }
  attnhost::PairCount count_pairs() { return {attention_.rank_pairs(), reference_.total_pairs()}; }
  attnhost_span_list enumerate_keys(int64_t b, int32_t h, int64_t q) { return reference_.enumerate_keys(b, h, q); }
  attnhost_span_list enumerate_queries(int64_t b, int32_t kv_head, int64_t key) {
    return reference_.enumerate_queries(b, kv_head, key);
  }

 private:
  using Plan = std::variant<ContiguousPlan, ZigzagPlan>;
  // A causal ring of several groups without a window is balanced by zigzag; anything else is contiguous.
  static bool zigzag(const attnhost::Problem& p, int32_t r) {
    return r > 1 && p->causal && p->window_left < 0 && p->window_right < 0;
  }
  static Plan make_plan(const attnhost::Problem& p, const DenseMask& mask, int32_t r) {
    if (zigzag(p, r)) return ZigzagPlan(mask, r);
    return ContiguousPlan(mask, r);
  }
  std::vector<BlockCall> calls(int member, int source) const {
    if (packed_) return documents_.num_segments > 0 ? std::vector<BlockCall>{documents_} : std::vector<BlockCall>{};
    return std::visit([&](const auto& plan) { return plan.calls(member, source); }, plan_);
  }
  // Packed documents: one call over the whole gathered sequence, a segment a document (masks apply
  // within each); its segments in one upload to the instance's device. (Unused for a dense problem.)
  BlockCall document_call(const attnhost::Problem& p, attnhost::Host host) {
    BlockCall c{0, p->seqlen_q, 0, p->seqlen_q, 0, 0, true};
    if (!p.packed()) return c;
    std::vector<Segment> segments;
    const std::vector<int64_t>& cu = reference_.starts();
    for (size_t d = 0; d + 1 < cu.size(); ++d)
      if (cu[d + 1] > cu[d])
        segments.push_back({static_cast<int32_t>(cu[d]), static_cast<int32_t>(cu[d + 1]), static_cast<int32_t>(cu[d]),
                            static_cast<int32_t>(cu[d + 1]), cu[d], cu[d]});
    c.pairs = reference_.pairs_per_head();
    if (segments.empty()) return c;
    segments_ = attnhost::HostBuffer(host, segments.size() * sizeof(Segment));
    Engine::make(p->device_type == ATTNHOST_DEVICE_CUDA, false)->upload(segments_.get(), segments.data(), segments_.bytes());
    c.segments = segments_.as<Segment>();
    c.num_segments = static_cast<int32_t>(segments.size());
    return c;
  }

  // This rank's tokens: piece rank % u (n tokens) of its group's block; the last pieces' tails are
  // padding. The layout is made here, before the attention that needs its size.
  RingShape shape(const attnhost::Problem& p) {
    attnhost::Layout block;
    const int64_t block_tokens = std::visit([&](const auto& plan) {
      plan.add_block(block, p->rank / u_);
      return plan.block_tokens();
    }, plan_);
    const int64_t n = (block_tokens + u_ - 1) / u_, begin = (p->rank % u_) * n;
    const attnhost_layout view = block.view();
    for (int32_t i = 0; i < view.num_ranges; ++i) {
      const attnhost_token_range& range = view.ranges[i];
      const int64_t lo = std::max(begin, range.local_begin), hi = std::min(begin + n, range.local_begin + range.length);
      if (hi > lo) layout_.add(range.global_begin + (lo - range.local_begin), hi - lo);
    }
    layout_.pad(n - layout_.local_tokens());
    return dense_shape(p, n);
  }
  UlyssesShape shape_of(const attnhost::Problem& p) {
    const std::string taper = p.get_string("taper");
    return {shape(p), u_, static_cast<int32_t>(p.get_int("head_groups")),
            taper == "on" ? Taper::on : taper == "off" ? Taper::off : Taper::automatic,
            p.get_string("exchange") == "packed"};
  }

  DenseReference reference_;
  int32_t u_;
  Plan plan_;
  attnhost::HostBuffer segments_;  // packed documents' segments, on the instance's device
  bool packed_;
  BlockCall documents_;
  attnhost::Layout layout_;
  UlyssesAttention attention_;
};

}  // namespace attncore::plugin
