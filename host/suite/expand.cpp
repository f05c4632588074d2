// Expanding a CaseSpec into Cases: presets (or the inline problem) x problem sweep points x
// plugins x parameter sweep points, in that nesting, so that the plugins run one problem side by
// side. Each problem is checked here, with the error placed where the offending value is written.
#include "suite/case_spec.h"

#include "suite/toml_reader.h"
#include "suite/varlen.h"

#include <attnhost/plugin.h>

#include <functional>

namespace attnhost::suite::detail {
namespace {

// More cases than this from one [[case]] is a runaway sweep, not a benchmark.
constexpr size_t kMaxCasesPerEntry = 100000;

// What a case's problem starts from: a preset, or nothing for an inline problem.
struct Base {
  std::string label;
  const Preset* preset = nullptr;
  SourceLocation where;  // where the suite names the preset (or the [[case]] header)
};

using Axes = std::vector<std::pair<std::string, const Setting*>>;

// Calls `visit` with one value per axis for every combination, the last axis varying fastest.
void for_each_combination(const Axes& axes, const std::function<void(const FieldValues&)>& visit) {
  std::vector<size_t> index(axes.size(), 0);
  while (true) {
    FieldValues point;
    for (size_t i = 0; i < axes.size(); ++i) point.emplace(axes[i].first, axes[i].second->values[index[i]]);
    visit(point);
    size_t axis = axes.size();
    while (axis > 0 && ++index[axis - 1] == axes[axis - 1].second->values.size()) index[--axis] = 0;
    if (axis == 0) return;
  }
}

Axes axes_of(const Settings& settings) {
  Axes axes;
  for (const auto& [key, setting] : settings) axes.emplace_back(key, &setting);
  return axes;
}

// Problem fields in canonical order, so that sweeps nest and ids read in one fixed order.
Axes problem_axes(const Settings& fields) {
  Axes axes;
  for (const std::string& key : problem_field_names())
    if (const auto found = fields.find(key); found != fields.end()) axes.emplace_back(key, &found->second);
  return axes;
}

size_t count_points(const Axes& axes) {
  size_t count = 1;
  for (const auto& [key, setting] : axes) count *= setting->values.size();
  return count;
}

std::vector<Base> bases_of(const CaseSpec& spec, const PresetLibrary& library) {
  if (spec.presets.empty()) return {{spec.name, nullptr, spec.where}};
  std::vector<Base> bases;
  for (const Named& named : spec.presets)
    bases.push_back({spec.name.empty() ? named.name : spec.name + "/" + named.name,
                     library.find(named.name), named.where});
  return bases;
}

SourceLocation blame(const CaseSpec& spec, const Base& base, const std::string& field) {
  if (const auto found = spec.scope.fields.find(field); found != spec.scope.fields.end())
    return found->second.where;
  if (field == "varlen" && spec.scope.varlen) return spec.scope.varlen_where;
  return base.where;
}

void require_inline_problem(const CaseSpec& spec) {
  for (const char* needed : {"heads", "head_dim"})
    if (!spec.scope.fields.count(needed))
      fail(spec.where, "case '" + spec.name + "' needs '" + needed + "' (or presets = [...])");
  if (!spec.scope.fields.count("seqlen") && !spec.scope.varlen)
    fail(spec.where, "case '" + spec.name + "' needs 'seqlen' or a [varlen] table (or presets = [...])");
}

// batch = "auto": as many sequences as fit the token budget (at least one), so that a sweep over
// lengths keeps the tokens of one step, and so the work per step, comparable.
int64_t resolve_batch(const CaseSpec& spec, const Base& base, const FieldValues& point, Problem& problem) {
  const auto batch = point.find("batch");
  const bool automatic = batch != point.end() && std::holds_alternative<std::string>(batch->second);
  const auto tokens = point.find("tokens");
  if (automatic && tokens == point.end())
    fail(blame(spec, base, "batch"), "batch = \"auto\" needs 'tokens' (the token budget of one step)");
  if (!automatic && tokens != point.end())
    fail(blame(spec, base, "tokens"), "'tokens' sizes the batch only with batch = \"auto\"");
  if (!automatic) return 0;
  const int64_t budget = std::get<int64_t>(tokens->second);
  problem.batch = std::max<int64_t>(1, budget / std::max<int64_t>(1, problem.seqlen_q));
  return budget;
}

struct ProblemPoint {
  Problem problem;
  int64_t tokens = 0;
  std::string id_suffix;
};

std::string problem_id_suffix(const CaseSpec& spec, const FieldValues& point) {
  const bool preset_case = !spec.presets.empty();
  std::string suffix;
  for (const std::string& key : problem_field_names()) {
    const auto setting = spec.scope.fields.find(key);
    if (setting == spec.scope.fields.end()) continue;
    if (setting->second.sweep || (preset_case && spec.own_fields.count(key)))
      suffix += "/" + key + "=" + format_value(point.at(key));
  }
  if (preset_case && spec.own_varlen) {
    const std::string& distribution = spec.scope.varlen->distribution;
    suffix += "/varlen=" + (distribution.empty() ? std::string("lengths") : distribution);
  }
  return suffix;
}

ProblemPoint build_problem(const CaseSpec& spec, const Base& base, const FieldValues& point) {
  ProblemPoint out;
  if (base.preset) out.problem = base.preset->problem;
  apply_fields(out.problem, point);
  if (spec.scope.varlen) {
    for (const char* packed_away : {"batch", "tokens", "seqlen", "seqlen_kv"})
      if (point.count(packed_away))
        fail(blame(spec, base, packed_away), "'" + std::string(packed_away) +
                                                 "' cannot be combined with 'varlen' (the lengths set the tokens)");
    apply_varlen(out.problem, *spec.scope.varlen);
  }
  out.tokens = resolve_batch(spec, base, point, out.problem);
  if (const auto issue = find_problem_issue(out.problem))
    fail(blame(spec, base, issue->field),
         issue->message + (base.preset ? " (preset '" + base.preset->name + "')" : ""));
  out.id_suffix = problem_id_suffix(spec, point);
  return out;
}

std::optional<ParamValue> coerce(const ParamValue& value, int32_t type) {
  if (type == ATTNHOST_PARAM_INT && std::holds_alternative<int64_t>(value)) return value;
  if (type == ATTNHOST_PARAM_FLOAT && std::holds_alternative<double>(value)) return value;
  if (type == ATTNHOST_PARAM_FLOAT && std::holds_alternative<int64_t>(value))
    return static_cast<double>(std::get<int64_t>(value));
  if (type == ATTNHOST_PARAM_BOOL && std::holds_alternative<bool>(value)) return value;
  if ((type == ATTNHOST_PARAM_STRING || type == ATTNHOST_PARAM_PATH) && std::holds_alternative<std::string>(value))
    return value;
  if (type == ATTNHOST_PARAM_INT_LIST && std::holds_alternative<std::vector<int64_t>>(value)) return value;
  return std::nullopt;
}

// A preset's parameters apply to the plugins that have them; the case's own override them.
Settings params_for(const CaseSpec& spec, const Base& base, const PluginSchema& plugin) {
  Settings settings;
  if (base.preset)
    for (auto& [key, value] : preset_params(*base.preset, plugin, base.where))
      settings[key] = Setting{{std::move(value)}, false, base.where};
  if (const auto own = spec.scope.params.find(plugin.name); own != spec.scope.params.end())
    for (const auto& [key, setting] : own->second) settings[key] = setting;
  return settings;
}

std::string params_id_suffix(const Settings& params, const FieldValues& point) {
  std::string suffix;
  for (const auto& [key, setting] : params)
    if (setting.sweep) suffix += "/" + key + "=" + format_value(point.at(key));
  return suffix;
}

Case make_case(const CaseSpec& spec, const Base& base, const ProblemPoint& problem,
               const std::string& plugin, const Settings& params, const FieldValues& param_point) {
  Case out;
  out.label = base.label;
  out.group = base.label;
  out.plugin = plugin;
  out.id = plugin + "/" + base.label + problem.id_suffix + params_id_suffix(params, param_point);
  out.problem = problem.problem;
  out.tokens = problem.tokens;
  out.machine_world_sizes = spec.scope.world_sizes.empty();
  if (!out.machine_world_sizes) out.world_sizes = spec.scope.world_sizes;
  out.params = param_point;
  out.timing = spec.scope.timing;
  out.check = spec.scope.check;
  out.data = spec.scope.data;
  out.where = spec.where;
  return out;
}

void require_bounded(const CaseSpec& spec, size_t bases, const Axes& problem, size_t param_points) {
  const size_t total = bases * count_points(problem) * spec.scope.plugins.size() * param_points;
  if (total > kMaxCasesPerEntry)
    fail(spec.where, "this case expands to " + std::to_string(total) + " cases (more than " +
                         std::to_string(kMaxCasesPerEntry) + "); narrow its sweeps");
}

} // namespace

std::vector<Case> expand_case(const CaseSpec& spec, const PresetLibrary& library,
                              const PluginCatalog& catalog) {
  if (spec.presets.empty()) require_inline_problem(spec);
  const std::vector<Base> bases = bases_of(spec, library);
  const Axes problem_sweep = problem_axes(spec.scope.fields);
  std::vector<Case> cases;
  for (const Base& base : bases) {
    for_each_combination(problem_sweep, [&](const FieldValues& point) {
      const ProblemPoint problem = build_problem(spec, base, point);
      for (const Named& plugin_name : spec.scope.plugins) {
        const PluginSchema& plugin = find_plugin(catalog, plugin_name.name, plugin_name.where);
        const Settings params = params_for(spec, base, plugin);
        const Axes param_sweep = axes_of(params);
        require_bounded(spec, bases.size(), problem_sweep, count_points(param_sweep));
        for_each_combination(param_sweep, [&](const FieldValues& param_point) {
          cases.push_back(make_case(spec, base, problem, plugin.name, params, param_point));
        });
      }
    });
  }
  return cases;
}

} // namespace attnhost::suite::detail

namespace attnhost::suite {

std::map<std::string, ParamValue> preset_params(const Preset& preset, const PluginSchema& plugin,
                                                const SourceLocation& where) {
  using namespace detail;
  std::map<std::string, ParamValue> out;
  for (const auto& [key, value] : preset.params) {
    const ParamSchema* schema = find_param(plugin, key);
    if (!schema) continue;
    std::optional<ParamValue> typed = coerce(value, schema->type);
    if (typed && schema->type == ATTNHOST_PARAM_PATH)  // from the presets file's folder
      typed = resolve_path(std::get<std::string>(*typed), preset.file);
    const std::string message = typed ? check_param_value(plugin, *schema, *typed)
                                      : "parameter '" + key + "' of plugin '" + plugin.name + "' has the wrong type";
    if (!message.empty()) fail(where, "preset '" + preset.name + "': " + message);
    out.emplace(key, *typed);
  }
  return out;
}

} // namespace attnhost::suite
