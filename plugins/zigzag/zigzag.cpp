// zigzag: the balanced causal ring (docs/VARIANTS.md). The sequence is cut into 2P chunks; rank r
// holds chunks r and 2P-1-r, so every rank has one early and one late chunk and does the same work
// at every step (attncore/plugin/dense_plans.h, ZigzagPlan, says which calls). A causal sliding
// window is taken too: chunks the window does not reach are skipped, and only the keys it reaches
// travel.
#include "attncore/plugin/dense_plans.h"
#include "attncore/plugin/ring_plugin.h"

namespace {

using attncore::plugin::BlockCall;

class Zigzag {
 public:
  static const attnhost_plugin_info& info() {
    static const attnhost_plugin_info info = {
        ATTNHOST_STRUCT_SIZE(attnhost_plugin_info, params),
        "zigzag",
        "1.0.0",
        "zigzag ring attention: two chunks per rank (r and 2P-1-r), causal work balanced across ranks",
        {ATTNHOST_STRUCT_SIZE(attnhost_capabilities, head_dims), attncore::plugin::kRingDevices,
         attncore::plugin::kRingDtypesFp8,
         ATTNHOST_FEATURE_CAUSAL | ATTNHOST_FEATURE_WINDOW | ATTNHOST_FEATURE_GQA | ATTNHOST_FEATURE_BACKWARD |
             ATTNHOST_FEATURE_DETERMINISTIC | ATTNHOST_FEATURE_FP8_HYBRID,
         1, 0, 0, nullptr},
        attncore::plugin::kNumJoinedRingParams,
        attncore::plugin::kRingParams,
    };
    return info;
  }

  static void validate(const attnhost::Problem& p) {
    using attnhost::fail;
    if (!p->causal) fail(ATTNHOST_ERR_UNSUPPORTED, "zigzag balances causal attention only (use ring for full attention)");
    if (p->seqlen_q % (2 * p->world_size) != 0)
      fail(ATTNHOST_ERR_UNSUPPORTED, "sequence length " + std::to_string(p->seqlen_q) +
                                         " is not divisible by 2 x world size (" + std::to_string(2 * p->world_size) + ")");
  }

  explicit Zigzag(const attnhost::Problem& p) : plan_(attncore::plugin::dense_mask(p), p->world_size) { plan_.add_block(layout_, p->rank); }

  const attnhost::Layout& layout() const { return layout_; }
  std::vector<BlockCall> calls(int rank, int source) const { return plan_.calls(rank, source); }
  attnhost::Layout block(int member) const {
    attnhost::Layout l;
    plan_.add_block(l, member);
    return l;
  }

 private:
  attncore::plugin::ZigzagPlan plan_;
  attnhost::Layout layout_;
};

}  // namespace

ATTNHOST_EXPORT_PLUGIN(attncore::plugin::RingPlugin<Zigzag>)
