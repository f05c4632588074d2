// Which stream (lane) each pattern's calls go to in each pass. The patterns run on several streams
// at once so that one launch's last wave fills with the others' CTAs (docs/KERNELS.md, "Lanes"):
// longest processing time first, each pattern, most pairs first, to the lane with the least work
// so far. Lane 0 is the compute stream; with one rank the largest pattern lands there, and its low
// priority lets its many CTAs fill the gaps. Pure planning, no streams: DilatedAttention::schedule
// maps lanes onto streams and orders the work.
#pragma once

#include <cstdint>
#include <vector>

namespace dilated {

struct LaneJob {
  int64_t pairs = 0;     // (query, key) pairs on this rank: the work
  bool remote = false;   // its keys arrive from other ranks
  bool strided = false;  // adds into the local dK/dV accumulators (after the writer, if any)
};

struct LanePlan {
  std::vector<int> forward, backward;  // per job, a lane in [0, lanes)
};

// `writer`: the job that writes the local dK/dV accumulators (-1: none), on lane 0 in the backward
// and before every strided job; the backward's strided jobs are spread over the lanes as a group of
// their own, since they start once it is done. Remote jobs take the last lane in both passes: they
// wait there for the exchange and go first, so that their gradients' return leaves early.
LanePlan plan_lanes(const std::vector<LaneJob>& jobs, int writer, int lanes);

}  // namespace dilated
