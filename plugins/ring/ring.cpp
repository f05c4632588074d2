// ring: contiguous sharding, K/V passed around a ring (VARIANTS.md). Rank r holds tokens
// [r*n, (r+1)*n) with n = ceil(S / P) (the last rank's tail is padding). Causal: blocks from later
// ranks are skipped, so rank P-1 works P times as much as rank 0 — the imbalance zigzag removes.
#include "attncore/plugin/ring_plugin.h"

namespace {

using attncore::plugin::BlockCall;
using attncore::plugin::DenseMask;

class Ring {
 public:
  static const attnhost_plugin_info& info() {
    static const attnhost_plugin_info info = {
        ATTNHOST_STRUCT_SIZE(attnhost_plugin_info, params),
        "ring",
        "1.0.0",
        "ring attention: contiguous shards, K/V blocks passed round a ring, overlapped, fp32 merges",
        {ATTNHOST_STRUCT_SIZE(attnhost_capabilities, head_dims), attncore::plugin::kRingDevices,
         attncore::plugin::kRingDtypes,
         ATTNHOST_FEATURE_CAUSAL | ATTNHOST_FEATURE_NONCAUSAL | ATTNHOST_FEATURE_WINDOW | ATTNHOST_FEATURE_GQA |
             ATTNHOST_FEATURE_BACKWARD | ATTNHOST_FEATURE_DETERMINISTIC,
         1, 0, 0, nullptr},
        attncore::plugin::kNumRingParams,
        attncore::plugin::kRingParams,
    };
    return info;
  }

  static void validate(const attnhost::Problem&) {}  // the dense checks are all ring needs

  explicit Ring(const attnhost::Problem& p)
      : seqlen_(p->seqlen_q), chunk_((p->seqlen_q + p->world_size - 1) / p->world_size),
        mask_(attncore::plugin::dense_mask(p)) {
    layout_.add(begin(p->rank), real(p->rank));
    layout_.pad(chunk_ - real(p->rank));
  }

  const attnhost::Layout& layout() const { return layout_; }

  std::vector<BlockCall> calls(int rank, int source) const {
    const int64_t q0 = begin(rank), k0 = begin(source);
    auto block = mask_.block(q0, q0 + real(rank), k0, k0 + real(source));
    if (block == DenseMask::Block::empty) return {};  // e.g. causal, a later rank's block
    return {{0, real(rank), 0, real(source), q0, k0, block == DenseMask::Block::partial}};
  }

 private:
  int64_t begin(int rank) const { return std::min(seqlen_, rank * chunk_); }
  int64_t real(int rank) const { return std::min(seqlen_, (rank + 1) * chunk_) - begin(rank); }

  int64_t seqlen_, chunk_;
  DenseMask mask_;
  attnhost::Layout layout_;
};

}  // namespace

ATTNHOST_EXPORT_PLUGIN(attncore::plugin::RingPlugin<Ring>)
