// execute_suite: the one loop that runs cases and hands their records to the reporters (console,
// progress, the result folder's journal), then the reports of the whole run, the regression gate
// and the history. Nothing here measures; the runner does.
#include "cli/app.h"
#include "common/errors.h"
#include "common/log.h"
#include "report/console.h"
#include "report/files.h"
#include "report/history.h"
#include "report/progress.h"
#include "report/result_set.h"
#include "runtime/environment.h"
#include "runtime/isolate.h"
#include "runtime/problem.h"
#include "runtime/runner.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <iomanip>
#include <iostream>
#include <optional>
#include <set>

namespace attnhost::cli {

namespace fs = std::filesystem;

namespace {

// Above this a forward and backward is minutes on the CPU: the tiny preset (7.5 GFLOP) ran at 15.6
// GFLOP/s a rank on a two-core machine, under a second; at that rate small (722) is 46 s, and a run
// times it by warm-ups, timed runs, passes and world sizes.
constexpr double kCpuMinutesGflop = 50;

// Before anything runs: say which runs the plugins will refuse (they are still reported, as
// UNSUPPORTED or SKIPPED, in their place), and on the CPU how heavy the largest case is.
void preflight(const Context& ctx, const std::vector<suite::Case>& cases, const Backend& backend) {
  const int32_t device = backend.device_kind() == DeviceKind::cuda ? ATTNHOST_DEVICE_CUDA : ATTNHOST_DEVICE_CPU;
  if (backend.device_kind() == DeviceKind::cpu) {
    const suite::Case* largest = nullptr;
    double gflop = kCpuMinutesGflop;
    for (const suite::Case& c : cases)
      if (const double g = report::fwd_bwd_gflop(c.problem); g > gflop) gflop = g, largest = &c;
    if (largest)
      log::warn(largest->id + " is " + std::to_string(int64_t(gflop)) + " GFLOP a forward and backward: on the CPU, a " +
                "thread a rank, that is minutes a run, times warm-ups and timed runs (--config tiny takes seconds, the "
                "quick suite about a minute)");
  }
  for (const suite::Case& c : cases) {
    std::shared_ptr<const Plugin> plugin = ctx.registry.find(c.plugin);
    if (!plugin) continue;
    try {
      ProblemBinding binding(c, plugin->description(), device);
      for (int ws : c.world_sizes) {
        std::string why = ws > backend.max_world_size()
                              ? "needs " + std::to_string(ws) + " ranks, " + std::to_string(backend.max_world_size()) + " available"
                              : capability_mismatch(c, plugin->description(), backend.device_kind(), ws);
        if (why.empty()) why = plugin->validate(binding.at(0, ws));
        if (!why.empty()) log::info("will not run " + c.id + " at world size " + std::to_string(ws) + ": " + why);
      }
    } catch (const std::exception& e) {
      log::warn(c.id + ": " + e.what());
    }
  }
}

bool has(const std::vector<std::string>& v, const std::string& x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// The cases already in the folder being resumed (every process reads them: under MPI all ranks
// must skip the same cases).
// Ctrl-C during a run: the cases that finished are in the folder's results.jsonl already, so the
// handler says how many and how to go on, then ends the process (exit 130, as a shell expects).
// Only async-signal-safe calls there: the lines are made before, the count is an atomic.
struct Interrupt {
  std::string before, after;  // "attnhost: interrupted after " N " of M cases; ..."
  std::atomic<int> finished{0};
};
Interrupt* g_interrupt = nullptr;

void on_interrupt(int) {
  if (g_interrupt) {
    char digits[16];
    int n = g_interrupt->finished.load(), len = 0;
    do digits[len++] = static_cast<char>('0' + n % 10); while ((n /= 10) > 0 && len < 15);
    for (int i = 0; i < len / 2; ++i) std::swap(digits[i], digits[len - 1 - i]);
    [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, g_interrupt->before.data(), g_interrupt->before.size());
    w = ::write(STDERR_FILENO, digits, len);
    w = ::write(STDERR_FILENO, g_interrupt->after.data(), g_interrupt->after.size());
  }
  ::_exit(130);
}

// The command that goes on with an interrupted run: the same one, resuming its folder.
std::string resume_command(const Context& ctx, const fs::path& dir) {
  std::string command = "attnhost";
  for (size_t i = 1; i < ctx.argv.size(); ++i) {
    const std::string& a = ctx.argv[i];
    if (a == "--out" || a == "--resume") { ++i; continue; }
    if (a == "--force" || a.rfind("--out=", 0) == 0 || a.rfind("--resume=", 0) == 0) continue;
    command += " " + a;
  }
  return command + " --resume " + dir.string();
}

// A folder of another suite is refused: its cases would mix with this one's.
std::set<std::string> finished_ids(const std::string& resume_dir, const suite::Suite& s) {
  std::set<std::string> ids;
  if (resume_dir.empty()) return ids;
  const fs::path journal = fs::path(resume_dir) / "results.jsonl";
  if (!fs::exists(journal)) throw UsageError("--resume " + resume_dir + ": no results.jsonl in this folder");
  const report::ResultSet done = report::read_journal(journal).results;
  if (done.suite_name != s.name || (!done.suite_text.empty() && done.suite_text != s.text))
    throw UsageError("--resume " + resume_dir + ": this folder holds suite '" + done.suite_name + "'" +
                     (done.suite_name == s.name ? " as another text" : "") + ", not '" + s.name + "'");
  for (const CaseResult& c : done.cases) ids.insert(c.spec.id);
  return ids;
}

// The folder a run was told to write: --resume's, --out, or the suite's [outputs] dir; empty where
// none was named (dated_result_dir then makes one).
fs::path named_result_dir(const suite::Suite& s, const ExecuteOptions& options) {
  if (!options.resume_dir.empty()) {
    if (!options.out_dir.empty() && fs::path(options.out_dir).lexically_normal() != fs::path(options.resume_dir).lexically_normal())
      throw UsageError("--resume " + options.resume_dir + " writes into that folder; --out " + options.out_dir +
                       " contradicts it");
    return options.resume_dir;
  }
  if (!options.out_dir.empty()) return options.out_dir;
  return s.outputs.dir;
}

// A new folder results/<date-time>, made here: runs that start in the same second (two commands
// side by side, a test after a test) take -2, -3, ... after the name, each its own.
fs::path dated_result_dir() {
  const fs::path base = fs::path("results") / now_compact();
  std::error_code ec;
  fs::create_directories(base.parent_path(), ec);
  if (ec) throw UsageError("cannot create result folder " + base.parent_path().string() + ": " + ec.message());
  for (int n = 1; n <= 1000; ++n) {
    const fs::path dir = n == 1 ? base : fs::path(base.string() + "-" + std::to_string(n));
    if (fs::create_directory(dir, ec)) return dir;  // (false: it was there already, or it cannot be made)
    if (ec) throw UsageError("cannot create result folder " + dir.string() + ": " + ec.message());
  }
  throw UsageError("results/: a thousand result folders named " + base.filename().string() + " already; give --out");
}

// One suite case at a time, by the runner or in a child process (--isolate).
CaseResult run_one(Context& ctx, const suite::Case& c, Backend& backend, const ExecuteOptions& options,
                   const RunnerOptions& ro) {
  std::shared_ptr<const Plugin> plugin = ctx.registry.find(c.plugin);
  if (!plugin) {  // the suite was validated against the loaded plugins; this is a lost race
    CaseResult r;
    r.spec = c;
    RunResult missing;
    missing.status = "ERROR";
    missing.error = "plugin '" + c.plugin + "' is not loaded";
    r.runs.push_back(missing);
    return r;
  }
  if (!options.isolate) return run_case(c, plugin, backend, ro);
  IsolateOptions io;
  io.child_args = child_arguments(ctx);
  io.timeout_seconds = options.case_timeout * std::max(1, c.timing.rounds);  // (a case's rounds are one child's)
  CaseResult r = run_case_isolated(c, io);
  if (r.plugin_version.empty()) r.plugin_version = plugin->description().version;
  if (r.device.empty()) r.device = device_kind_name(backend.device_kind());
  if (ro.progress)
    for (const RunResult& run : r.runs)
      ro.progress(c.id + " ws=" + std::to_string(run.world_size) + ": " + run.status +
                  (run.error.empty() ? "" : " (" + run.error + ")"));
  return r;
}

// World size 1 and every rank the machine offers: the GPUs of --gpus, MPI's processes, or two
// threads on the CPU (enough to show a schedule's communication without a long run).
std::vector<int> machine_world_sizes(const Backend& backend) {
  const int most = backend.device_kind() == DeviceKind::cpu ? std::min(2, backend.max_world_size()) : backend.max_world_size();
  return most > 1 ? std::vector<int>{1, most} : std::vector<int>{1};
}

// --heat-seconds: the first case's forward and backward, untimed, unchecked and untraced, at its
// largest world size for that long, so that every GPU the run uses starts its first timed pass at
// the temperature it then runs at. A die warms for 5-10 s of sustained load before its clock holds
// (docs/PERFORMANCE.md, "Clocks and short timings"); a pass's own warm-up (--warmup-seconds) is paid
// at every world size and round, this once. Its result is dropped; a failure only says so.
suite::Case heating_case(const suite::Case& first, double seconds) {
  suite::Case c = first;
  c.world_sizes = {*std::max_element(first.world_sizes.begin(), first.world_sizes.end())};
  c.timing.method = "warmup";
  c.timing.warmup_runs = 1;
  c.timing.warmup_seconds = seconds;
  c.timing.timing_runs = 1;
  c.timing.rounds = 1;
  c.timing.passes = {"fwd_bwd"};
  c.check.enabled = false;
  return c;
}

void heat(Context& ctx, const suite::Case& first, Backend& backend, const ExecuteOptions& options, bool say) {
  const suite::Case c = heating_case(first, options.heat_seconds);
  RunnerOptions ro;
  ro.trace = false;
  const auto start = std::chrono::steady_clock::now();
  const CaseResult r = run_one(ctx, c, backend, options, ro);
  backend.sync_processes();
  if (!say) return;
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "attnhost: heated " << c.id << " at world size " << c.world_sizes.front() << " for "
            << std::fixed << std::setprecision(1) << took << std::defaultfloat << " s";
  for (const RunResult& run : r.runs)
    if (run.status != "OK" && run.status != "PASSED") std::cout << " (" << run.status << (run.error.empty() ? "" : ": " + run.error) << ")";
  std::cout << "\n" << std::flush;
}

}  // namespace

int execute_suite(Context& ctx, const suite::Suite& s, const ExecuteOptions& options) {
  std::unique_ptr<Backend> backend = make_backend(ctx.options.backend);
  // Bad input ends the command before anything runs (a dry run too): a baseline is read now, not after an hour.
  std::optional<report::ResultSet> baseline;
  if (!options.baseline.empty()) baseline = report::load_results(options.baseline);
  if (!options.history.empty()) {
    if (fs::is_directory(options.history))
      throw UsageError("--history " + options.history + " is a folder; give a file (each run appends a line to it)");
    fs::path parent = fs::absolute(options.history).parent_path();
    if (!fs::is_directory(parent)) throw UsageError("--history " + options.history + ": folder " + parent.string() + " does not exist");
  }
  if (options.resume_dir.empty() && !options.force && !options.dry_run) {
    const fs::path dir = named_result_dir(s, options);
    if (!dir.empty() && (fs::exists(dir / "results.jsonl") || fs::exists(dir / "results.json")))
      throw UsageError(dir.string() + " holds the results of a run already; --resume it, give another --out, or --force "
                                      "to write over it");
  }
  const std::set<std::string> done = finished_ids(options.resume_dir, s);
  std::vector<suite::Case> todo;
  for (const suite::Case& c : s.cases)
    if (!done.count(c.id)) {
      todo.push_back(c);
      if (c.machine_world_sizes) todo.back().world_sizes = machine_world_sizes(*backend);
      if (backend->device_kind() == DeviceKind::cuda)
        todo.back().timing.warmup_seconds = std::max(c.timing.warmup_seconds, options.gpu_warmup_seconds);
    }
  if (options.dry_run) {
    std::cout << todo.size() << " cases in " << (s.name.empty() ? s.path.string() : s.name);
    if (!options.resume_dir.empty()) std::cout << " (" << s.cases.size() - todo.size() << " already in " << options.resume_dir << ")";
    std::cout << ":\n";
    for (const suite::Case& c : todo) {
      std::cout << "  " << c.id << "  " << report::problem_line(c.problem) << "  world sizes";
      for (int w : c.world_sizes) std::cout << ' ' << w;
      std::cout << "  timing " << c.timing.method;
      if (c.timing.warmup_seconds > 0) std::cout << " after " << c.timing.warmup_seconds << " s of warm-up";
      std::cout << "\n";
    }
    if (options.heat_seconds > 0 && !todo.empty())
      std::cout << "first, untimed: " << todo.front().id << " at world size " << heating_case(todo.front(), 0).world_sizes.front()
                << " for " << options.heat_seconds << " s (--heat-seconds)\n";
    return kExitOk;
  }

  const bool leader = backend->process_rank() == 0;
  Environment env = probe_environment(*backend);
  env.argv = ctx.argv;
  for (const auto& p : ctx.registry.plugins()) {
    env.plugins[p->name()] = p->description().version;
    env.plugin_files[p->name()] = {p->file().string(), p->build()};
  }
  std::set<std::string> timed;
  for (const suite::Case& c : s.cases) timed.insert(c.plugin);
  for (const std::string& name : timed)
    if (auto p = ctx.registry.find(name); p && p->build().find("unoptimized") != std::string::npos)
      log::warn("plugin '" + name + "' (" + p->file().string() + ") was compiled without optimization: its timings " +
                "say little (build it with -DCMAKE_BUILD_TYPE=Release)");

  std::vector<std::string> formats = options.formats.empty() ? s.outputs.formats : options.formats;
  const bool console = has(formats, "console");
  const bool files = !options.resume_dir.empty() ||
                     std::any_of(formats.begin(), formats.end(), [](const std::string& f) { return f != "console"; });
  std::unique_ptr<report::ResultFolder> folder;
  if (leader && files) {
    const fs::path named = named_result_dir(s, options);
    folder = std::make_unique<report::ResultFolder>(named.empty() ? dated_result_dir() : named, formats,
                                                    !options.resume_dir.empty());
    if (folder->dropped_cut_line())
      log::warn(folder->dir().string() + "/results.jsonl: dropped its last line, cut short when the run was stopped");
    std::vector<std::string> planned;
    for (const suite::Case& c : s.cases) planned.push_back(c.id);
    folder->begin(env, s.name, s.text, planned);
  }
  const bool quiet = ctx.options.quiet;
  if (leader && !quiet) {
    std::cout << "attnhost: " << todo.size() << " cases on " << env.device;
    if (!options.resume_dir.empty()) std::cout << " (resuming " << options.resume_dir << ": " << done.size() << " cases already there)";
    std::cout << "\n" << std::flush;
  }
  if (leader) preflight(ctx, todo, *backend);
  if (options.heat_seconds > 0 && !todo.empty()) heat(ctx, todo.front(), *backend, options, leader && !quiet);

  std::vector<double> weights;
  for (const suite::Case& c : todo) weights.push_back(report::work_estimate(c));
  report::Progress progress(weights, leader && ::isatty(STDOUT_FILENO), quiet || !leader, std::cout);
  RunnerOptions ro;
  ro.progress = [&](const std::string& line) { progress.step(line); };
  std::vector<CaseResult> results;
  Interrupt interrupt;
  if (leader && folder) {
    interrupt.before = "\nattnhost: interrupted after ";
    interrupt.after = " of " + std::to_string(todo.size()) + " cases; their results are in " + folder->dir().string() +
                      "/results.jsonl. To go on: " + resume_command(ctx, folder->dir()) + "\n";
    g_interrupt = &interrupt;
    std::signal(SIGINT, on_interrupt);
  }
  for (size_t i = 0; i < todo.size(); ++i) {
    progress.start_case(i, todo[i].id);
    CaseResult r = run_one(ctx, todo[i], *backend, options, ro);
    progress.finish_case(i);
    backend->sync_processes();
    if (!leader) continue;
    progress.clear();
    if (console && !quiet && !options.verification) {
      if (ctx.options.verbose) report::print_case(std::cout, r);  // the whole block (a compare's too)
      else if (!options.comparison) report::print_case_line(std::cout, r);  // (a compare's table follows)
    }
    if (folder) folder->append(r);
    results.push_back(std::move(r));
    ++interrupt.finished;
  }
  std::signal(SIGINT, SIG_DFL);
  g_interrupt = nullptr;
  progress.clear();
  if (!leader) return kExitOk;

  std::vector<std::string> order;
  for (const suite::Case& c : s.cases) order.push_back(c.id);
  report::ResultSet all;
  if (folder) {
    all = folder->results(order, results);
  } else {
    all.suite_name = s.name;
    all.suite_text = s.text;
    all.environment = env;
    all.sessions = {env};
    all.cases = results;
  }
  if (baseline) {
    report::GateOptions go;
    go.threshold = options.threshold;
    all.gate = report::regression_gate(baseline->cases, all.cases, go, options.baseline);
  }
  if (console) {
    if (options.comparison) report::print_comparison(std::cout, all.cases);
    else if (options.verification) report::print_verification(std::cout, all.cases);
    else report::print_summary(std::cout, all.cases);
  }
  if (all.gate) {
    if (console) report::print_gate(std::cout, *all.gate);
    else std::cout << report::gate_summary(*all.gate) << "\n";
  }
  if (folder) {
    report::ReportsWritten written = report::write_reports(folder->dir(), all, formats);
    if (!written.notice.empty()) log::warn(written.notice);
    if (!quiet) std::cout << "\nresults in " << folder->dir().string() << "\n";
  }
  if (!options.history.empty()) report::append_history(options.history, report::history_entry(all));
  const bool failed = std::any_of(all.cases.begin(), all.cases.end(), [](const CaseResult& r) { return r.failed(); });
  // A run in which no world size of any case ran (every one UNSUPPORTED or SKIPPED) measured nothing.
  const bool ran = std::any_of(all.cases.begin(), all.cases.end(), [](const CaseResult& c) {
    return std::any_of(c.runs.begin(), c.runs.end(), [](const RunResult& r) { return r.status != "UNSUPPORTED" && r.status != "SKIPPED"; });
  });
  if (!ran && !all.cases.empty()) {
    std::cout << "attnhost: nothing ran: every case was unsupported or skipped at every world size\n";
    return kExitCheckFailed;
  }
  return failed || (all.gate && all.gate->slower()) ? kExitCheckFailed : kExitOk;
}

}  // namespace attnhost::cli
