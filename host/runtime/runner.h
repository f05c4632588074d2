// Runs cases: for each world size of a case, every rank creates the plugin's instance, fills its
// share of the deterministic data, times the passes, and takes part in the correctness check.
// One plain loop (nccl-tests' TimeTest): the same code on every rank, errors agreed on by all
// ranks after each phase so that one rank's failure ends the case on every rank.
#pragma once

#include "plugins/loaded_plugin.h"
#include "results/records.h"
#include "runtime/backend.h"
#include "suite/suite.h"

#include <functional>
#include <memory>
#include <string>

namespace attnhost {

struct RunnerOptions {
  bool trace = true;           // record one traced iteration per run
  std::function<void(const std::string&)> progress; // a line per finished world size (rank 0)
  std::function<void(const RunResult&)> on_run;      // each finished world size (rank 0)
};

// Runs one case at each of its world sizes. Never throws for anything a plugin or the device
// does: those end the run with a status and a one-line error.
CaseResult run_case(const suite::Case& c, const std::shared_ptr<const Plugin>& plugin, Backend& backend,
                    const RunnerOptions& options);

// Host-side checks of a case against the plugin's declared capabilities: "" or the reason.
std::string capability_mismatch(const suite::Case& c, const PluginDescription& d, DeviceKind device, int world_size);

}  // namespace attnhost
