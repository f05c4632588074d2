#include "cli/app.h"
#include "cli/options.h"
#include "common/errors.h"
#include "common/log.h"
#include "report/console.h"
#include "runtime/environment.h"
#include "runtime/isolate.h"
#include "runtime/runner.h"
#include "suite/toml_reader.h"

#include <algorithm>
#include <iostream>
#include <set>

namespace attnhost::cli {

namespace fs = std::filesystem;

fs::path default_configs_dir() {
  fs::path beside = (executable_dir() / ".." / "share" / "attnhost" / "configs").lexically_normal();
  return beside;
}

void Context::load_plugins() {
  LoaderOptions lo;
  for (const std::string& d : options.plugin_dirs) lo.dirs.emplace_back(d);
  for (const std::string& f : options.plugin_files) lo.files.emplace_back(f);
  lo.allow_insecure = options.allow_insecure;
  std::vector<std::string> warnings;
  registry = PluginRegistry::load(lo, warnings);
  for (const std::string& w : warnings) log::warn(w);
}

void Context::load_presets() {
  configs = options.configs_dir.empty() ? default_configs_dir() : fs::path(options.configs_dir);
  if (!fs::is_directory(configs)) throw UsageError("configs folder " + configs.string() + " not found (use --configs DIR)");
  presets = suite::load_presets(configs);
}

suite::PluginCatalog Context::catalog() const {
  suite::PluginCatalog out;
  for (const auto& p : registry.plugins()) {
    suite::PluginSchema s{p->name(), {}};
    for (const ParamSpec& spec : p->description().params)
      s.params.push_back({spec.name, spec.type, spec.default_value, spec.help, spec.choices});
    out.push_back(std::move(s));
  }
  return out;
}

namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::string item;
  for (char c : s + ",") {
    if (c == ',') {
      if (!item.empty()) out.push_back(item);
      item.clear();
    } else if (c != ' ') {
      item += c;
    }
  }
  return out;
}

// What run and compare share beyond the output: how the cases run.
po::options_description execution_options() {
  po::options_description d("Execution");
  d.add_options()("resume", po::value<std::string>(), "go on with the run in DIR: run only the cases missing from "
                                                      "DIR/results.jsonl, then write every report over all of them")
                 ("case", po::value<std::vector<std::string>>(), "run only the cases of this name (a [[case]]'s name or "
                                                                   "preset; repeatable)")
                 ("dry-run", "print the expanded case list and stop")
                 ("no-check", "skip the correctness check")
                 ("isolate", "run each case in its own process: a crash or hang costs that case only")
                 ("case-timeout", po::value<double>()->default_value(600), "with --isolate: seconds a case may take, per timing round");
  return d;
}

void apply_execution_options(const po::variables_map& vm, suite::Suite& s, ExecuteOptions& ex) {
  if (vm.count("case")) {
    // A case's name is its label's first part ("global_sink", or "first" of "first/tiny").
    const auto name_of = [](const suite::Case& c) { return c.label.substr(0, c.label.find('/')); };
    const auto names = vm["case"].as<std::vector<std::string>>();
    std::vector<std::string> known;
    for (const suite::Case& c : s.cases)
      if (std::find(known.begin(), known.end(), name_of(c)) == known.end()) known.push_back(name_of(c));
    for (const std::string& n : names)
      if (std::find(known.begin(), known.end(), n) == known.end()) {
        std::string list;
        for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
        throw UsageError("--case " + n + ": " + (s.name.empty() ? s.path.string() : s.name) + " has no case of that name (" +
                         list + ")");
      }
    std::erase_if(s.cases, [&](const suite::Case& c) { return std::find(names.begin(), names.end(), name_of(c)) == names.end(); });
  }
  if (vm.count("no-check"))
    for (suite::Case& c : s.cases) c.check.enabled = false;
  if (vm.count("heat-seconds")) {
    ex.heat_seconds = vm["heat-seconds"].as<double>();
    if (!(ex.heat_seconds >= 0 && ex.heat_seconds <= 600))
      throw UsageError("--heat-seconds must be between 0 and 600, got " + suite::detail::format_number(ex.heat_seconds));
  }
  ex.dry_run = vm.count("dry-run") > 0;
  ex.isolate = vm.count("isolate") > 0;
  ex.case_timeout = vm["case-timeout"].as<double>();
  if (ex.case_timeout <= 0) throw UsageError("--case-timeout must be positive");
}

