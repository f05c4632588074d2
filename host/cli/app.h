// The command line: one function per command, over a shared context (plugins, presets, backend).
#pragma once

#include "plugins/loader.h"
#include "results/records.h"
#include "runtime/backend.h"
#include "suite/suite.h"

#include <filesystem>
#include <string>
#include <vector>

namespace attnhost::cli {

struct CommonOptions {
  std::vector<std::string> plugin_dirs, plugin_files;
  bool allow_insecure = false;
  std::string configs_dir;  // "" : beside the executable
  BackendOptions backend;
  bool quiet = false, verbose = false, debug = false;
};

// What every command that runs or lists needs; built lazily so `--help` costs nothing.
struct Context {
  CommonOptions options;
  std::vector<std::string> argv;
  PluginRegistry registry;
  suite::PresetLibrary presets;
  std::filesystem::path configs;

  void load_plugins();             // prints one warning line per rejected plugin
  void load_presets();             // throws UsageError
  suite::PluginCatalog catalog() const;
};

int run_command(Context& ctx, const std::vector<std::string>& args);      // attnhost run
int compare_command(Context& ctx, const std::vector<std::string>& args);  // attnhost compare
int verify_command(Context& ctx, const std::vector<std::string>& args);   // attnhost verify
int list_command(Context& ctx, const std::vector<std::string>& args);     // attnhost list
int info_command(Context& ctx, const std::vector<std::string>& args);      // attnhost info
int isolated_case_command(Context& ctx, const std::vector<std::string>& args); // attnhost _case (internal)
int report_command(Context& ctx, const std::vector<std::string>& args);   // attnhost report DIR
int diff_command(Context& ctx, const std::vector<std::string>& args);     // attnhost diff A B
int history_command(Context& ctx, const std::vector<std::string>& args);  // attnhost history FILE

// Runs an expanded suite and writes its outputs; returns the exit code.
struct ExecuteOptions {
  bool dry_run = false;
  bool comparison = false;   // print the side-by-side table (compare)
  bool force = false;        // --out may name an existing result folder
  bool verification = false; // verify: no per-case blocks; the summary is the check's, without timings
  bool isolate = false;      // each case in a child process
  double case_timeout = 600; // seconds, with isolate
  std::string out_dir;       // overrides the suite's
  std::vector<std::string> formats;
  std::string resume_dir;    // --resume: run only the cases missing from DIR/results.jsonl
  std::string baseline;      // --baseline: the regression gate's earlier results
  double threshold = 0.20;   // --threshold, as a fraction
  std::string history;       // --history: the JSONL file a summary of the run is appended to
  // On a GPU, every case warms up at least this many seconds (compare's sustained default; 0: none).
  double gpu_warmup_seconds = 0;
  // --heat-seconds: before the first timed case, that case's forward and backward run this long at
  // its largest world size, untimed and unchecked (0: none).
  double heat_seconds = 0;
};
int execute_suite(Context& ctx, const suite::Suite& suite, const ExecuteOptions& options);

std::filesystem::path default_configs_dir();
std::vector<std::string> child_arguments(const Context& ctx);  // what an --isolate child needs to see the same plugins

}  // namespace attnhost::cli
