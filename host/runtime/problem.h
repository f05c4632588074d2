// A case's problem in the ABI's terms, with the storage that the C struct points into.
#pragma once

#include "plugins/loaded_plugin.h"
#include "suite/suite.h"

#include <attnhost/plugin.h>

#include <string>
#include <vector>

namespace attnhost {

class ProblemBinding {
 public:
  // Completes the case's plugin parameters with the schema's defaults; throws UsageError on a
  // default the host cannot parse.
  ProblemBinding(const suite::Case& c, const PluginDescription& plugin, int32_t device_type);

  // The problem as rank `rank` of `world_size` sees it; its pointers stay valid while this
  // binding lives (rank threads each take their own copy).
  // The problem as rank `rank` of `world_size` sees it; local_size 0: every rank on one machine.
  attnhost_problem at(int rank, int world_size, int local_rank = 0, int local_size = 0) const;

  int32_t dtype() const { return problem_.dtype; }
  int64_t tokens_q() const { return problem_.batch * problem_.seqlen_q; }  // global query tokens
  const attnhost_problem& raw() const { return problem_; }

 private:
  attnhost_problem problem_{};
  std::vector<int64_t> cu_q_, cu_kv_;
  std::vector<attnhost_param_value> values_;
  std::vector<std::string> names_, strings_;
  std::vector<std::vector<int64_t>> lists_;
};

int32_t dtype_from_name(const std::string& name); // "bf16" -> ATTNHOST_DTYPE_BF16, 0 when unknown

}  // namespace attnhost
