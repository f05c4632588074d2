// --isolate: each case runs in a child process of the host (the same executable, started fresh,
// so no CUDA state crosses a fork). A plugin that segfaults, aborts or hangs past the time limit
// costs its own case only: the world sizes it finished are kept, the rest are CRASHED (with the
// signal and the child's last output) or TIMEOUT, and the suite goes on.
#pragma once

#include "results/records.h"
#include "suite/suite.h"

#include <functional>
#include <string>
#include <vector>

namespace attnhost {

struct IsolateOptions {
  std::vector<std::string> child_args;  // options the child needs: plugin folders, device, ...
  double timeout_seconds = 600;          // per case, for all its world sizes
};

CaseResult run_case_isolated(const suite::Case& c, const IsolateOptions& options);

// The hidden command the child runs: reads the case from `case_file`, appends one JSON line per
// finished world size to `result_file`. `run` executes the case in this process and reports each
// finished world size as a case record holding that one run.
using RunOne = std::function<void(const suite::Case&, const std::function<void(const CaseResult&)>& finished)>;
int isolated_child(const std::string& case_file, const std::string& result_file, const RunOne& run);

}  // namespace attnhost