void apply_output_options(const po::variables_map& vm, ExecuteOptions& ex) {
  if (vm.count("out")) ex.out_dir = vm["out"].as<std::string>();
  ex.force = vm.count("force") > 0;
  if (vm.count("baseline")) ex.baseline = vm["baseline"].as<std::string>();
  if (vm.count("threshold")) ex.threshold = parse_threshold(vm["threshold"].as<std::string>());
  if (vm.count("history")) ex.history = vm["history"].as<std::string>();
  if (vm.count("resume")) ex.resume_dir = vm["resume"].as<std::string>();
  if (vm.count("format")) {
    ex.formats = split_list(vm["format"].as<std::string>());
    static const std::vector<std::string> known = {"console", "json", "jsonl", "csv", "markdown", "trace", "charts"};
    for (const std::string& f : ex.formats)
      if (std::find(known.begin(), known.end(), f) == known.end()) {
        std::string hint = suite::did_you_mean(f, known);
        throw UsageError("--format: unknown format '" + f + "'" + (hint.empty() ? "" : " (did you mean '" + hint + "'?)") +
                         "; formats: console, json, jsonl, csv, markdown, trace, charts");
      }
  }
}

// A suite given by name ("quick") is looked up among the shipped suites.
fs::path resolve_suite(const Context& ctx, const std::string& arg) {
  fs::path p(arg);
  if (fs::is_directory(p)) throw UsageError(arg + " is a folder; run takes a suite file (SUITE.toml) or a shipped suite's name");
  if (fs::exists(p)) return p;
  fs::path shipped = ctx.configs / "suites" / (arg + (p.extension() == ".toml" ? "" : ".toml"));
  if (fs::exists(shipped)) return shipped;
  throw UsageError("suite file " + arg + " not found");
}

}  // namespace

int run_command(Context& ctx, const std::vector<std::string>& args) {
  po::options_description desc;
  desc.add(common_options(ctx.options)).add(timing_options()).add(problem_options()).add(output_options()).add(gate_options());
  po::options_description own("Run");
  own.add_options()("suite", po::value<std::string>(), "suite file, or the name of a shipped suite");
  desc.add(own).add(execution_options());
  po::positional_options_description pos;
  pos.add("suite", 1);
  po::variables_map vm;
  if (!parse(args, desc, pos, vm, "usage: attnhost run SUITE.toml [options]")) return kExitOk;
  apply_common(ctx, vm);
  if (!vm.count("suite")) throw UsageError("run: which suite? (attnhost run SUITE.toml)");
  ctx.load_presets();
  ctx.load_plugins();
  suite::Suite s = suite::load_suite(resolve_suite(ctx, vm["suite"].as<std::string>()), ctx.presets, ctx.catalog());
  suite::apply_overrides(s, overrides_from(vm), ctx.catalog());
  ExecuteOptions ex;
  apply_execution_options(vm, s, ex);
  apply_output_options(vm, ex);
  return execute_suite(ctx, s, ex);
}

// The options a child process of --isolate needs to see the same plugins and devices.
std::vector<std::string> child_arguments(const Context& ctx) {
  const CommonOptions& o = ctx.options;
  std::vector<std::string> args = {"--device", o.backend.device, "--gpus", std::to_string(o.backend.gpus),
                                   "--transport", o.backend.transport,
                                   "--ranks-per-gpu", std::to_string(o.backend.ranks_per_gpu),
                                   "--comm-timeout", std::to_string(o.backend.comm_timeout.count() / 1000.0)};
  for (const std::string& d : o.plugin_dirs) args.insert(args.end(), {"--plugin-dir", d});
  for (const std::string& f : o.plugin_files) args.insert(args.end(), {"--plugin", f});
  if (o.allow_insecure) args.push_back("--allow-insecure-plugins");
  if (o.debug) args.push_back("--debug");
  return args;
}

