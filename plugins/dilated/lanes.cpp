#include "lanes.h"

#include <algorithm>

namespace dilated {

namespace {

// Each job of `group`, most pairs first, to the lane with the least load (the lowest on a tie).
void assign(std::vector<size_t> group, const std::vector<LaneJob>& jobs, std::vector<int64_t> load,
            std::vector<int>& lane) {
  std::stable_sort(group.begin(), group.end(), [&](size_t a, size_t b) { return jobs[a].pairs > jobs[b].pairs; });
  for (size_t j : group) {
    const int l = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    lane[j] = l;
    load[l] += jobs[j].pairs;
  }
}

}  // namespace

LanePlan plan_lanes(const std::vector<LaneJob>& jobs, int writer, int lanes) {
  LanePlan plan;
  plan.forward.assign(jobs.size(), 0);
  plan.backward.assign(jobs.size(), 0);
  if (lanes <= 1) return plan;
  std::vector<size_t> local, at_once, after_writer;
  int64_t remote = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (jobs[j].remote) {
      remote += jobs[j].pairs;
      plan.forward[j] = plan.backward[j] = lanes - 1;
      continue;
    }
    local.push_back(j);
    if (static_cast<int>(j) == writer) continue;  // backward lane 0
    (jobs[j].strided && writer >= 0 ? after_writer : at_once).push_back(j);
  }
  std::vector<int64_t> load(lanes, 0);
  load[lanes - 1] = remote;
  assign(local, jobs, load, plan.forward);
  if (writer >= 0) load[0] += jobs[writer].pairs;
  assign(at_once, jobs, load, plan.backward);
  load.assign(lanes, 0);
  load[lanes - 1] = remote;
  assign(after_writer, jobs, load, plan.backward);  // once the writer is done
  return plan;
}

}  // namespace dilated
