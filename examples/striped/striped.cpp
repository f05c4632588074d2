// striped: striped attention (Brandon et al., 2023) as a plugin built against an installed attnhost,
// on libattncore's ring (attnhost::attncore): the kernels, the ring, the merges and the checks come
// from the library, the schedule is this file.
//
// Token t lives on rank t mod P, so every rank holds tokens spread over the whole sequence and a
// causal ring is balanced without chunks. Rank r's local token i is global token i P + r. At the step
// that brings rank s's keys, query i sees key j (global j P + s) iff j P + s <= i P + r: j <= i when
// s <= r, j < i when s > r. That is one causal call per step, on local positions, whose keys sit one
// position later when s > r.
#include <attncore/plugin/ring_plugin.h>
#include <attncore/version.h>

#include <string>
#include <vector>

namespace {

using attncore::plugin::BlockCall;

class Striped {
 public:
  static const attnhost_plugin_info& info() {
    static const attnhost_plugin_info info = {
        ATTNHOST_STRUCT_SIZE(attnhost_plugin_info, params),
        "striped",
        "1.0.0",
        "striped ring attention: token t on rank t mod P, causal work balanced across ranks without chunks",
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
    // Built against one libattncore, loaded beside another: refuse in one line rather than misbehave.
    if (const std::string v = attncore::version_mismatch(); !v.empty()) fail(ATTNHOST_ERR_UNSUPPORTED, "striped: " + v);
    if (!p->causal) fail(ATTNHOST_ERR_UNSUPPORTED, "striped balances causal attention only (ring takes full attention)");
    if (p->seqlen_q % p->world_size != 0)
      fail(ATTNHOST_ERR_UNSUPPORTED, "sequence length " + std::to_string(p->seqlen_q) +
                                         " is not divisible by the world size (" + std::to_string(p->world_size) + ")");
  }

  explicit Striped(const attnhost::Problem& p) : tokens_(p->seqlen_q / p->world_size) {
    for (int64_t i = 0; i < tokens_; ++i) layout_.add(i * p->world_size + p->rank, 1);
  }

  const attnhost::Layout& layout() const { return layout_; }

  std::vector<BlockCall> calls(int rank, int source) const {
    BlockCall c{};
    c.q_begin = c.kv_begin = 0;
    c.q_end = c.kv_end = tokens_;
    c.q_pos0 = 0;
    c.kv_pos0 = source > rank ? 1 : 0;
    c.masked = true;
    return {c};
  }

 private:
  int64_t tokens_;
  attnhost::Layout layout_;
};

}  // namespace

ATTNHOST_EXPORT_PLUGIN(attncore::plugin::RingPlugin<Striped>)
