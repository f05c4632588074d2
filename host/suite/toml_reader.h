// Reading TOML with errors that point at the file: locations, type names, typed reads that
// reject a wrong type with "'key' must be an integer, got string", and unknown-key checks with
// a did-you-mean suggestion. Internal to the suite library.
#pragma once

#include "suite/suite.h"

#include <toml++/toml.h>

#include <filesystem>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace attnhost::suite::detail {

// Where a node or key was written. A node toml++ created implicitly (a table named only by a
// dotted key or a sub-table header) has no position of its own: `fallback` is used then.
SourceLocation location_of(const toml::node& node, const SourceLocation& fallback = {});
SourceLocation location_of(const toml::key& key, const SourceLocation& fallback = {});

[[noreturn]] void fail(const SourceLocation& where, const std::string& message);

// The whole file, or a failure "PATH:1:1: cannot read the file (reason)".
std::string read_text_file(const std::filesystem::path& path);

// Parses TOML; a syntax error fails with toml++'s position and description.
toml::table parse_toml(const std::string& text, const std::string& file_name);

// "integer", "string", "float", "boolean", "array", "table", "date", "time", "date-time".
std::string type_name(const toml::node& node);

// A table's entries in the order they appear in the file (toml++ keeps them sorted by name), so
// that the first error reported is the first one in the file.
using Entry = std::pair<const toml::key*, const toml::node*>;
std::vector<Entry> entries_in_file_order(const toml::table& table);

// Fails on the first key (in file order) that is not in `allowed`, suggesting the closest one.
// `where_text` names the table in the message, e.g. "in [defaults.timing]".
void reject_unknown_keys(const toml::table& table, const std::vector<std::string>& allowed,
                         const std::string& where_text, const SourceLocation& fallback);

// The closest allowed key to an unknown one: a known alias first (num_heads -> heads), then
// the nearest by edit distance.
std::string suggest_key(const std::string& unknown, const std::vector<std::string>& allowed);

// Typed reads: each fails with "'key' must be <a type>, got <type>" at the node.
int64_t read_integer(const toml::node& node, const std::string& key);
double read_number(const toml::node& node, const std::string& key);  // integer or float
bool read_bool(const toml::node& node, const std::string& key);
std::string read_string(const toml::node& node, const std::string& key);
const toml::table& read_table(const toml::node& node, const std::string& key);
const toml::array& read_array(const toml::node& node, const std::string& key);
std::vector<int64_t> read_integer_list(const toml::node& node, const std::string& key);
// A string, or an array of strings: each element with its own location.
std::vector<std::pair<std::string, SourceLocation>> read_names(const toml::node& node,
                                                               const std::string& key);

// Fails at `node` unless value >= minimum: "'key' must be at least MIN, got V".
void require_at_least(const toml::node& node, const std::string& key, int64_t value, int64_t minimum);
void require_positive(const toml::node& node, const std::string& key, double value);

// The shortest text that reads back as the same double: 0.125, 1e-06, 2.
std::string format_number(double value);

// Reads `key` into `target` when the table has it (the caller has already rejected unknown keys).
void read_into(const toml::table& table, const std::string& key, int& target, int64_t minimum);
void read_into(const toml::table& table, const std::string& key, bool& target);

// "a, b or c" for messages listing the allowed values.
std::string join_choices(const std::vector<std::string>& choices, std::string_view last_word = "or");

// Fails unless `value` is one of `choices`: "unknown WHAT 'v' (did you mean 'x'?)" or, without a
// close match, "unknown WHAT 'v' (expected a, b or c)".
std::string choice_message(const std::string& what, const std::string& value,
                           const std::vector<std::string>& choices);  // "" when it is one
void require_choice(const SourceLocation& where, const std::string& what, const std::string& value,
                    const std::vector<std::string>& choices);

} // namespace attnhost::suite::detail
