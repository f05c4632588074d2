// Suites: what to run. Parsed from TOML (toml++), validated completely before anything runs,
// expanded into a flat list of cases. Every error is a SuiteError whose what() is one line:
// "FILE:LINE:COLUMN: message" (with a did-you-mean suggestion for unknown names).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace attnhost::suite {

struct SuiteError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One value of a plugin parameter, as written in a suite (typed by the plugin's schema).
using ParamValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>>;

// What the suite layer knows of a plugin: enough to check names and parameters.
struct ParamSchema {
  std::string name;
  int32_t type;               // attnhost_param_type
  std::string default_value;  // TOML text
  std::string help;
  std::vector<std::string> choices; // STRING only; empty: any
};
struct PluginSchema {
  std::string name;
  std::vector<ParamSchema> params;
};
using PluginCatalog = std::vector<PluginSchema>;

// Variable sequence lengths: explicit, or drawn from a distribution with a token budget.
struct SeqlenSpec {
  std::vector<int64_t> lengths;     // explicit list, or the resolved draw
  std::string distribution;         // "" (explicit) | "uniform" | "lognormal" | "documents"
  int64_t total_tokens = 0;         // budget for a distribution
  int64_t min_length = 1, max_length = 0; // bounds of a distribution (0: total_tokens)
  uint64_t seed = 0;
  int64_t median_length = 0;        // lognormal: median length (0: geometric mean of the bounds)
  double sigma = 1.0;               // lognormal: standard deviation of log(length)
};

struct Problem {
  int64_t batch = 1;
  int64_t seqlen_q = 0;
  int64_t seqlen_kv = 0;            // == seqlen_q unless given
  int32_t heads_q = 0;
  int32_t heads_kv = 0;             // == heads_q unless given
  int32_t head_dim = 0;
  std::string dtype = "bf16";       // bf16 | fp16 | fp32 | fp8_e4m3 | fp8_e5m2
  std::string grad_dtype;           // "" (dO in dtype) | fp8_e5m2: dO in e5m2 beside fp8_e4m3 inputs
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  std::optional<double> softmax_scale;
  std::optional<SeqlenSpec> varlen; // packed variable-length input when set
  bool deterministic = false;
};

struct Timing {
  std::string method = "warmup";    // simple | warmup | adaptive | profiler
  int warmup_runs = 3;
  double warmup_seconds = 0;        // and warm-up runs go on until this much time has passed (the
                                    // GPU's clock settles at its power limit within a second)
  int timing_runs = 10;
  // The world sizes run this many times in turn, each pass's samples pooled: on a GPU at its power
  // limit the clock and the heat drift between runs a minute apart, and world size 1 and P are then
  // each measured across the same drift.
  int rounds = 1;
  double target_noise = 0.02;       // adaptive: stop when relative noise < this
  int min_samples = 5;              // adaptive
  double max_seconds = 10.0;        // adaptive: per pass
  std::vector<std::string> passes = {"fwd", "bwd"}; // fwd | bwd | fwd_bwd
  bool flush_l2 = true;
};

struct Check {
  bool enabled = true;
  int query_rows = 16;              // sampled (batch, head, query) rows for O, LSE, dQ
  int key_columns = 8;              // sampled (batch, kv head, key) columns for dK, dV
  double tolerance_scale = 1.0;     // multiplies the per-dtype tolerances
};

struct Data {
  uint64_t seed = 1;
  std::string distribution = "normal"; // normal | uniform | scaled (large logits)
  double scale = 1.0;
};

struct SourceLocation {
  std::string file;
  int64_t line = 0, column = 0;
  std::string str() const;          // "file:line:column" ("file" alone when line is 0)
};

struct Case {
  std::string id;                   // unique and stable across runs: "plugin/label[/sweep values]"
  std::string group;                // cases of one preset or sweep share a group (reports, charts)
  std::string label;                // preset name or inline case name
  std::string plugin;
  Problem problem;
  std::vector<int> world_sizes = {1};
  // No suite, default or flag named the world sizes: the command runs the machine's (world size 1
  // and every GPU of --gpus; 1 and 2 on the CPU) in place of `world_sizes`.
  bool machine_world_sizes = false;
  std::map<std::string, ParamValue> params; // as written; defaults are added when the case runs
  Timing timing;
  Check check;
  Data data;
  SourceLocation where;             // where the case was declared
  int64_t tokens = 0;               // batch = "auto": the token budget that sized the batch; else 0
};

struct Outputs {
  std::string dir;                  // "" : results/<date-time>
  std::vector<std::string> formats = {"console", "json", "csv", "markdown", "charts", "trace"};
};

struct Suite {
  std::string name;
  std::string description;
  std::filesystem::path path;
  std::string text;                 // the file as read, recorded in results.json
  std::vector<Case> cases;
  Outputs outputs;
};

// Named problems and sequence ranges (configs/presets.toml, configs/ranges.toml).
struct Preset {
  std::string name;
  std::string description;
  Problem problem;
  std::map<std::string, ParamValue> params; // plugin parameters a preset implies (rare)
  std::string file;                         // the presets file: a relative path parameter is from its folder
};
struct PresetLibrary {
  std::vector<Preset> presets;
  std::map<std::string, std::vector<std::string>> sets;  // named sets of presets
  std::map<std::string, std::vector<int64_t>> ranges;    // named sequence-length ranges
  const Preset* find(const std::string& name) const;
};

// Loads presets.toml and ranges.toml from a configs folder; throws SuiteError.
PresetLibrary load_presets(const std::filesystem::path& configs_dir);

// Parses, validates and expands a suite file. `plugins` are the loaded plugins: a case naming
// another plugin, or a parameter its schema does not know, is an error here, before anything runs.
Suite load_suite(const std::filesystem::path& file, const PresetLibrary& library,
                 const PluginCatalog& plugins);
Suite parse_suite(const std::string& text, const std::string& file_name,
                  const PresetLibrary& library, const PluginCatalog& plugins);

// Command-line overrides (attnhost compare/run): applied to every case, then re-validated.
struct Overrides {
  std::optional<int64_t> batch, seqlen;
  std::optional<int32_t> heads, kv_heads, head_dim;
  std::optional<std::string> dtype, grad_dtype;
  std::optional<bool> causal;
  std::optional<std::pair<int64_t, int64_t>> window;
  std::optional<std::vector<int>> world_sizes;
  std::optional<std::string> timing_method;
  std::optional<int> warmup_runs, timing_runs;
  std::optional<double> warmup_seconds;
  std::optional<int> rounds;
  // --param NAME=VALUE, in order: set on every case whose plugin has the parameter (typed by its
  // schema); a name no plugin of the suite has is an error.
  std::vector<std::pair<std::string, std::string>> params;
};
// `plugins`: the loaded plugins' schemas, which type the --param values.
void apply_overrides(Suite& suite, const Overrides& overrides, const PluginCatalog& plugins = {}); // throws SuiteError

// A preset's plugin parameters as `plugin` takes them: those its schema has, typed by it, paths made
// absolute from the presets file's folder. A value of the wrong kind fails at `where`.
std::map<std::string, ParamValue> preset_params(const Preset& preset, const PluginSchema& plugin,
                                                const SourceLocation& where);

// A suite made of plugins x one preset (attnhost compare).
Suite make_compare_suite(const std::vector<std::string>& plugins, const std::string& preset,
                         const PresetLibrary& library, const PluginCatalog& catalog);

// Checks one problem's values; returns "" or the message (used by the parser and overrides).
std::string validate_problem(const Problem& p);

// The closest of `candidates` to `word` within a small edit distance, or "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

} // namespace attnhost::suite
