#include "suite/toml_reader.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>
#include <map>

namespace attnhost::suite {

std::string SourceLocation::str() const {
  // Without a position (an error about the command line, a file that cannot be read) the file
  // alone, or nothing.
  if (line == 0) return file;
  return file + ":" + std::to_string(line) + ":" + std::to_string(column);
}

namespace detail {
namespace {

SourceLocation region_location(const toml::source_region& region, const SourceLocation& fallback) {
  if (region.begin.line == 0) return fallback;
  SourceLocation where;
  where.file = region.path ? *region.path : fallback.file;
  where.line = region.begin.line;
  where.column = region.begin.column;
  return where;
}

// "an integer", "a string": the article a type name takes in a message.
std::string with_article(std::string_view type) {
  const bool vowel = !type.empty() && std::string_view("aeiou").find(type[0]) != std::string_view::npos;
  return std::string(vowel ? "an " : "a ") + std::string(type);
}

[[noreturn]] void fail_type(const toml::node& node, const std::string& key, std::string_view expected) {
  fail(location_of(node), "'" + key + "' must be " + with_article(expected) + ", got " + type_name(node));
}

// Names other tools (and the ring-attention benchmark scripts) use for the same things.
const std::map<std::string, std::string>& key_aliases() {
  static const std::map<std::string, std::string> aliases = {
      {"batch_size", "batch"},        {"bs", "batch"},
      {"seq_len", "seqlen"},          {"seqlen_q", "seqlen"},
      {"max_seqlen", "seqlen"},       {"sequence_length", "seqlen"},
      {"seq_length", "seqlen"},       {"seqlens", "seqlen"},
      {"num_heads", "heads"},         {"nheads", "heads"},
      {"n_heads", "heads"},           {"heads_q", "heads"},
      {"num_kv_heads", "kv_heads"},   {"heads_kv", "kv_heads"},
      {"n_kv_heads", "kv_heads"},     {"nheads_kv", "kv_heads"},
      {"hdim", "head_dim"},           {"head_size", "head_dim"},
      {"dim", "head_dim"},            {"window_size", "window"},
      {"scale", "softmax_scale"},     {"plugin", "plugins"},
      {"preset", "presets"},          {"config", "presets"},
      {"configs", "presets"},         {"world_size", "world_sizes"},
      {"gpus", "world_sizes"},        {"num_gpus", "world_sizes"},
      {"cases", "case"},              {"format", "formats"},
      {"output_dir", "dir"},          {"warmup", "warmup_runs"},
      {"runs", "timing_runs"},        {"iterations", "timing_runs"},
      {"timing_method", "method"},    {"dist", "distribution"},
  };
  return aliases;
}

} // namespace

SourceLocation location_of(const toml::node& node, const SourceLocation& fallback) {
  return region_location(node.source(), fallback);
}

SourceLocation location_of(const toml::key& key, const SourceLocation& fallback) {
  return region_location(key.source(), fallback);
}

void fail(const SourceLocation& where, const std::string& message) {
  const std::string prefix = where.str();
  throw SuiteError(prefix.empty() ? message : prefix + ": " + message);
}

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code error;
    const bool exists = std::filesystem::exists(path, error);
    fail({path.string(), 1, 1}, std::string("cannot read the file (") +
                                    (exists ? "permission denied or not a file" : "no such file") + ")");
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

toml::table parse_toml(const std::string& text, const std::string& file_name) {
  try {
    return toml::parse(text, file_name);
  } catch (const toml::parse_error& error) {
    const toml::source_position& begin = error.source().begin;
    fail({file_name, begin.line, begin.column}, std::string(error.description()));
  }
}

std::string type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "string";
    case toml::node_type::integer: return "integer";
    case toml::node_type::floating_point: return "float";
    case toml::node_type::boolean: return "boolean";
    case toml::node_type::array: return "array";
    case toml::node_type::table: return "table";
    case toml::node_type::date: return "date";
    case toml::node_type::time: return "time";
    case toml::node_type::date_time: return "date-time";
    case toml::node_type::none: break;
  }
  return "nothing";
}

std::vector<Entry> entries_in_file_order(const toml::table& table) {
  std::vector<Entry> entries;
  for (auto&& [key, node] : table) entries.emplace_back(&key, &node);
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    const auto& pa = a.first->source().begin;
    const auto& pb = b.first->source().begin;
    return std::tie(pa.line, pa.column) < std::tie(pb.line, pb.column);
  });
  return entries;
}

std::string suggest_key(const std::string& unknown, const std::vector<std::string>& allowed) {
  const auto alias = key_aliases().find(unknown);
  if (alias != key_aliases().end() &&
      std::find(allowed.begin(), allowed.end(), alias->second) != allowed.end())
    return alias->second;
  return did_you_mean(unknown, allowed);
}

