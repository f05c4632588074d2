// ring: contiguous sharding, K/V passed around a ring (docs/VARIANTS.md). Rank r holds tokens
// [r*n, (r+1)*n) with n = ceil(S / P) (the last rank's tail is padding). Causal: blocks from later
// ranks are skipped, so rank P-1 works P times as much as rank 0 — the imbalance zigzag removes.
#include "attncore/plugin/dense_plans.h"
#include "attncore/plugin/ring_plugin.h"

namespace {

using attncore::plugin::BlockCall;

class Ring {
 public:
  static const attnhost_plugin_info& info() {
    static const attnhost_plugin_info info = {
        ATTNHOST_STRUCT_SIZE(attnhost_plugin_info, params),
        "ring",
        "1.0.0",
        "ring attention: contiguous shards, K/V blocks passed round a ring, overlapped, fp32 merges",
        {ATTNHOST_STRUCT_SIZE(attnhost_capabilities, head_dims), attncore::plugin::kRingDevices,
         attncore::plugin::kRingDtypesFp8,
         ATTNHOST_FEATURE_CAUSAL | ATTNHOST_FEATURE_NONCAUSAL | ATTNHOST_FEATURE_WINDOW | ATTNHOST_FEATURE_GQA |
             ATTNHOST_FEATURE_BACKWARD | ATTNHOST_FEATURE_DETERMINISTIC | ATTNHOST_FEATURE_FP8_HYBRID,
         1, 0, 0, nullptr},
        attncore::plugin::kNumRingParams,
        attncore::plugin::kRingParams,
    };
    return info;
  }

  static void validate(const attnhost::Problem&) {}  // the dense checks are all ring needs

  explicit Ring(const attnhost::Problem& p) : plan_(attncore::plugin::dense_mask(p), p->world_size) {
    plan_.add_block(layout_, p->rank);
    layout_.pad(plan_.block_tokens() - layout_.local_tokens());
  }

  const attnhost::Layout& layout() const { return layout_; }
  std::vector<BlockCall> calls(int rank, int source) const { return plan_.calls(rank, source); }

 private:
  attncore::plugin::ContiguousPlan plan_;
  attnhost::Layout layout_;
};

}  // namespace

ATTNHOST_EXPORT_PLUGIN(attncore::plugin::RingPlugin<Ring>)
