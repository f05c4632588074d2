// Reading [defaults] and [[case]] tables into CaseSpecs.
#include "suite/case_spec.h"

#include "suite/settings.h"
#include "suite/toml_reader.h"
#include "suite/varlen.h"

#include <algorithm>
#include <cctype>

namespace attnhost::suite::detail {
namespace {

// Fields a [varlen] table replaces: the packed input's batch and length come from its lengths.
const std::vector<std::string> kFieldsSetByVarlen = {"batch", "tokens", "seqlen", "seqlen_kv"};

std::vector<std::string> case_keys() {
  std::vector<std::string> keys = {"name", "presets"};
  for (const std::string& key : scope_keys()) keys.push_back(key);
  return keys;
}

std::vector<Named> read_plugins(const toml::node& node, const PluginCatalog& catalog) {
  std::vector<Named> plugins;
  for (auto& [name, where] : read_names(node, "plugins")) {
    find_plugin(catalog, name, where);
    for (const Named& earlier : plugins)
      if (earlier.name == name) fail(where, "plugin '" + name + "' is listed twice");
    plugins.push_back({std::move(name), std::move(where)});
  }
  if (plugins.empty()) fail(location_of(node), "'plugins' must name at least one plugin");
  return plugins;
}

std::vector<std::string> names_of(const std::vector<Named>& named) {
  std::vector<std::string> names;
  for (const Named& item : named) names.push_back(item.name);
  return names;
}

// A preset, or a set of presets (expanded in place), each with where the suite named it.
std::vector<Named> read_presets(const toml::node& node, const PresetLibrary& library) {
  std::vector<std::string> known;
  for (const Preset& preset : library.presets) known.push_back(preset.name);
  for (const auto& [set, members] : library.sets) known.push_back(set);
  std::vector<Named> presets;
  for (auto& [name, where] : read_names(node, "presets")) {
    require_choice(where, "preset or preset set", name, known);
    const auto set = library.sets.find(name);
    const std::vector<std::string> members = set != library.sets.end() ? set->second
                                                                        : std::vector<std::string>{name};
    for (const std::string& member : members) {
      for (const Named& earlier : presets)
        if (earlier.name == member) fail(where, "preset '" + member + "' is listed twice");
      presets.push_back({member, where});
    }
  }
  if (presets.empty()) fail(location_of(node), "'presets' must name at least one preset");
  return presets;
}

void read_case_name(const toml::node& node, CaseSpec& spec) {
  spec.name = read_string(node, "name");
  const bool safe = !spec.name.empty() && std::all_of(spec.name.begin(), spec.name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
  // The name becomes part of case ids and file names: keep it to a portable alphabet.
  if (!safe)
    fail(location_of(node), "'name' may hold letters, digits, '_', '-' and '.', got \"" + spec.name + "\"");
}

void merge_params(PluginParams& into, const PluginParams& overriding) {
  for (const auto& [plugin, settings] : overriding)
    for (const auto& [key, setting] : settings) into[plugin][key] = setting;
}

// Problem fields and varlen written in `table` replace inherited ones; a [varlen] table and the
// fields it sets cannot both be written in one table.
void read_problem(const toml::table& table, const SourceLocation& where, const PresetLibrary& library,
                  Scope& scope, Settings& written) {
  written = read_problem_fields(table, library, /*allow_sweeps=*/true, where);
  const toml::node* varlen = table.get("varlen");
  if (varlen) {
    for (const std::string& field : kFieldsSetByVarlen)
      if (written.count(field))
        fail(written.at(field).where,
             "'" + field + "' cannot be combined with 'varlen' (the lengths set the tokens)");
    for (const std::string& field : kFieldsSetByVarlen) scope.fields.erase(field);
    scope.varlen = read_varlen(*varlen);
    scope.varlen_where = location_of(*varlen, where);
  } else if (written.count("seqlen") || written.count("seqlen_kv")) {
    scope.varlen.reset();
  }
  for (const auto& [key, setting] : written) scope.fields[key] = setting;
}

// Everything but the problem and the parameters (which need the plugins first).
void read_run_settings(const toml::table& table, const std::string& prefix, const PluginCatalog& catalog,
                       Scope& scope) {
  if (const toml::node* plugins = table.get("plugins")) scope.plugins = read_plugins(*plugins, catalog);
  if (const toml::node* sizes = table.get("world_sizes")) scope.world_sizes = read_world_sizes(*sizes);
  if (const toml::node* timing = table.get("timing")) read_timing(*timing, prefix + ".timing", scope.timing);
  if (const toml::node* check = table.get("check")) read_check(*check, prefix + ".check", scope.check);
  if (const toml::node* data = table.get("data")) read_data(*data, prefix + ".data", scope.data);
}

} // namespace

std::vector<std::string> scope_keys() {
  std::vector<std::string> keys = {"plugins", "world_sizes", "timing", "check", "data", "params", "varlen"};
  for (const std::string& field : problem_field_names()) keys.push_back(field);
  return keys;
}

Scope read_defaults(const toml::node& node, const PresetLibrary& library, const PluginCatalog& catalog) {
  const toml::table& table = read_table(node, "defaults");
  const SourceLocation where = location_of(node);
  reject_unknown_keys(table, scope_keys(), "in [defaults]", where);
  Scope scope;
  read_run_settings(table, "defaults", catalog, scope);
  Settings written;
  read_problem(table, where, library, scope, written);
  if (const toml::node* params = table.get("params"))
    scope.params = read_params(*params, "defaults.params", {}, catalog);
  return scope;
}

CaseSpec read_case(const toml::node& node, const Scope& defaults, const PresetLibrary& library,
                   const PluginCatalog& catalog) {
  if (!node.is_table())
    fail(location_of(node), "'case' must be an array of tables ([[case]]), got an element of type " +
                                type_name(node));
  const toml::table& table = *node.as_table();
  CaseSpec spec;
  spec.where = location_of(node);
  reject_unknown_keys(table, case_keys(), "in [[case]]", spec.where);
  spec.scope = defaults;
  if (const toml::node* name = table.get("name")) read_case_name(*name, spec);
  if (const toml::node* presets = table.get("presets")) {
    spec.presets = read_presets(*presets, library);
    // A preset is a whole problem: [defaults] problem fields fill inline cases only.
    spec.scope.fields.clear();
    spec.scope.varlen.reset();
  }
  read_run_settings(table, "case", catalog, spec.scope);
  if (spec.scope.plugins.empty())
    fail(spec.where, "the case names no plugin: add plugins = [...] here or in [defaults]");
  read_problem(table, spec.where, library, spec.scope, spec.own_fields);
  spec.own_varlen = table.contains("varlen");
  if (const toml::node* params = table.get("params"))
    merge_params(spec.scope.params, read_params(*params, "case.params", names_of(spec.scope.plugins), catalog));
  if (spec.presets.empty() && spec.scope.fields.empty() && !spec.scope.varlen)
    fail(spec.where, "the case has no problem: add presets = [...] or problem fields "
                     "(seqlen, heads, head_dim, ...)");
  if (spec.presets.empty() && spec.name.empty())
    fail(spec.where, "a case without presets needs a 'name' (it labels the case's results)");
  return spec;
}

} // namespace attnhost::suite::detail
