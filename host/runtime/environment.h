// What a result records about where it was measured.
#pragma once

#include "results/records.h"
#include "runtime/backend.h"

namespace attnhost {

Environment probe_environment(const Backend& backend);
std::string now_iso8601();
std::string now_compact();  // 20261122-031500, for result folders

}  // namespace attnhost
