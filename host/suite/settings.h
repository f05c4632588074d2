// How cases are measured, checked, fed and reported: the [timing], [check] and [data] tables of
// [defaults] and of each [[case]], world_sizes, and [outputs]. Each reader applies the keys a
// table has on top of `into`, so a case's table overrides [defaults] key by key. Internal.
#pragma once

#include "suite/suite.h"

#include <toml++/toml.h>

#include <string>
#include <vector>

namespace attnhost::suite::detail {

void read_timing(const toml::node& node, const std::string& table_name, Timing& into);
void read_check(const toml::node& node, const std::string& table_name, Check& into);
void read_data(const toml::node& node, const std::string& table_name, Data& into);
std::vector<int> read_world_sizes(const toml::node& node);
Outputs read_outputs(const toml::node& node);

const std::vector<std::string>& timing_methods();
const std::vector<std::string>& output_formats();

// Checks shared with the command-line overrides; "" when fine.
std::string check_world_sizes(const std::vector<int>& world_sizes);
constexpr int kMaxRounds = 100;  // timing.rounds: more is a typo

} // namespace attnhost::suite::detail
