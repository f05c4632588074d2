#include "suite/settings.h"

#include "suite/toml_reader.h"

#include <algorithm>

namespace attnhost::suite::detail {
namespace {

const std::vector<std::string> kTimingKeys = {"method",       "warmup_runs", "warmup_seconds", "timing_runs",
                                              "rounds",       "target_noise", "min_samples",   "max_seconds",
                                              "passes",       "flush_l2"};
const std::vector<std::string> kPasses = {"fwd", "bwd", "fwd_bwd"};
const std::vector<std::string> kCheckKeys = {"enabled", "query_rows", "key_columns", "tolerance_scale"};
const std::vector<std::string> kDataKeys = {"seed", "distribution", "scale"};
const std::vector<std::string> kDataDistributions = {"normal", "uniform", "scaled"};
const std::vector<std::string> kOutputKeys = {"dir", "formats"};

// A world size beyond this is a typo (and must fit an int).
constexpr int64_t kMaxWorldSize = 1 << 20;

std::vector<std::string> read_passes(const toml::node& node) {
  std::vector<std::string> passes;
  for (const auto& [pass, where] : read_names(node, "passes")) {
    require_choice(where, "pass", pass, kPasses);
    if (std::find(passes.begin(), passes.end(), pass) != passes.end())
      fail(where, "pass '" + pass + "' is listed twice");
    passes.push_back(pass);
  }
  if (passes.empty()) fail(location_of(node), "'passes' must name at least one of fwd, bwd or fwd_bwd");
  return passes;
}

void read_target_noise(const toml::node& node, double& target) {
  const double value = read_number(node, "target_noise");
  if (!(value > 0 && value < 1))
    fail(location_of(node), "'target_noise' must be between 0 and 1 (a relative noise, e.g. 0.02), got " +
                                format_number(value));
  target = value;
}

} // namespace

const std::vector<std::string>& timing_methods() {
  static const std::vector<std::string> methods = {"simple", "warmup", "adaptive", "profiler"};
  return methods;
}

const std::vector<std::string>& output_formats() {
  static const std::vector<std::string> formats = {"console", "json",   "jsonl", "csv",
                                                   "markdown", "charts", "trace"};
  return formats;
}

void read_timing(const toml::node& node, const std::string& table_name, Timing& into) {
  const toml::table& table = read_table(node, "timing");
  reject_unknown_keys(table, kTimingKeys, "in [" + table_name + "]", location_of(node));
  if (const toml::node* method = table.get("method")) {
    into.method = read_string(*method, "method");
    require_choice(location_of(*method), "timing method", into.method, timing_methods());
  }
  read_into(table, "warmup_runs", into.warmup_runs, 0);
  if (const toml::node* seconds = table.get("warmup_seconds")) {
    into.warmup_seconds = read_number(*seconds, "warmup_seconds");
    if (!(into.warmup_seconds >= 0 && into.warmup_seconds <= 600))
      fail(location_of(*seconds), "'warmup_seconds' must be between 0 and 600, got " + format_number(into.warmup_seconds));
  }
  read_into(table, "timing_runs", into.timing_runs, 1);
  read_into(table, "rounds", into.rounds, 1);
  if (into.rounds > kMaxRounds)
    fail(location_of(*table.get("rounds")), "'rounds' must be at most " + std::to_string(kMaxRounds) + ", got " +
                                                std::to_string(into.rounds));
  read_into(table, "min_samples", into.min_samples, 2);
  if (const toml::node* noise = table.get("target_noise")) read_target_noise(*noise, into.target_noise);
  if (const toml::node* seconds = table.get("max_seconds")) {
    into.max_seconds = read_number(*seconds, "max_seconds");
    require_positive(*seconds, "max_seconds", into.max_seconds);
  }
  if (const toml::node* passes = table.get("passes")) into.passes = read_passes(*passes);
  read_into(table, "flush_l2", into.flush_l2);
}

void read_check(const toml::node& node, const std::string& table_name, Check& into) {
  const toml::table& table = read_table(node, "check");
  reject_unknown_keys(table, kCheckKeys, "in [" + table_name + "]", location_of(node));
  read_into(table, "enabled", into.enabled);
  read_into(table, "query_rows", into.query_rows, 0);
  read_into(table, "key_columns", into.key_columns, 0);
  if (const toml::node* scale = table.get("tolerance_scale")) {
    into.tolerance_scale = read_number(*scale, "tolerance_scale");
    require_positive(*scale, "tolerance_scale", into.tolerance_scale);
  }
}

void read_data(const toml::node& node, const std::string& table_name, Data& into) {
  const toml::table& table = read_table(node, "data");
  reject_unknown_keys(table, kDataKeys, "in [" + table_name + "]", location_of(node));
  if (const toml::node* seed = table.get("seed")) {
    const int64_t value = read_integer(*seed, "seed");
    require_at_least(*seed, "seed", value, 0);
    into.seed = static_cast<uint64_t>(value);
  }
  if (const toml::node* distribution = table.get("distribution")) {
    into.distribution = read_string(*distribution, "distribution");
    require_choice(location_of(*distribution), "data distribution", into.distribution, kDataDistributions);
  }
  if (const toml::node* scale = table.get("scale")) {
    into.scale = read_number(*scale, "scale");
    require_positive(*scale, "scale", into.scale);
  }
}

std::string check_world_sizes(const std::vector<int>& world_sizes) {
  if (world_sizes.empty()) return "'world_sizes' must not be empty";
  for (size_t i = 0; i < world_sizes.size(); ++i) {
    if (world_sizes[i] < 1)
      return "world sizes must be at least 1, got " + std::to_string(world_sizes[i]);
    if (std::find(world_sizes.begin(), world_sizes.begin() + i, world_sizes[i]) != world_sizes.begin() + i)
      return "world size " + std::to_string(world_sizes[i]) + " is listed twice";
  }
  return "";
}

std::vector<int> read_world_sizes(const toml::node& node) {
  if (node.is_integer())
    fail(location_of(node), "'world_sizes' must be an array of integers, e.g. [1, 2], got integer");
  const std::vector<int64_t> values = read_integer_list(node, "world_sizes");
  std::vector<int> sizes;
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] > kMaxWorldSize)
      fail(location_of(*node.as_array()->get(i)), "world size " + std::to_string(values[i]) + " is too large");
    sizes.push_back(static_cast<int>(std::max<int64_t>(values[i], -1)));
    const std::string message = check_world_sizes(sizes);
    if (!message.empty()) fail(location_of(*node.as_array()->get(i)), message);
  }
  const std::string message = check_world_sizes(sizes);
  if (!message.empty()) fail(location_of(node), message);
  return sizes;
}

Outputs read_outputs(const toml::node& node) {
  const toml::table& table = read_table(node, "outputs");
  reject_unknown_keys(table, kOutputKeys, "in [outputs]", location_of(node));
  Outputs outputs;
  if (const toml::node* dir = table.get("dir")) outputs.dir = read_string(*dir, "dir");
  if (const toml::node* formats = table.get("formats")) {
    outputs.formats.clear();
    for (const auto& [format, where] : read_names(*formats, "formats")) {
      require_choice(where, "output format", format, output_formats());
      if (std::find(outputs.formats.begin(), outputs.formats.end(), format) == outputs.formats.end())
        outputs.formats.push_back(format);
    }
  }
  return outputs;
}

} // namespace attnhost::suite::detail
