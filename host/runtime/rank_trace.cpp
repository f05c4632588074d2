#include "runtime/rank_state.h"

#include <sstream>

namespace attnhost {

void trace_iteration(RankState& state, Tracer& tracer, RunResult& result) {
  state.env.group.barrier();
  void* s = state.env.device.stream(0);
  tracer.start(s);
  int32_t f = tracer.begin("forward", "host", s);
  state.attempt([&] { state.forward(); });
  tracer.end(f, s);
  if (state.gradients) {
    int32_t b = tracer.begin("backward", "host", s);
    state.attempt([&] { state.backward(); });
    tracer.end(b, s);
  }
  std::vector<TraceEvent> events;
  state.attempt([&] { events = tracer.stop(); });
  state.all_ok();
  std::ostringstream out;
  for (const TraceEvent& e : events)
    out << e.rank << '\t' << e.category << '\t' << e.start_us << '\t' << e.duration_us << '\t' << e.name << '\n';
  for (const std::string& rank_events : state.env.group.gather(out.str())) {
    std::istringstream in(rank_events);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream f(line);
      TraceEvent e;
      f >> e.rank;
      f.ignore(1);
      std::getline(f, e.category, '\t');
      f >> e.start_us >> e.duration_us;
      f.ignore(1);
      std::getline(f, e.name);
      result.trace.push_back(std::move(e));
    }
  }
}

}  // namespace attnhost
