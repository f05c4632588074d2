// dilated's lane plan (plugins/dilated/lanes.h), pure planning and so tested on its own: on the
// CPU the plugin runs on one lane, and only GPU runs reach the rest of the plan.
#include "lanes.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>

using dilated::LaneJob;
using dilated::plan_lanes;

namespace {

// LongNet's language-model patterns at S = 32768, pairs a batch entry and head up to a common
// factor: r = 1 first (it writes the dK/dV accumulators), all strided.
const std::vector<LaneJob> kLongNet = {
    {825, false, true}, {412, false, true}, {206, false, true}, {183, false, true}, {92, false, true}};

int64_t max_load(const std::vector<LaneJob>& jobs, const std::vector<int>& lane, int lanes) {
  std::vector<int64_t> load(lanes, 0);
  for (size_t j = 0; j < jobs.size(); ++j) load[lane[j]] += jobs[j].pairs;
  return *std::max_element(load.begin(), load.end());
}

}  // namespace

TEST_CASE("dilated: lanes: one lane puts every pattern on the compute stream") {
  const dilated::LanePlan p = plan_lanes(kLongNet, 0, 1);
  CHECK(p.forward == std::vector<int>(5, 0));
  CHECK(p.backward == std::vector<int>(5, 0));
}

TEST_CASE("dilated: lanes: longest first to the least loaded lane - the largest on the compute stream") {
  const dilated::LanePlan p = plan_lanes(kLongNet, 0, 3);
  CHECK(p.forward == std::vector<int>{0, 1, 2, 2, 2});
  // The writer alone first on lane 0; the strided patterns after it spread as a group of their own.
  CHECK(p.backward == std::vector<int>{0, 0, 1, 2, 2});
  // Longest processing time stays within one job of the mean load.
  const int64_t total = std::accumulate(kLongNet.begin(), kLongNet.end(), int64_t{0},
                                        [](int64_t s, const LaneJob& j) { return s + j.pairs; });
  CHECK(max_load(kLongNet, p.forward, 3) <= total / 3 + 825);
}

TEST_CASE("dilated: lanes: remote patterns take the last lane in both passes and weigh on it") {
  std::vector<LaneJob> jobs = kLongNet;
  jobs[4].remote = true;  // w = 32768 across two ranks: gathered, its keys exchanged
  jobs[4].strided = false;
  jobs[4].pairs = 900;    // heavier than any local pattern: the others avoid its lane
  const dilated::LanePlan p = plan_lanes(jobs, 0, 2);
  CHECK(p.forward[4] == 1);
  CHECK(p.backward[4] == 1);
  CHECK(p.backward[0] == 0);  // the writer
  CHECK(p.forward[0] == 0);   // the largest local pattern avoids the remote lane
  for (int lane : p.backward) CHECK((lane == 0 || lane == 1));
}

TEST_CASE("dilated: lanes: without a writer every pattern starts at once") {
  // (Gathered patterns, or strided ones that add into zeroed accumulators.)
  const std::vector<LaneJob> jobs = {{100, false, false}, {90, false, true}, {80, false, true}};
  const dilated::LanePlan p = plan_lanes(jobs, -1, 3);
  CHECK(p.backward == std::vector<int>{0, 1, 2});
  CHECK(p.forward == std::vector<int>{0, 1, 2});
}
