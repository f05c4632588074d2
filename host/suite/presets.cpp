// configs/presets.toml ([presets.NAME] problems and [sets]) and configs/ranges.toml ([ranges]).
#include "suite/params.h"
#include "suite/problem_fields.h"
#include "suite/toml_reader.h"
#include "suite/varlen.h"

#include <algorithm>
#include <set>

namespace attnhost::suite {
namespace detail {
namespace {

std::vector<std::string> preset_keys() {
  std::vector<std::string> keys = {"description", "varlen", "params"};
  for (const std::string& field : problem_field_names())
    if (field != "tokens") keys.push_back(field);  // a preset has a fixed batch
  return keys;
}

// A preset's plugin parameters are not tied to one plugin (a preset may imply, say, a block size
// to whichever plugin has one), so they are read by their TOML type alone.
ParamValue read_untyped_param(const toml::node& node, const std::string& key) {
  if (node.is_integer()) return node.as_integer()->get();
  if (node.is_floating_point()) return node.as_floating_point()->get();
  if (node.is_boolean()) return node.as_boolean()->get();
  if (node.is_string()) return node.as_string()->get();
  if (node.is_array()) return read_integer_list(node, key);
  fail(location_of(node), "'" + key + "' must be an integer, number, boolean, string or array of integers, got " +
                              type_name(node));
}

// The field a preset must have for `issue`, or the preset's header when it lacks the field.
SourceLocation blame(const Settings& fields, const std::string& field, const SourceLocation& preset) {
  const auto found = fields.find(field);
  return found != fields.end() ? found->second.where : preset;
}

void require_complete(const Preset& preset, const Settings& fields, const SourceLocation& where) {
  for (const char* needed : {"heads", "head_dim"})
    if (!fields.count(needed)) fail(where, "preset '" + preset.name + "' needs '" + needed + "'");
  if (!fields.count("seqlen") && !preset.problem.varlen)
    fail(where, "preset '" + preset.name + "' needs 'seqlen' (or a [varlen] table)");
  if (const auto issue = find_problem_issue(preset.problem))
    fail(blame(fields, issue->field, where), issue->message);
}

Preset read_preset(const std::string& name, const toml::node& node, const PresetLibrary& library) {
  const toml::table& table = read_table(node, name);
  const SourceLocation where = location_of(node);
  reject_unknown_keys(table, preset_keys(), "in [presets." + name + "]", where);
  Preset preset;
  preset.name = name;
  preset.file = where.file;
  if (const toml::node* description = table.get("description"))
    preset.description = read_string(*description, "description");
  const Settings fields = read_problem_fields(table, library, /*allow_sweeps=*/false, where);
  FieldValues values;
  for (const auto& [key, setting] : fields) values.emplace(key, setting.values.front());
  apply_fields(preset.problem, values);
  if (const toml::node* varlen = table.get("varlen")) {
    for (const char* packed_away : {"batch", "seqlen", "seqlen_kv"})
      if (fields.count(packed_away))
        fail(fields.at(packed_away).where, "'" + std::string(packed_away) +
                                               "' cannot be combined with 'varlen' (the lengths set the tokens)");
    apply_varlen(preset.problem, read_varlen(*varlen));
  }
  if (const toml::node* params = table.get("params"))
    for (const auto& [key, value] : entries_in_file_order(read_table(*params, "params")))
      preset.params.emplace(std::string(key->str()), read_untyped_param(*value, std::string(key->str())));
  require_complete(preset, fields, where);
  return preset;
}

std::vector<std::string> preset_names(const PresetLibrary& library) {
  std::vector<std::string> names;
  for (const Preset& preset : library.presets) names.push_back(preset.name);
  return names;
}

void read_sets(const toml::node& node, PresetLibrary& library) {
  const std::vector<std::string> presets = preset_names(library);
  for (const auto& [key, value] : entries_in_file_order(read_table(node, "sets"))) {
    const std::string set_name(key->str());
    if (library.find(set_name))
      fail(location_of(*key), "set '" + set_name + "' has the name of a preset");
    std::vector<std::string>& members = library.sets[set_name];
    for (const auto& [member, where] : read_names(*value, set_name)) {
      require_choice(where, "preset", member, presets);
      members.push_back(member);
    }
    if (members.empty()) fail(location_of(*value), "set '" + set_name + "' is empty");
  }
}

void load_preset_file(const std::filesystem::path& file, PresetLibrary& library) {
  const std::string name = file.string();
  const toml::table root = parse_toml(read_text_file(file), name);
  reject_unknown_keys(root, {"presets", "sets"}, "in " + file.filename().string(), {name, 1, 1});
  if (const toml::node* presets = root.get("presets"))
    for (const auto& [key, value] : entries_in_file_order(read_table(*presets, "presets")))
      library.presets.push_back(read_preset(std::string(key->str()), *value, library));
  if (const toml::node* sets = root.get("sets")) read_sets(*sets, library);
}

void load_range_file(const std::filesystem::path& file, PresetLibrary& library) {
  const std::string name = file.string();
  const toml::table root = parse_toml(read_text_file(file), name);
  reject_unknown_keys(root, {"ranges"}, "in " + file.filename().string(), {name, 1, 1});
  const toml::node* ranges = root.get("ranges");
  if (!ranges) return;
  for (const auto& [key, value] : entries_in_file_order(read_table(*ranges, "ranges"))) {
    const std::string range_name(key->str());
    std::vector<int64_t> lengths = read_integer_list(*value, range_name);
    if (lengths.empty()) fail(location_of(*value), "range '" + range_name + "' is empty");
    for (size_t i = 0; i < lengths.size(); ++i)
      if (lengths[i] < 1)
        fail(location_of(*value->as_array()->get(i)),
             "range '" + range_name + "' entries must be at least 1, got " + std::to_string(lengths[i]));
    library.ranges.emplace(range_name, std::move(lengths));
  }
}

} // namespace
} // namespace detail

const Preset* PresetLibrary::find(const std::string& name) const {
  for (const Preset& preset : presets)
    if (preset.name == name) return &preset;
  return nullptr;
}

PresetLibrary load_presets(const std::filesystem::path& configs_dir) {
  PresetLibrary library;
  // Ranges first: they are plain data that presets and suites may refer to.
  detail::load_range_file(configs_dir / "ranges.toml", library);
  detail::load_preset_file(configs_dir / "presets.toml", library);
  return library;
}

} // namespace attnhost::suite
