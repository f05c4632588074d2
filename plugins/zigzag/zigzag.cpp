// zigzag: the balanced causal ring (VARIANTS.md). The sequence is cut into 2P chunks of
// c = S / (2P); rank r holds chunks r and 2P-1-r, so every rank has one early and one late chunk
// and does the same work at every step:
//   step 0 (its own block): each local chunk attends itself causally, the late one also the early one;
//     the early chunk comes first locally as in the sequence, so that is causal attention over the
//     local order: one call (positions 0..2c-1 stand for the global ones: a causal mask compares
//     positions only by their order, and zigzag takes no window);
//   a block from an earlier rank: both local chunks attend its first chunk, in full;
//   a block from a later rank: the late local chunk attends both of its chunks, in full.
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
         attncore::plugin::kRingDtypes,
         ATTNHOST_FEATURE_CAUSAL | ATTNHOST_FEATURE_GQA | ATTNHOST_FEATURE_BACKWARD | ATTNHOST_FEATURE_DETERMINISTIC,
         1, 0, 0, nullptr},
        attncore::plugin::kNumRingParams,
        attncore::plugin::kRingParams,
    };
    return info;
  }

  static void validate(const attnhost::Problem& p) {
    using attnhost::fail;
    if (!p->causal) fail(ATTNHOST_ERR_UNSUPPORTED, "zigzag balances causal attention only (use ring for full attention)");
    if (p->window_left >= 0 || p->window_right >= 0)
      fail(ATTNHOST_ERR_UNSUPPORTED, "zigzag takes no sliding window (use ring)");
    if (p->seqlen_q % (2 * p->world_size) != 0)
      fail(ATTNHOST_ERR_UNSUPPORTED, "sequence length " + std::to_string(p->seqlen_q) +
                                         " is not divisible by 2 x world size (" + std::to_string(2 * p->world_size) + ")");
  }

  explicit Zigzag(const attnhost::Problem& p) : chunk_(p->seqlen_q / (2 * p->world_size)), world_(p->world_size) {
    layout_.add(early(p->rank), chunk_);
    layout_.add(late(p->rank), chunk_);
  }

  const attnhost::Layout& layout() const { return layout_; }

  std::vector<BlockCall> calls(int rank, int source) const {
    const int64_t c = chunk_;
    if (source == rank) return {{0, 2 * c, 0, 2 * c, 0, 0, true}};
    if (source < rank) return {{0, 2 * c, 0, c, early(rank), early(source), false}};
    return {{c, 2 * c, 0, 2 * c, late(rank), early(source), false}};
  }

 private:
  int64_t early(int rank) const { return rank * chunk_; }
  int64_t late(int rank) const { return (2 * int64_t{world_} - 1 - rank) * chunk_; }

  int64_t chunk_;
  int world_;
  attnhost::Layout layout_;
};

}  // namespace

ATTNHOST_EXPORT_PLUGIN(attncore::plugin::RingPlugin<Zigzag>)
