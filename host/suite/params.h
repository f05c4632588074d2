// Plugin parameters in suites: [case.params.<plugin>] tables (or, for a case of one plugin, the
// parameters right in [case.params]), checked against each plugin's own schema: names with a
// did-you-mean, types, and the choices of string parameters. A list where the schema expects
// one value is a sweep (for an integer-list parameter, a list of lists). Internal.
#pragma once

#include "suite/problem_fields.h"

#include <toml++/toml.h>

#include <map>
#include <string>
#include <vector>

namespace attnhost::suite::detail {

using PluginParams = std::map<std::string, Settings>;  // plugin name -> its parameter settings

// The plugin's schema, or a failure at `where`: "unknown plugin 'rnig' (did you mean 'ring'?)".
const PluginSchema& find_plugin(const PluginCatalog& catalog, const std::string& name,
                                const SourceLocation& where);

// `case_plugins`: the plugins of the case; empty for [defaults.params], where a table may name
// any plugin of the catalog and parameters must sit in per-plugin tables.
PluginParams read_params(const toml::node& node, const std::string& table_name,
                         const std::vector<std::string>& case_plugins, const PluginCatalog& catalog);

// "" or what is wrong with `value` for `spec` (type and choices).
std::string check_param_value(const PluginSchema& plugin, const ParamSchema& spec, const ParamValue& value);

const ParamSchema* find_param(const PluginSchema& plugin, const std::string& name);

// A path parameter's value as the plugin gets it: absolute, a relative one taken from the folder of
// `written_in` (the file that wrote it; "" for the command line: the working directory).
std::string resolve_path(const std::string& value, const std::string& written_in);

} // namespace attnhost::suite::detail
