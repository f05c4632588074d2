// A suite file: name, description, [defaults], [[case]]s and [outputs]; parsed, checked and
// expanded completely before anything runs.
#include "suite/case_spec.h"
#include "suite/settings.h"
#include "suite/toml_reader.h"

#include <algorithm>
#include <map>

namespace attnhost::suite {
namespace detail {
namespace {

const std::vector<std::string> kTopLevelKeys = {"name", "description", "defaults", "case", "outputs"};

// Keys people put at the top level that belong in [defaults] or a [[case]]: say where they go
// rather than only that they are unknown.
void reject_misplaced_keys(const toml::table& root, const SourceLocation& file_start) {
  const std::vector<std::string> scoped = scope_keys();
  for (const auto& [key, node] : entries_in_file_order(root)) {
    const std::string name(key->str());
    if (std::find(scoped.begin(), scoped.end(), name) != scoped.end())
      fail(location_of(*key, file_start),
           "unknown top-level key '" + name + "' (it belongs in [defaults] or in a [[case]])");
  }
  reject_unknown_keys(root, kTopLevelKeys, "at the top level", file_start);
}

std::string stem_of(const std::string& file_name) {
  return std::filesystem::path(file_name).stem().string();
}

void require_unique_ids(const std::vector<Case>& cases) {
  std::map<std::string, const Case*> seen;
  for (const Case& c : cases) {
    const auto [first, inserted] = seen.emplace(c.id, &c);
    if (!inserted)
      fail(c.where, "duplicate case id '" + c.id + "' (first from the case at " + first->second->where.str() +
                        "); give one of the cases a distinct 'name'");
  }
}

std::vector<Case> read_cases(const toml::table& root, const Scope& defaults, const PresetLibrary& library,
                             const PluginCatalog& catalog, const SourceLocation& file_start) {
  const toml::node* entries = root.get("case");
  if (!entries) fail(file_start, "the suite has no [[case]] (nothing to run)");
  if (!entries->is_array())
    fail(location_of(*entries, file_start), "'case' must be an array of tables ([[case]]), got " +
                                                type_name(*entries));
  std::vector<Case> cases;
  for (const toml::node& entry : *entries->as_array()) {
    const CaseSpec spec = read_case(entry, defaults, library, catalog);
    for (Case& c : expand_case(spec, library, catalog)) cases.push_back(std::move(c));
  }
  if (cases.empty()) fail(location_of(*entries, file_start), "the suite has no [[case]] (nothing to run)");
  require_unique_ids(cases);
  return cases;
}

} // namespace
} // namespace detail

Suite parse_suite(const std::string& text, const std::string& file_name, const PresetLibrary& library,
                  const PluginCatalog& plugins) {
  using namespace detail;
  const SourceLocation file_start{file_name, 1, 1};
  const toml::table root = parse_toml(text, file_name);
  reject_misplaced_keys(root, file_start);
  Suite suite;
  suite.path = file_name;
  suite.text = text;
  suite.name = stem_of(file_name);
  if (const toml::node* name = root.get("name")) suite.name = read_string(*name, "name");
  if (const toml::node* description = root.get("description"))
    suite.description = read_string(*description, "description");
  const Scope defaults = root.contains("defaults") ? read_defaults(*root.get("defaults"), library, plugins)
                                                   : Scope{};
  suite.cases = read_cases(root, defaults, library, plugins, file_start);
  if (const toml::node* outputs = root.get("outputs")) suite.outputs = read_outputs(*outputs);
  return suite;
}

Suite load_suite(const std::filesystem::path& file, const PresetLibrary& library,
                 const PluginCatalog& plugins) {
  Suite suite = parse_suite(detail::read_text_file(file), file.string(), library, plugins);
  suite.path = file;
  return suite;
}

} // namespace attnhost::suite
