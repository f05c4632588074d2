// Where a schedule runs and how, from the problem and the plugin's parameters: built in one place
// (schedule_options) and handed to every schedule, libattncore's (ring, routed, ulysses) and the
// plugins' own (dilated, allgather).
#pragma once

#include "attncore/plugin/engine.h"

#include <attnhost/plugin.hpp>

#include <memory>

namespace attncore::plugin {

struct ScheduleOptions {
  attnhost::Host host;
  int rank = 0, world_size = 1;
  bool cuda = false;      // on the problem's GPU; else the CPU path
  bool cpu_fp64 = false;  // the CPU path accumulates in fp64 (parameter cpu_accumulate)
  bool overlap = true;    // communication on a stream of its own, under the compute (parameter overlap)
  EngineOptions engine;   // what serves the attention calls on a GPU (parameters engine and partials)

  std::unique_ptr<Engine> make_engine() const { return Engine::make(cuda, cpu_fp64, engine); }
};

// The options of problem `p`; a parameter the plugin does not take keeps the default above (the
// engine: native, exact partials).
ScheduleOptions schedule_options(const attnhost::Problem& p, attnhost::Host host);

}  // namespace attncore::plugin
