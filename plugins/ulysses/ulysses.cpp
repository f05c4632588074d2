// ulysses: DeepSpeed-Ulysses context parallelism (docs/VARIANTS.md). Rank r holds a contiguous
// piece of the sequence; an all-to-all gives each rank every token of Hq / P query heads (and their
// kv heads), which attend in one call of the core over the whole sequence, any mask; an all-to-all
// returns O and LSE. Packed documents are one call with a segment a document. The exchanges go
// head group by head group under the attention (attncore/plugin/ulysses.h says how).
#include "attncore/plugin/ulysses_plugin.h"

namespace {

class Ulysses {
 public:
  static const attnhost_plugin_info& info() {
    static const attnhost_plugin_info info = {
        ATTNHOST_STRUCT_SIZE(attnhost_plugin_info, params),
        "ulysses",
        "1.0.0",
        "Ulysses all-to-all: sequence shards become head shards, full-length attention on a rank's heads",
        {ATTNHOST_STRUCT_SIZE(attnhost_capabilities, head_dims), attncore::plugin::kRingDevices,
         attncore::plugin::kRingDtypesFp8,
         ATTNHOST_FEATURE_CAUSAL | ATTNHOST_FEATURE_NONCAUSAL | ATTNHOST_FEATURE_WINDOW | ATTNHOST_FEATURE_GQA |
             ATTNHOST_FEATURE_VARLEN | ATTNHOST_FEATURE_BACKWARD | ATTNHOST_FEATURE_DETERMINISTIC,
         1, 0, 0, nullptr},
        attncore::plugin::kNumUlyssesParams,
        attncore::plugin::kUlyssesParams.data(),
    };
    return info;
  }
  static int32_t ulysses_degree(const attnhost::Problem& p) { return p->world_size; }
};

}  // namespace

ATTNHOST_EXPORT_PLUGIN(attncore::plugin::UlyssesPlugin<Ulysses>)