// attnhost _case CASE.json RESULTS.jsonl [common options]: the child of --isolate.
int isolated_case_command(Context& ctx, const std::vector<std::string>& args) {
  po::options_description desc;
  desc.add(common_options(ctx.options));
  po::options_description own("Isolated case");
  own.add_options()("files", po::value<std::vector<std::string>>(), "case and result files");
  desc.add(own);
  po::positional_options_description pos;
  pos.add("files", 2);
  po::variables_map vm;
  if (!parse(args, desc, pos, vm, "usage: attnhost _case CASE.json RESULTS.jsonl (used by --isolate)")) return kExitOk;
  apply_common(ctx, vm);
  std::vector<std::string> files = vm.count("files") ? vm["files"].as<std::vector<std::string>>() : std::vector<std::string>{};
  if (files.size() != 2) throw UsageError("_case needs a case file and a result file");
  ctx.load_plugins();
  std::unique_ptr<Backend> backend = make_backend(ctx.options.backend);
  return isolated_child(files[0], files[1], [&](const suite::Case& c, const std::function<void(const CaseResult&)>& finished) {
    std::shared_ptr<const Plugin> plugin = ctx.registry.find(c.plugin);
    if (!plugin) throw UsageError("plugin '" + c.plugin + "' is not loaded in the isolated process");
    RunnerOptions ro;
    ro.on_run = [&](const RunResult& r) {
      CaseResult one;
      one.spec = c;
      one.plugin_version = plugin->description().version;
      one.device = device_kind_name(backend->device_kind());
      one.runs = {r};
      finished(one);
    };
    run_case(c, plugin, *backend, ro);
  });
}

int compare_command(Context& ctx, const std::vector<std::string>& args) {
  po::options_description desc;
  desc.add(common_options(ctx.options)).add(timing_options()).add(problem_options()).add(output_options()).add(gate_options());
  po::options_description own("Compare");
  own.add_options()("plugins", po::value<std::vector<std::string>>()->multitoken(), "plugins to compare")
                   ("config", po::value<std::string>(), "preset to run (attnhost list configs)");
  desc.add(own).add(execution_options());
  po::positional_options_description pos;
  pos.add("plugins", -1);
  po::variables_map vm;
  if (!parse(args, desc, pos, vm, "usage: attnhost compare P1 P2 [...] --config NAME [options]")) return kExitOk;
  apply_common(ctx, vm);
  if (!vm.count("plugins")) throw UsageError("compare: name at least one plugin (attnhost list plugins)");
  if (!vm.count("config")) throw UsageError("compare: which preset? add --config NAME (attnhost list configs)");
  ctx.load_presets();
  ctx.load_plugins();
  suite::Suite s = suite::make_compare_suite(vm["plugins"].as<std::vector<std::string>>(), vm["config"].as<std::string>(),
                                             ctx.presets, ctx.catalog());
  suite::apply_overrides(s, overrides_from(vm), ctx.catalog());
  ExecuteOptions ex;
  apply_execution_options(vm, s, ex);
  ex.comparison = true;
  // On a GPU the samples start once its clock has settled at the power limit, as in the shipped
  // efficiency suites: short warm-ups read up to 10% fast (docs/SUITES.md, "Short timings").
  if (!vm.count("warmup-seconds")) ex.gpu_warmup_seconds = 1.0;
  apply_output_options(vm, ex);
  // The side-by-side table on the console; with a folder (--out, --resume), the files of a run too.
  if (ex.formats.empty()) ex.formats = ex.out_dir.empty() && ex.resume_dir.empty()
                                          ? std::vector<std::string>{"console"}
                                          : std::vector<std::string>{"console", "json", "csv", "markdown"};
  return execute_suite(ctx, s, ex);
}

