// The problem fields a preset, [defaults] or a [[case]] may write: reading them (one value or a
// sweep), checking each value where it is written, applying them to a Problem, and checking a
// whole Problem (validate_problem). Internal to the suite library.
#pragma once

#include "suite/suite.h"

#include <toml++/toml.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace attnhost::suite::detail {

// A field or plugin parameter as a suite writes it: one value, or the points of a sweep.
struct Setting {
  std::vector<ParamValue> values;
  bool sweep = false;  // written as a list or a named range: its value goes into each case id
  SourceLocation where;
};
using Settings = std::map<std::string, Setting>;  // by field or parameter name

// Fails at the second occurrence of a value a sweep lists twice (it would make two equal cases).
void reject_repeated_values(const Setting& setting, const toml::array& array, const std::string& what);

// The scalar problem fields in canonical order: the nesting order of sweeps (first outermost)
// and the order of key=value parts in case ids. "tokens" is the budget of batch = "auto".
const std::vector<std::string>& problem_field_names();

// Reads the problem fields present in `table` (other keys are the caller's). With `allow_sweeps`
// a list (window: a list of [left, right]) is a sweep, seqlen may name a range of `library`, and
// batch may be "auto"; a preset is one problem and allows none of that.
Settings read_problem_fields(const toml::table& table, const PresetLibrary& library,
                             bool allow_sweeps, const SourceLocation& fallback);

// Sets one field. seqlen also sets seqlen_kv where the two were equal, heads also sets kv_heads
// where the two were equal: overriding the length of a self-attention preset keeps it
// self-attention, overriding the heads of an MHA preset keeps it MHA. batch = "auto" and tokens
// are resolved by the caller (they need the final seqlen).
void apply_field(Problem& problem, const std::string& key, const ParamValue& value);

// Applies one value per field in canonical order (seqlen before seqlen_kv, heads before kv_heads).
using FieldValues = std::map<std::string, ParamValue>;
void apply_fields(Problem& problem, const FieldValues& values);

// The first thing wrong with a problem and the field to blame for it.
struct ProblemIssue {
  std::string field;  // a key of problem_field_names() or "varlen"
  std::string message;
};
std::optional<ProblemIssue> find_problem_issue(const Problem& problem);

// How a value appears in a case id: 4096, fp16, true, 0.125, 512,0.
std::string format_value(const ParamValue& value);

const std::vector<std::string>& dtype_names();
const std::vector<std::string>& grad_dtype_names();  // what grad_dtype takes: fp8_e5m2

} // namespace attnhost::suite::detail
