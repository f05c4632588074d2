#include "attncore/plugin/schedule.h"

namespace attncore::plugin {

ScheduleOptions schedule_options(const attnhost::Problem& p, attnhost::Host host) {
  ScheduleOptions o;
  o.host = o.engine.host = host;
  o.rank = p->rank;
  o.world_size = p->world_size;
  o.cuda = p->device_type == ATTNHOST_DEVICE_CUDA;
  if (p.has("cpu_accumulate")) o.cpu_fp64 = p.get_string("cpu_accumulate") == "fp64";
  if (p.has("overlap")) o.overlap = p.get_bool("overlap");
  if (p.has("engine")) o.engine.choice = engine_choice(p.get_string("engine"));
  if (p.has("partials")) o.engine.dtype_partials = p.get_string("partials") == "dtype";
  return o;
}

}  // namespace attncore::plugin
