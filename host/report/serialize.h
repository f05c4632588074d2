// Records <-> JSON. One schema for results.json, results.jsonl, baselines and isolated cases.
#pragma once

#include "common/json.h"
#include "results/records.h"

namespace attnhost::report {

constexpr int kSchemaVersion = 1;

json::Value to_json(const CaseResult& c);
CaseResult case_from_json(const json::Value& v);   // throws on a malformed record
json::Value to_json(const Environment& e);
Environment environment_from_json(const json::Value& v);

}  // namespace attnhost::report
