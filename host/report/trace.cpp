#include "report/render.h"

#include "common/json.h"

namespace attnhost::report {

std::string chrome_trace(const std::vector<CaseResult>& cases) {
  // Each (case, world size) is its own process, so its ranks line up as threads on one time axis
  // that starts at its traced iteration; sort indices keep the suite's order in the viewer.
  json::Array events;
  int pid = 0;
  for (const CaseResult& c : cases)
    for (const RunResult& r : c.runs) {
      if (r.trace.empty()) continue;
      ++pid;
      const std::string process = c.spec.id + " ws=" + std::to_string(r.world_size);
      events.push_back(json::Object{{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 0},
                                    {"args", json::Object{{"name", process}}}});
      events.push_back(json::Object{{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"tid", 0},
                                    {"args", json::Object{{"sort_index", pid}}}});
      for (int rank = 0; rank < r.world_size; ++rank) {
        events.push_back(json::Object{{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", rank},
                                      {"args", json::Object{{"name", "rank " + std::to_string(rank)}}}});
        events.push_back(json::Object{{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", pid}, {"tid", rank},
                                      {"args", json::Object{{"sort_index", rank}}}});
      }
      for (const TraceEvent& e : r.trace)
        events.push_back(json::Object{{"name", e.name}, {"cat", e.category}, {"ph", "X"}, {"pid", pid},
                                      {"tid", e.rank}, {"ts", e.start_us}, {"dur", e.duration_us},
                                      {"args", json::Object{{"case", c.spec.id}, {"world_size", r.world_size}}}});
    }
  json::Value doc = json::Object{{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  return doc.dump() + "\n";
}

}  // namespace attnhost::report