void reject_unknown_keys(const toml::table& table, const std::vector<std::string>& allowed,
                         const std::string& where_text, const SourceLocation& fallback) {
  for (const auto& [key, node] : entries_in_file_order(table)) {
    if (std::find(allowed.begin(), allowed.end(), key->str()) != allowed.end()) continue;
    std::string message = "unknown key '" + std::string(key->str()) + "' " + where_text;
    const std::string suggestion = suggest_key(std::string(key->str()), allowed);
    if (!suggestion.empty()) message += " (did you mean '" + suggestion + "'?)";
    fail(location_of(*key, location_of(table, fallback)), message);
  }
}

int64_t read_integer(const toml::node& node, const std::string& key) {
  if (!node.is_integer()) fail_type(node, key, "integer");
  return node.as_integer()->get();
}

double read_number(const toml::node& node, const std::string& key) {
  if (node.is_integer()) return static_cast<double>(node.as_integer()->get());
  if (!node.is_floating_point()) fail_type(node, key, "number");
  return node.as_floating_point()->get();
}

bool read_bool(const toml::node& node, const std::string& key) {
  if (!node.is_boolean()) fail_type(node, key, "boolean");
  return node.as_boolean()->get();
}

std::string read_string(const toml::node& node, const std::string& key) {
  if (!node.is_string()) fail_type(node, key, "string");
  return node.as_string()->get();
}

const toml::table& read_table(const toml::node& node, const std::string& key) {
  if (!node.is_table()) fail_type(node, key, "table");
  return *node.as_table();
}

const toml::array& read_array(const toml::node& node, const std::string& key) {
  if (!node.is_array()) fail_type(node, key, "array");
  return *node.as_array();
}

std::vector<int64_t> read_integer_list(const toml::node& node, const std::string& key) {
  if (!node.is_array()) fail_type(node, key, "array of integers");
  std::vector<int64_t> values;
  for (const toml::node& element : *node.as_array()) {
    if (!element.is_integer())
      fail(location_of(element, location_of(node)),
           "'" + key + "' must be an array of integers, got an element of type " + type_name(element));
    values.push_back(element.as_integer()->get());
  }
  return values;
}

std::vector<std::pair<std::string, SourceLocation>> read_names(const toml::node& node,
                                                               const std::string& key) {
  std::vector<std::pair<std::string, SourceLocation>> names;
  if (node.is_string()) {
    names.emplace_back(node.as_string()->get(), location_of(node));
    return names;
  }
  if (!node.is_array()) fail_type(node, key, "string or an array of strings");
  for (const toml::node& element : *node.as_array()) {
    if (!element.is_string())
      fail(location_of(element, location_of(node)),
           "'" + key + "' must be an array of strings, got an element of type " + type_name(element));
    names.emplace_back(element.as_string()->get(), location_of(element, location_of(node)));
  }
  return names;
}

void require_at_least(const toml::node& node, const std::string& key, int64_t value, int64_t minimum) {
  if (value < minimum)
    fail(location_of(node), "'" + key + "' must be at least " + std::to_string(minimum) + ", got " +
                                std::to_string(value));
}

void require_positive(const toml::node& node, const std::string& key, double value) {
  if (!(value > 0)) fail(location_of(node), "'" + key + "' must be positive, got " + format_number(value));
}

std::string format_number(double value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

void read_into(const toml::table& table, const std::string& key, int& target, int64_t minimum) {
  const toml::node* node = table.get(key);
  if (!node) return;
  const int64_t value = read_integer(*node, key);
  require_at_least(*node, key, value, minimum);
  if (value > 1'000'000'000) fail(location_of(*node), "'" + key + "' is too large: " + std::to_string(value));
  target = static_cast<int>(value);
}

void read_into(const toml::table& table, const std::string& key, bool& target) {
  if (const toml::node* node = table.get(key)) target = read_bool(*node, key);
}

std::string join_choices(const std::vector<std::string>& choices, std::string_view last_word) {
  std::string text;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i > 0) text += i + 1 == choices.size() ? " " + std::string(last_word) + " " : ", ";
    text += choices[i];
  }
  return text;
}

std::string choice_message(const std::string& what, const std::string& value,
                           const std::vector<std::string>& choices) {
  if (std::find(choices.begin(), choices.end(), value) != choices.end()) return "";
  const std::string suggestion = did_you_mean(value, choices);
  return "unknown " + what + " '" + value + "' (" +
         (suggestion.empty() ? "expected " + join_choices(choices) : "did you mean '" + suggestion + "'?") +
         ")";
}

void require_choice(const SourceLocation& where, const std::string& what, const std::string& value,
                    const std::vector<std::string>& choices) {
  const std::string message = choice_message(what, value, choices);
  if (!message.empty()) fail(where, message);
}

} // namespace detail
} // namespace attnhost::suite
