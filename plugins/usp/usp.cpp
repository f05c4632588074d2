// usp: the 2-D hybrid of Ulysses and ring attention (docs/VARIANTS.md; USP). The world is
// P / u groups of u consecutive ranks: all-to-alls inside a group (one machine's links), a ring of
// K/V across the groups (zigzag-balanced when causal) over the group's heads. u = P is ulysses,
// u = 1 is zigzag (or ring, without a causal mask). Packed documents run where one group holds
// every rank (as ulysses).
#include "attncore/plugin/ulysses_plugin.h"

#include <algorithm>
#include <numeric>

namespace {

class Usp {
 public:
  static const attnhost_plugin_info& info() {
    static const attnhost_plugin_info info = {
        ATTNHOST_STRUCT_SIZE(attnhost_plugin_info, params),
        "usp",
        "1.0.0",
        "2-D hybrid: Ulysses all-to-alls inside groups of ulysses_degree ranks, a zigzag ring across the groups",
        {ATTNHOST_STRUCT_SIZE(attnhost_capabilities, head_dims), attncore::plugin::kRingDevices,
         attncore::plugin::kRingDtypesFp8,
         ATTNHOST_FEATURE_CAUSAL | ATTNHOST_FEATURE_NONCAUSAL | ATTNHOST_FEATURE_WINDOW | ATTNHOST_FEATURE_GQA |
             ATTNHOST_FEATURE_VARLEN | ATTNHOST_FEATURE_BACKWARD | ATTNHOST_FEATURE_DETERMINISTIC,
         1, 0, 0, nullptr},
        attncore::plugin::kNumUspParams,
        attncore::plugin::kUlyssesParams.data(),
    };
    return info;
  }
  // Asked for (the whole world when it is smaller), or the ranks of one machine, as far as they
  // divide the world and cut the heads.
  static int32_t ulysses_degree(const attnhost::Problem& p) {
    if (const int64_t asked = p.get_int("ulysses_degree"); asked != 0)
      return static_cast<int32_t>(std::min<int64_t>(asked, p->world_size));
    int32_t u = std::gcd(p->local_size, p->world_size);
    while (u > 1 && (p->heads_q % u != 0 || (p->heads_kv % u != 0 && u % p->heads_kv != 0))) --u;
    while (p->world_size % u != 0) --u;
    return u;
  }
};

}  // namespace

ATTNHOST_EXPORT_PLUGIN(attncore::plugin::UlyssesPlugin<Usp>)
