// Command-line overrides (applied to every case, then checked again) and the suite behind
// `attnhost compare P1 P2 --config NAME`.
#include "suite/params.h"
#include "suite/problem_fields.h"
#include "suite/settings.h"
#include "suite/toml_reader.h"

#include <attnhost/plugin.h>

#include <algorithm>
#include <set>
#include <sstream>

namespace attnhost::suite {
namespace detail {
namespace {

const SourceLocation kCommandLine{"command line"};

// ---- each flag's value alone -----------------------------------------------------------------

void require_flag_at_least(const char* flag, int64_t value, int64_t minimum) {
  if (value < minimum)
    fail(kCommandLine, std::string(flag) + " must be at least " + std::to_string(minimum) + ", got " +
                           std::to_string(value));
}

void require_choice_flag(const char* flag, const std::string& what, const std::string& value,
                         const std::vector<std::string>& choices) {
  const std::string message = choice_message(what, value, choices);
  if (!message.empty()) fail(kCommandLine, std::string(flag) + ": " + message);
}

void check_problem_flags(const Overrides& o) {
  if (o.batch) require_flag_at_least("--batch", *o.batch, 1);
  if (o.seqlen) require_flag_at_least("--seqlen", *o.seqlen, 1);
  if (o.heads) require_flag_at_least("--heads", *o.heads, 1);
  if (o.kv_heads) require_flag_at_least("--kv-heads", *o.kv_heads, 1);
  if (o.head_dim && (*o.head_dim < 8 || *o.head_dim % 8 != 0))
    fail(kCommandLine, "--head-dim must be a positive multiple of 8, got " + std::to_string(*o.head_dim));
  if (o.dtype) require_choice_flag("--dtype", "dtype", *o.dtype, dtype_names());
  if (o.grad_dtype) require_choice_flag("--grad-dtype", "grad_dtype", *o.grad_dtype, grad_dtype_names());
  if (o.window)
    for (int64_t side : {o.window->first, o.window->second})
      if (side < -1)
        fail(kCommandLine, "--window values must be -1 (unbounded) or at least 0, got " + std::to_string(side));
}

void check_run_flags(const Overrides& o) {
  if (o.world_sizes) {
    const std::string message = check_world_sizes(*o.world_sizes);
    if (!message.empty()) fail(kCommandLine, "--world-sizes: " + message);
  }
  if (o.timing_method) require_choice_flag("--timing-method", "timing method", *o.timing_method, timing_methods());
  if (o.warmup_runs) require_flag_at_least("--warmup-runs", *o.warmup_runs, 0);
  if (o.timing_runs) require_flag_at_least("--timing-runs", *o.timing_runs, 1);
  if (o.warmup_seconds && !(*o.warmup_seconds >= 0 && *o.warmup_seconds <= 600))
    fail(kCommandLine, "--warmup-seconds must be between 0 and 600, got " + format_number(*o.warmup_seconds));
  if (o.rounds) require_flag_at_least("--rounds", *o.rounds, 1);
  if (o.rounds && *o.rounds > kMaxRounds)
    fail(kCommandLine, "--rounds must be at most " + std::to_string(kMaxRounds) + ", got " + std::to_string(*o.rounds));
}

// ---- applying them to one case ---------------------------------------------------------------

// Replaces the "/key=..." part of an id, or appends one: an overridden case must not share its
// id (and so its baseline or --resume entry) with the case as the suite wrote it.
std::string with_id_part(const std::string& id, const std::string& key, const std::string& value) {
  const std::string marker = "/" + key + "=";
  const size_t at = id.find(marker);
  if (at == std::string::npos) return id + marker + value;
  const size_t end = id.find('/', at + 1);
  return id.substr(0, at) + marker + value + (end == std::string::npos ? "" : id.substr(end));
}

std::string without_id_part(const std::string& id, const std::string& key) {
  const std::string marker = "/" + key + "=";
  const size_t at = id.find(marker);
  if (at == std::string::npos) return id;
  const size_t end = id.find('/', at + 1);
  return id.substr(0, at) + (end == std::string::npos ? "" : id.substr(end));
}

FieldValues problem_overrides(const Overrides& o) {
  FieldValues values;
  if (o.batch) values["batch"] = *o.batch;
  if (o.seqlen) values["seqlen"] = *o.seqlen;
  if (o.heads) values["heads"] = int64_t{*o.heads};
  if (o.kv_heads) values["kv_heads"] = int64_t{*o.kv_heads};
  if (o.head_dim) values["head_dim"] = int64_t{*o.head_dim};
  if (o.dtype) values["dtype"] = *o.dtype;
  if (o.grad_dtype) values["grad_dtype"] = *o.grad_dtype;
  if (o.causal) values["causal"] = *o.causal;
  if (o.window) values["window"] = std::vector<int64_t>{o.window->first, o.window->second};
  return values;
}

void override_problem(Case& c, const FieldValues& values) {
  if (values.empty()) return;
  if (c.problem.varlen && (values.count("batch") || values.count("seqlen")))
    fail(kCommandLine, "--batch and --seqlen do not apply to case '" + c.id +
                           "': its packed lengths come from its [varlen] table");
  apply_fields(c.problem, values);
  if (values.count("batch")) {
    c.tokens = 0;  // a fixed batch replaces batch = "auto"
    c.id = without_id_part(c.id, "tokens");
  } else if (c.tokens > 0) {
    c.problem.batch = std::max<int64_t>(1, c.tokens / c.problem.seqlen_q);
  }
  for (const std::string& key : problem_field_names())
    if (const auto found = values.find(key); found != values.end())
      c.id = with_id_part(c.id, key, format_value(found->second));
  if (const auto issue = find_problem_issue(c.problem))
    fail(kCommandLine, issue->message + " (case '" + c.id + "')");
}

void override_run(Case& c, const Overrides& o) {
  if (o.world_sizes) {
    c.world_sizes = *o.world_sizes;
    c.machine_world_sizes = false;
  }
  if (o.timing_method) c.timing.method = *o.timing_method;
  if (o.warmup_runs) c.timing.warmup_runs = *o.warmup_runs;
  if (o.timing_runs) c.timing.timing_runs = *o.timing_runs;
  if (o.warmup_seconds) c.timing.warmup_seconds = *o.warmup_seconds;
  if (o.rounds) c.timing.rounds = *o.rounds;
}

// A --param value, typed by the parameter's schema: 3, 0.5, true, fp32 (or "fp32"), 1,2,3 (or [1, 2, 3]).
ParamValue parse_param_text(const std::string& flag, const std::string& text, const PluginSchema& plugin,
                            const ParamSchema& spec) {
  const auto bad = [&](const char* expected) {
    fail(kCommandLine, flag + ": parameter '" + spec.name + "' of plugin '" + plugin.name + "' takes " + expected +
                           ", got '" + text + "'");
  };
  const auto integer = [&](const std::string& item) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size()) bad(spec.type == ATTNHOST_PARAM_INT ? "an integer" : "a list of integers, e.g. 1,2,4");
    return v;
  };
  ParamValue value;
  switch (spec.type) {
    case ATTNHOST_PARAM_INT: value = integer(text); break;
    case ATTNHOST_PARAM_FLOAT:
      try {
        size_t used = 0;
        value = std::stod(text, &used);
        if (used != text.size()) bad("a number");
      } catch (const std::exception&) {
        bad("a number");
      }
      break;
    case ATTNHOST_PARAM_BOOL:
      if (text != "true" && text != "false") bad("true or false");
      value = text == "true";
      break;
    case ATTNHOST_PARAM_STRING:
    case ATTNHOST_PARAM_PATH:
      value = text.size() >= 2 && text.front() == '"' && text.back() == '"' ? text.substr(1, text.size() - 2) : text;
      if (spec.type == ATTNHOST_PARAM_PATH) value = resolve_path(std::get<std::string>(value), "");  // the working directory
      break;
    case ATTNHOST_PARAM_INT_LIST: {
      std::string inner = text;
      if (inner.size() >= 2 && inner.front() == '[' && inner.back() == ']') inner = inner.substr(1, inner.size() - 2);
      std::vector<int64_t> list;
      std::stringstream items(inner);
      for (std::string item; std::getline(items, item, ',');) {
        item.erase(0, item.find_first_not_of(' '));
        item.erase(item.find_last_not_of(' ') + 1);
        list.push_back(integer(item));
      }
      value = std::move(list);
      break;
    }
    default: bad("a value of a type this host does not know");
  }
  const std::string message = check_param_value(plugin, spec, value);
  if (!message.empty()) fail(kCommandLine, flag + ": " + message);
  return value;
}

void override_params(Suite& suite, const std::vector<std::pair<std::string, std::string>>& params,
                     const PluginCatalog& catalog) {
  for (const auto& [name, text] : params) {
    const std::string flag = "--param " + name + "=" + text;
    std::set<std::string> plugins;
    bool used = false;
    for (Case& c : suite.cases) {
      plugins.insert(c.plugin);
      const PluginSchema& plugin = find_plugin(catalog, c.plugin, kCommandLine);
      const ParamSchema* spec = find_param(plugin, name);
      if (!spec) continue;
      const ParamValue value = parse_param_text(flag, text, plugin, *spec);
      c.params[name] = value;
      c.id = with_id_part(c.id, name, format_value(value));
      used = true;
    }
    if (!used)
      fail(kCommandLine, flag + ": no plugin of this run (" +
                             join_choices(std::vector<std::string>(plugins.begin(), plugins.end()), "and") +
                             ") has a parameter '" + name + "' (attnhost list plugins -v shows them)");
  }
}

// Overrides can make sweep points equal (--seqlen over a seqlen sweep): run each case once.
void drop_repeated_cases(std::vector<Case>& cases) {
  std::set<std::string> seen;
  std::erase_if(cases, [&](const Case& c) { return !seen.insert(c.id).second; });
}

// ---- compare ---------------------------------------------------------------------------------

std::vector<std::string> preset_or_set(const std::string& name, const PresetLibrary& library) {
  if (library.find(name)) return {name};
  if (const auto set = library.sets.find(name); set != library.sets.end()) return set->second;
  std::vector<std::string> known;
  for (const Preset& preset : library.presets) known.push_back(preset.name);
  for (const auto& [set, members] : library.sets) known.push_back(set);
  require_choice({"--config"}, "preset or preset set", name, known);
  return {};
}

// The suite a compare runs, as TOML text: it goes through the same parser as a suite file, and
// results record a suite that reproduces the run.
std::string compare_suite_text(const std::vector<std::string>& plugins, const std::string& config) {
  toml::array plugin_names, presets;
  for (const std::string& plugin : plugins) plugin_names.push_back(plugin);
  presets.push_back(config);
  std::string versus;
  for (const std::string& plugin : plugins) versus += (versus.empty() ? "" : " vs ") + plugin;
  toml::table entry{{"plugins", plugin_names}, {"presets", presets}};
  toml::table root{{"name", "compare"},
                   {"description", versus + " on " + config},
                   {"case", toml::array{entry}}};
  std::ostringstream text;
  text << root << "\n";
  return text.str();
}

} // namespace
} // namespace detail

void apply_overrides(Suite& suite, const Overrides& overrides, const PluginCatalog& plugins) {
  using namespace detail;
  check_problem_flags(overrides);
  check_run_flags(overrides);
  const FieldValues values = problem_overrides(overrides);
  for (Case& c : suite.cases) {
    override_problem(c, values);
    override_run(c, overrides);
  }
  override_params(suite, overrides.params, plugins);
  drop_repeated_cases(suite.cases);
}

Suite make_compare_suite(const std::vector<std::string>& plugins, const std::string& preset,
                         const PresetLibrary& library, const PluginCatalog& catalog) {
  using namespace detail;
  if (plugins.empty()) fail(kCommandLine, "compare needs at least one plugin");
  for (size_t i = 0; i < plugins.size(); ++i) {
    find_plugin(catalog, plugins[i], kCommandLine);
    if (std::find(plugins.begin(), plugins.begin() + i, plugins[i]) != plugins.begin() + i)
      fail(kCommandLine, "plugin '" + plugins[i] + "' is named twice");
  }
  preset_or_set(preset, library);
  return parse_suite(compare_suite_text(plugins, preset), "compare", library, catalog);
}

} // namespace attnhost::suite
