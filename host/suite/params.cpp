#include "suite/params.h"

#include "suite/toml_reader.h"

#include <attnhost/plugin.h>

#include <algorithm>
#include <filesystem>

namespace attnhost::suite::detail {
namespace {

std::string param_name(const PluginSchema& plugin, const ParamSchema& spec) {
  return "parameter '" + spec.name + "' of plugin '" + plugin.name + "'";
}

std::string expected_type(int32_t type) {
  switch (type) {
    case ATTNHOST_PARAM_INT: return "an integer";
    case ATTNHOST_PARAM_FLOAT: return "a number";
    case ATTNHOST_PARAM_BOOL: return "a boolean";
    case ATTNHOST_PARAM_STRING: return "a string";
    case ATTNHOST_PARAM_PATH: return "a string (a file's path)";
    case ATTNHOST_PARAM_INT_LIST: return "an array of integers";
  }
  return "a value of type " + std::to_string(type);
}

std::vector<std::string> names_of(const std::vector<ParamSchema>& params) {
  std::vector<std::string> names;
  for (const ParamSchema& spec : params) names.push_back(spec.name);
  return names;
}

[[noreturn]] void fail_unknown_param(const PluginSchema& plugin, const std::string& name,
                                     const SourceLocation& where) {
  const std::vector<std::string> known = names_of(plugin.params);
  const std::string suggestion = suggest_key(name, known);
  std::string message = "plugin '" + plugin.name + "' has no parameter '" + name + "'";
  if (!suggestion.empty()) message += " (did you mean '" + suggestion + "'?)";
  else if (known.empty()) message += " (it takes none)";
  else message += " (its parameters: " + join_choices(known, "and") + ")";
  fail(where, message);
}

ParamValue read_param_value(const toml::node& node, const PluginSchema& plugin, const ParamSchema& spec) {
  const auto wrong_type = [&](const toml::node& at, const std::string& got) {
    fail(location_of(at, location_of(node)),
         param_name(plugin, spec) + " must be " + expected_type(spec.type) + ", got " + got);
  };
  ParamValue value;
  switch (spec.type) {
    case ATTNHOST_PARAM_INT:
      if (!node.is_integer()) wrong_type(node, type_name(node));
      value = node.as_integer()->get();
      break;
    case ATTNHOST_PARAM_FLOAT:
      if (node.is_integer()) value = static_cast<double>(node.as_integer()->get());
      else if (node.is_floating_point()) value = node.as_floating_point()->get();
      else wrong_type(node, type_name(node));
      break;
    case ATTNHOST_PARAM_BOOL:
      if (!node.is_boolean()) wrong_type(node, type_name(node));
      value = node.as_boolean()->get();
      break;
    case ATTNHOST_PARAM_STRING:
      if (!node.is_string()) wrong_type(node, type_name(node));
      value = node.as_string()->get();
      break;
    case ATTNHOST_PARAM_PATH:
      if (!node.is_string()) wrong_type(node, type_name(node));
      value = resolve_path(node.as_string()->get(), location_of(node).file);
      break;
    case ATTNHOST_PARAM_INT_LIST: {
      if (!node.is_array()) wrong_type(node, type_name(node));
      std::vector<int64_t> list;
      for (const toml::node& element : *node.as_array()) {
        if (!element.is_integer()) wrong_type(element, "an element of type " + type_name(element));
        list.push_back(element.as_integer()->get());
      }
      value = std::move(list);
      break;
    }
    default:
      fail(location_of(node), param_name(plugin, spec) + " has a type this host does not know (" +
                                  std::to_string(spec.type) + ")");
  }
  const std::string message = check_param_value(plugin, spec, value);
  if (!message.empty()) fail(location_of(node), message);
  return value;
}

bool is_param_sweep(const toml::node& node, const ParamSchema& spec) {
  if (!node.is_array()) return false;
  if (spec.type != ATTNHOST_PARAM_INT_LIST) return true;
  const toml::array& array = *node.as_array();
  return !array.empty() && array.get(0)->is_array();
}

Setting read_param_setting(const toml::node& node, const PluginSchema& plugin, const ParamSchema& spec) {
  Setting setting;
  setting.where = location_of(node);
  if (!is_param_sweep(node, spec)) {
    setting.values.push_back(read_param_value(node, plugin, spec));
    return setting;
  }
  const toml::array& array = *node.as_array();
  if (array.empty()) fail(setting.where, param_name(plugin, spec) + ": the sweep is empty");
  for (const toml::node& element : array) setting.values.push_back(read_param_value(element, plugin, spec));
  reject_repeated_values(setting, array, param_name(plugin, spec));
  setting.sweep = true;
  return setting;
}

void read_param_into(Settings& settings, const toml::key& key, const toml::node& node,
                     const PluginSchema& plugin, const SourceLocation& fallback) {
  const std::string name(key.str());
  const ParamSchema* spec = find_param(plugin, name);
  if (!spec) fail_unknown_param(plugin, name, location_of(key, fallback));
  if (settings.count(name))
    fail(location_of(key, fallback), param_name(plugin, *spec) + " is given twice");
  settings.emplace(name, read_param_setting(node, plugin, *spec));
}

void read_plugin_table(PluginParams& params, const toml::key& key, const toml::node& node,
                       const std::string& table_name, const std::vector<std::string>& case_plugins,
                       const PluginCatalog& catalog) {
  const std::string plugin_name(key.str());
  const SourceLocation where = location_of(key, location_of(node));
  const PluginSchema& plugin = find_plugin(catalog, plugin_name, where);
  if (!case_plugins.empty() &&
      std::find(case_plugins.begin(), case_plugins.end(), plugin_name) == case_plugins.end())
    fail(where, "[" + table_name + "." + plugin_name + "] names a plugin this case does not run (it runs " +
                    join_choices(case_plugins, "and") + ")");
  Settings& settings = params[plugin_name];
  for (const auto& [param_key, param_node] : entries_in_file_order(*node.as_table()))
    read_param_into(settings, *param_key, *param_node, plugin, where);
}

} // namespace

const ParamSchema* find_param(const PluginSchema& plugin, const std::string& name) {
  for (const ParamSchema& spec : plugin.params)
    if (spec.name == name) return &spec;
  return nullptr;
}

const PluginSchema& find_plugin(const PluginCatalog& catalog, const std::string& name,
                                const SourceLocation& where) {
  std::vector<std::string> names;
  for (const PluginSchema& plugin : catalog) {
    if (plugin.name == name) return plugin;
    names.push_back(plugin.name);
  }
  const std::string suggestion = did_you_mean(name, names);
  std::string message = "unknown plugin '" + name + "'";
  if (!suggestion.empty()) message += " (did you mean '" + suggestion + "'?)";
  else if (names.empty()) message += " (no plugins are loaded)";
  else message += " (loaded: " + join_choices(names, "and") + ")";
  fail(where, message);
}

std::string resolve_path(const std::string& value, const std::string& written_in) {
  namespace fs = std::filesystem;
  if (value.empty()) return value;
  fs::path path(value);
  if (path.is_relative()) path = fs::path(written_in).parent_path() / path;
  return fs::absolute(path).lexically_normal().string();
}

std::string check_param_value(const PluginSchema& plugin, const ParamSchema& spec, const ParamValue& value) {
  if (spec.type != ATTNHOST_PARAM_STRING || spec.choices.empty()) return "";
  const std::string& text = std::get<std::string>(value);
  if (std::find(spec.choices.begin(), spec.choices.end(), text) != spec.choices.end()) return "";
  const std::string suggestion = did_you_mean(text, spec.choices);
  return param_name(plugin, spec) + " must be one of " + join_choices(spec.choices) + ", got '" + text +
         "'" + (suggestion.empty() ? "" : " (did you mean '" + suggestion + "'?)");
}

PluginParams read_params(const toml::node& node, const std::string& table_name,
                         const std::vector<std::string>& case_plugins, const PluginCatalog& catalog) {
  const toml::table& table = read_table(node, "params");
  const SourceLocation where = location_of(node);
  PluginParams params;
  for (const auto& [key, value] : entries_in_file_order(table)) {
    if (value->is_table()) {
      read_plugin_table(params, *key, *value, table_name, case_plugins, catalog);
      continue;
    }
    const SourceLocation key_where = location_of(*key, where);
    if (case_plugins.size() != 1)
      fail(key_where, "parameter '" + std::string(key->str()) + "' in [" + table_name + "] must go in a [" +
                          table_name + ".<plugin>] table" +
                          (case_plugins.empty() ? "" : " when a case runs several plugins"));
    read_param_into(params[case_plugins.front()], *key, *value,
                    find_plugin(catalog, case_plugins.front(), key_where), key_where);
  }
  return params;
}

} // namespace attnhost::suite::detail