int list_command(Context& ctx, const std::vector<std::string>& args) {
  po::options_description desc;
  desc.add(common_options(ctx.options));
  po::options_description own("List");
  own.add_options()("what", po::value<std::string>(), "configs | plugins | suites");
  desc.add(own);
  po::positional_options_description pos;
  pos.add("what", 1);
  po::variables_map vm;
  if (!parse(args, desc, pos, vm, "usage: attnhost list configs|plugins|suites [-v]")) return kExitOk;
  apply_common(ctx, vm);
  std::string what = vm.count("what") ? vm["what"].as<std::string>() : "";
  if (what == "plugins") {
    ctx.load_plugins();
    if (ctx.registry.plugins().empty()) std::cout << "no plugins loaded\n";
    for (const auto& p : ctx.registry.plugins()) {
      const PluginDescription& d = p->description();
      std::cout << d.name << " " << d.version << "  " << d.description << "\n";
      if (!ctx.options.verbose) continue;
      std::cout << "    file: " << p->file().string() << "\n";
      std::cout << "    devices: " << devices_string(d.devices) << "  dtypes: " << dtypes_string(d.dtypes)
                << "  features: " << features_string(d.features) << "\n";
      std::cout << "    world sizes: " << d.min_world_size << ".."
                << (d.max_world_size > 0 ? std::to_string(d.max_world_size) : std::string("any"));
      std::cout << "  head dims: ";
      if (d.head_dims.empty()) std::cout << "any multiple of 8";
      for (size_t i = 0; i < d.head_dims.size(); ++i) std::cout << (i ? "," : "") << d.head_dims[i];
      std::cout << "\n";
      if (d.params.empty()) std::cout << "    parameters: none\n";
      for (const ParamSpec& s : d.params) {
        std::cout << "    param " << s.name << " (" << param_type_name(s.type) << ", default " << s.default_value;
        if (!s.choices.empty()) {
          std::cout << ", one of";
          for (const std::string& c : s.choices) std::cout << " " << c;
        }
        std::cout << "): " << s.help << "\n";
      }
    }
    return kExitOk;
  }
  if (what == "configs") {
    ctx.load_presets();
    for (const suite::Preset& p : ctx.presets.presets) {
      std::cout << p.name << std::string(p.name.size() < 20 ? 20 - p.name.size() : 1, ' ') << report::problem_line(p.problem);
      if (ctx.options.verbose && !p.description.empty()) std::cout << "  - " << p.description;
      std::cout << "\n";
    }
    std::cout << "\nsets:";
    for (const auto& [name, members] : ctx.presets.sets) std::cout << " " << name << "(" << members.size() << ")";
    std::cout << "\nranges:";
    for (const auto& [name, values] : ctx.presets.ranges) std::cout << " " << name << "(" << values.size() << ")";
    std::cout << "\n";
    return kExitOk;
  }
  if (what == "suites") {
    ctx.load_presets();
    ctx.load_plugins();
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(ctx.configs / "suites"))
      if (e.path().extension() == ".toml") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      try {
        suite::Suite s = suite::load_suite(f, ctx.presets, ctx.catalog());
        std::cout << f.stem().string() << "  (" << s.cases.size() << " cases)  " << s.description << "\n";
      } catch (const std::exception& e) {
        std::cout << f.stem().string() << "  (not runnable here: " << e.what() << ")\n";
      }
    }
    return kExitOk;
  }
  throw UsageError("list what? configs, plugins or suites (got '" + what + "')");
}

int info_command(Context& ctx, const std::vector<std::string>& args) {
  po::options_description desc;
  desc.add(common_options(ctx.options));
  po::variables_map vm;
  if (!parse(args, desc, {}, vm, "usage: attnhost info")) return kExitOk;
  apply_common(ctx, vm);
  ctx.load_plugins();
  std::unique_ptr<Backend> backend = make_backend(ctx.options.backend);
  Environment env = probe_environment(*backend);
  std::cout << "attnhost " << env.attnhost_version << " (" << env.git_revision << "), plugin ABI " << ATTNHOST_ABI_MAJOR
            << "." << ATTNHOST_ABI_MINOR << "\n"
            << "device:  " << env.device << "\n"
            << "driver:  " << env.driver << "\n"
            << "CUDA:    " << env.cuda << "\n"
            << "NCCL:    " << env.nccl << "\n"
            << "cuDNN:   " << env.cudnn << "\n"
            << "MPI:     " << (started_under_mpi() ? "started under mpirun" : "not under mpirun")
#if ATTNHOST_HAVE_MPI
            << " (built with MPI)\n"
#else
            << " (built without MPI)\n"
#endif
            << "configs: " << (ctx.options.configs_dir.empty() ? default_configs_dir().string() : ctx.options.configs_dir) << "\n"
            << "plugin folders and files searched:\n";
  for (const PluginSource& s : ctx.registry.searched()) std::cout << "  " << s.path.string() << "  (" << s.origin << ")\n";
  std::cout << "plugins loaded: " << ctx.registry.plugins().size() << "\n";
  return kExitOk;
}

}  // namespace attnhost::cli
