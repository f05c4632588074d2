// The attnhost binary's result folders as a user meets them: a run killed and resumed, the
// regression gate's exit codes, `report` re-rendering, `diff`, `history`, charts with and
// without gnuplot, and bad input as one line with exit 2.
#include "common/json.h"
#include "report/charts.h"
#include "report/result_set.h"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

namespace fs = std::filesystem;
using attnhost::CaseResult;
namespace json = attnhost::json;
namespace report = attnhost::report;

namespace {

struct Outcome {
  int code;
  std::string out;  // stdout and stderr together
};

const std::string kCommon = std::string(" --device cpu --configs ") + CONFIGS_DIR + " --plugin-dir " + TEST_PLUGIN_DIR + "/faulty";

Outcome run_attnhost(const std::string& args, const std::string& env = "") {
  std::string cmd = env + (env.empty() ? "" : " ") + ATTNHOST_BINARY + " " + args + " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  REQUIRE(pipe);
  Outcome o{};
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) o.out.append(buf.data(), n);
  int status = ::pclose(pipe);
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return o;
}

fs::path temp_path(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("attnhost-rcli-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(p);
  return p;
}

fs::path write_file(const std::string& name, const std::string& text) {
  fs::path p = temp_path(name);
  std::ofstream(p) << text;
  return p;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string inline_case(const std::string& name, int seqlen, int heads, int head_dim, const std::string& extra = "") {
  return "[[case]]\nname = \"" + name + "\"\nplugins = [\"naive_attention\"]\nbatch = 1\nseqlen = " + std::to_string(seqlen) +
         "\nheads = " + std::to_string(heads) + "\nhead_dim = " + std::to_string(head_dim) + "\n" + extra;
}

int case_lines(const fs::path& journal) {
  std::ifstream in(journal);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.find("\"kind\":\"case\"") != std::string::npos;
  return n;
}

// Small cases, 9 samples each (the Mann-Whitney test's minimum), world sizes 1 and 2.
std::string gate_suite() {
  return "name = \"gate\"\n[defaults]\nworld_sizes = [1, 2]\n[defaults.timing]\nmethod = \"warmup\"\nwarmup_runs = 1\n"
         "timing_runs = 9\n" + inline_case("a", 64, 2, 16) + inline_case("b", 96, 2, 16);
}

// A copy of a results.json whose every sample is `factor` times the original.
fs::path scaled_results(const fs::path& results, double factor, const std::string& name) {
  json::Value doc = json::parse(slurp(results));
  for (json::Value& c : doc.object()[doc.object().size() - 1].second.array())
    for (auto& [key, runs] : c.object())
      if (key == "runs")
        for (json::Value& run : runs.array())
          for (auto& [rkey, passes] : run.object())
            if (rkey == "passes")
              for (json::Value& pass : passes.array())
                for (auto& [pkey, stats] : pass.object())
                  if (pkey == "time_ms")
                    for (auto& [skey, samples] : stats.object())
                      if (skey == "samples_ms")
                        for (json::Value& s : samples.array()) s = json::Value(s.number() * factor);
  fs::path out = temp_path(name);
  std::ofstream(out) << doc.dump(1);
  return out;
}

// A suite of three cases, the middle one slow enough to be running when the first has finished.
std::string three_cases(const std::string& name) {
  return "name = \"" + name + "\"\n[defaults.timing]\nmethod = \"simple\"\n" + inline_case("first", 32, 2, 16) +
         inline_case("slow", 512, 4, 64) + inline_case("last", 48, 2, 16);
}

// Runs `suite` into `out` in a child process and sends it `sig` once the first case is in the
// journal (the slow case is then running); its stderr goes to `err` (nowhere when empty). Returns
// the wait status.
int run_and_signal_after_first_case(const fs::path& suite, const fs::path& out, int sig, const fs::path& err = {}) {
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(err.empty() ? null : ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 2);
    ::execl(ATTNHOST_BINARY, ATTNHOST_BINARY, "run", suite.c_str(), "--device", "cpu", "--configs", CONFIGS_DIR, "--out",
            out.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (case_lines(out / "results.jsonl") < 1 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ::kill(pid, sig);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

}  // namespace

TEST_CASE("cli reports: a run killed in the middle and resumed ends with every case exactly once") {
  fs::path suite = write_file("slow.toml", three_cases("slow"));
  fs::path out = temp_path("killed");
  // Killed as soon as the first case is in the journal: the slow case is then running.
  const int status = run_and_signal_after_first_case(suite, out, SIGKILL);
  REQUIRE(WIFSIGNALED(status));
  const int before = case_lines(out / "results.jsonl");
  REQUIRE(before >= 1);
  REQUIRE(before < 3);
  CHECK_FALSE(fs::exists(out / "results.json"));  // the killed run wrote no final report

  Outcome resumed = run_attnhost("run " + suite.string() + " --resume " + out.string() + kCommon);
  CHECK(resumed.code == 0);
  CHECK(resumed.out.find("resuming " + out.string() + ": " + std::to_string(before) + " cases already there") != std::string::npos);
  CHECK(resumed.out.find("case 1 of " + std::to_string(3 - before)) != std::string::npos);

  report::ResultSet all = report::load_results(out / "results.json");
  std::map<std::string, int> seen;
  for (const CaseResult& c : all.cases) ++seen[c.spec.id];
  CHECK(seen == std::map<std::string, int>{{"naive_attention/first", 1}, {"naive_attention/slow", 1}, {"naive_attention/last", 1}});
  CHECK(all.cases[0].spec.id == "naive_attention/first");  // the suite's order, old and new together
  CHECK(all.cases[2].spec.id == "naive_attention/last");
  CHECK(all.sessions.size() == 2);
  CHECK(case_lines(out / "results.jsonl") == 3);  // the resumed run ran only what was missing
  CHECK(slurp(out / "results.csv").find("naive_attention/slow") != std::string::npos);
  CHECK(slurp(out / "report.md").find("2 (resumed)") != std::string::npos);

  // Resuming a finished folder runs nothing and reports it all again.
  Outcome again = run_attnhost("run " + suite.string() + " --resume " + out.string() + kCommon);
  CHECK(again.code == 0);
  CHECK(again.out.find("attnhost: 0 cases") != std::string::npos);
  CHECK(case_lines(out / "results.jsonl") == 3);
  CHECK(report::load_results(out / "results.json").cases.size() == 3);

  // Another suite's run into this folder is refused: its cases would mix with these.
  fs::path other = write_file("other.toml", "name = \"other\"\n" + inline_case("first", 32, 2, 16));
  Outcome mixed = run_attnhost("run " + other.string() + " --resume " + out.string() + kCommon);
  CHECK(mixed.code == 2);
  CHECK(mixed.out == "attnhost: error: --resume " + out.string() + ": this folder holds suite 'slow', not 'other'\n");
  CHECK(case_lines(out / "results.jsonl") == 3);
  fs::remove_all(out);
  fs::remove(suite);
  fs::remove(other);
}

TEST_CASE("cli reports: a baseline from a faster run fails the gate, one from the same run passes") {
  fs::path suite = write_file("gate.toml", gate_suite());
  fs::path first = temp_path("gate-first");
  Outcome o = run_attnhost("run " + suite.string() + kCommon + " --out " + first.string());
  REQUIRE(o.code == 0);

  // A hundred times faster samples: every case is SLOWER, even at the largest threshold (1000%),
  // which keeps a re-run on a loaded machine (seen 16x slower under a parallel build) SAME below.
  fs::path fast = scaled_results(first / "results.json", 0.01, "fast.json");
  fs::path second = temp_path("gate-second");
  Outcome slow = run_attnhost("run " + suite.string() + kCommon + " --out " + second.string() + " --baseline " + fast.string() +
                          " --threshold 1000");
  CHECK(slow.code == 1);
  CHECK(slow.out.find("8 SLOWER") != std::string::npos);  // 2 cases x 2 world sizes x 2 passes
  CHECK(slow.out.find("Mann-Whitney") != std::string::npos);
  report::ResultSet gated = report::load_results(second / "results.json");
  REQUIRE(gated.gate.has_value());
  CHECK(gated.gate->count("SLOWER") == 8);
  for (const report::GateRow& r : gated.gate->rows) CHECK(r.p_value.has_value());  // 9 samples on both sides
  CHECK(slurp(second / "report.md").find("## Regression gate") != std::string::npos);

  // The same run as the baseline: a re-run is within noise of it. (Into the same folder: refused,
  // then written over with --force.)
  Outcome refused = run_attnhost("run " + suite.string() + kCommon + " --out " + second.string());
  CHECK(refused.code == 2);
  CHECK(refused.out == "attnhost: error: " + second.string() +
                           " holds the results of a run already; --resume it, give another --out, or --force to write "
                           "over it\n");
  Outcome same = run_attnhost("run " + suite.string() + kCommon + " --out " + second.string() + " --force --baseline " +
                          (first / "results.json").string() + " --threshold 1000");
  CHECK(same.code == 0);
  CHECK(same.out.find("8 SAME") != std::string::npos);

  // Records against themselves, at the default threshold: all SAME, exit 0.
  Outcome diff_same = run_attnhost("diff " + first.string() + " " + first.string());
  CHECK(diff_same.code == 0);
  CHECK(diff_same.out.find("8 SAME") != std::string::npos);
  Outcome diff_slow = run_attnhost("diff " + fast.string() + " " + first.string());
  CHECK(diff_slow.code == 1);
  CHECK(diff_slow.out.find("8 SLOWER") != std::string::npos);
  Outcome diff_fast = run_attnhost("diff " + first.string() + " " + fast.string());
  CHECK(diff_fast.code == 0);
  CHECK(diff_fast.out.find("8 FASTER") != std::string::npos);
  fs::remove_all(first);
  fs::remove_all(second);
  fs::remove(fast);
  fs::remove(suite);
}

TEST_CASE("cli reports: `report DIR` writes every report again, byte for byte") {
  fs::path suite = write_file("render.toml", gate_suite());
  fs::path dir = temp_path("render");
  Outcome o = run_attnhost("run " + suite.string() + kCommon + " --out " + dir.string() +
                       " --format console,json,jsonl,csv,markdown,trace,charts");
  REQUIRE(o.code == 0);
  std::vector<std::string> files = {"results.json", "results.csv", "report.md", "trace.json", "index.html"};
  if (report::find_gnuplot()) files.push_back("charts/a-efficiency.svg");
  std::map<std::string, std::string> original;
  for (const std::string& f : files) {
    REQUIRE(fs::exists(dir / f));
    original[f] = slurp(dir / f);
    fs::remove(dir / f);
  }
  Outcome r = run_attnhost("report " + dir.string());
  CHECK(r.code == 0);
  CHECK(r.out.find("naive_attention/a") != std::string::npos);  // the summary
  for (const std::string& f : files) CHECK_MESSAGE(slurp(dir / f) == original[f], f);

  // From the journal alone (a stopped run): the same reports.
  fs::remove(dir / "results.json");
  CHECK(run_attnhost("report " + (dir / "results.jsonl").string() + " --quiet").code == 0);
  CHECK(slurp(dir / "report.md") == original["report.md"]);
  CHECK(slurp(dir / "results.csv") == original["results.csv"]);
  fs::remove_all(dir);
  fs::remove(suite);
}

TEST_CASE("cli reports: without gnuplot on PATH the run says so once and writes everything else") {
  fs::path suite = write_file("nognuplot.toml", gate_suite());
  fs::path dir = temp_path("nognuplot");
  Outcome o = run_attnhost("run " + suite.string() + kCommon + " --out " + dir.string() +
                       " --format console,json,csv,markdown,trace,charts", "PATH=/nonexistent");
  CHECK(o.code == 0);
  const std::string notice = "gnuplot not found on PATH: no charts drawn (install gnuplot-nox); every other report is written";
  size_t first = o.out.find(notice);
  CHECK(first != std::string::npos);
  CHECK(o.out.find(notice, first + 1) == std::string::npos);
  for (const char* f : {"results.json", "results.jsonl", "results.csv", "report.md", "trace.json", "index.html"})
    CHECK(fs::exists(dir / f));
  CHECK_FALSE(fs::exists(dir / "charts" / "a-efficiency.svg"));

  if (report::find_gnuplot()) {  // with it, the same run draws the efficiency chart of its group
    fs::remove_all(dir);
    Outcome drawn = run_attnhost("run " + suite.string() + kCommon + " --out " + dir.string() + " --format json,markdown,charts");
    CHECK(drawn.code == 0);
    CHECK(drawn.out.find("gnuplot not found") == std::string::npos);
    CHECK(drawn.out.find("gnuplot failed") == std::string::npos);
    const std::string svg = slurp(dir / "charts" / "a-efficiency.svg");
    CHECK(svg.find("<svg") != std::string::npos);
    CHECK(svg.find("parallel efficiency") != std::string::npos);
    CHECK(svg.find("naive_attention") != std::string::npos);
    CHECK(slurp(dir / "report.md").find("](charts/a-efficiency.svg)") != std::string::npos);
    CHECK(slurp(dir / "index.html").find("<img src=\"charts/a-efficiency.svg\"") != std::string::npos);
  }
  fs::remove_all(dir);
  fs::remove(suite);
}

TEST_CASE("cli reports: --history appends a summary per run and `history` shows each case's trend") {
  fs::path suite = write_file("hist.toml", gate_suite());
  fs::path history = temp_path("history.jsonl");
  for (int i = 0; i < 2; ++i)
    REQUIRE(run_attnhost("run " + suite.string() + kCommon + " --format console --quiet --history " + history.string()).code == 0);
  std::ifstream in(history);
  int runs = 0;
  for (std::string line; std::getline(in, line);) ++runs;
  CHECK(runs == 2);
  Outcome h = run_attnhost("history " + history.string() + " --case 'naive_attention/a' --threshold 1000");
  CHECK(h.code == 0);
  CHECK(h.out.find("2 runs") != std::string::npos);
  CHECK(h.out.find("naive_attention/a") != std::string::npos);
  CHECK(h.out.find("naive_attention/b") == std::string::npos);
  if (report::find_gnuplot()) CHECK(slurp(fs::path(history).replace_extension(".svg")).find("naive_attention/a ws=1 fwd") != std::string::npos);
  fs::remove(history);
  fs::remove(fs::path(history).replace_extension(".svg"));
  fs::remove(fs::path(history).replace_extension(".gp"));
  fs::remove(suite);
}

TEST_CASE("cli reports: every bad input is one line and exit 2") {
  fs::path suite = write_file("bad.toml", gate_suite());
  auto one_line = [](const Outcome& o, const std::string& expected) {
    CHECK(o.code == 2);
    CHECK(o.out == "attnhost: error: " + expected + "\n");
  };
  one_line(run_attnhost("run " + suite.string() + kCommon + " --baseline /nonexistent/results.json"),
           "/nonexistent/results.json: no such file or folder");
  fs::path broken = write_file("broken.json", "{\"schema_version\": 1, \"cases\": [");
  Outcome b = run_attnhost("run " + suite.string() + kCommon + " --baseline " + broken.string());
  CHECK(b.code == 2);
  CHECK(b.out.rfind("attnhost: error: " + broken.string() + ": malformed JSON", 0) == 0);
  CHECK(std::count(b.out.begin(), b.out.end(), '\n') == 1);
  one_line(run_attnhost("run " + suite.string() + kCommon + " --threshold much"),
           "--threshold: 'much' is not a percentage between 0 and 1000 (e.g. 20 or 20%)");
  fs::path empty = temp_path("empty-dir");
  fs::create_directories(empty);
  one_line(run_attnhost("run " + suite.string() + kCommon + " --resume " + empty.string()),
           "--resume " + empty.string() + ": no results.jsonl in this folder");
  one_line(run_attnhost("report " + empty.string()), empty.string() + ": no results.json or results.jsonl in this folder");
  one_line(run_attnhost("report"), "report: which result folder? (attnhost report DIR)");
  one_line(run_attnhost("diff " + empty.string()), "diff: name two result folders (attnhost diff BASELINE CURRENT)");
  one_line(run_attnhost("history /nonexistent/history.jsonl"), "/nonexistent/history.jsonl: cannot read");
  fs::path not_history = write_file("not-history.jsonl", "{\"kind\": \"case\"}\n");
  Outcome nh = run_attnhost("history " + not_history.string());
  CHECK(nh.code == 2);
  CHECK(nh.out.rfind("attnhost: error: " + not_history.string() + ":1: not an attnhost history line", 0) == 0);
  one_line(run_attnhost("history " + not_history.string() + " --threshold -5"),
           "--threshold: '-5' is not a percentage between 0 and 1000 (e.g. 20 or 20%)");
  fs::remove(broken);
  fs::remove(not_history);
  fs::remove_all(empty);
  fs::remove(suite);
}

TEST_CASE("cli reports: Ctrl-C says which cases finished and how to go on") {
  fs::path suite = write_file("interrupted.toml", three_cases("interrupted"));
  fs::path out = temp_path("interrupted");
  fs::path said = temp_path("interrupted-stderr");
  const int status = run_and_signal_after_first_case(suite, out, SIGINT, said);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 130);
  const int finished = case_lines(out / "results.jsonl");
  const std::string text = slurp(said);
  CHECK(text.find("attnhost: interrupted after " + std::to_string(finished) + " of 3 cases; their results are in " +
                  out.string() + "/results.jsonl. To go on: attnhost run " + suite.string()) != std::string::npos);
  CHECK(text.find("--resume " + out.string()) != std::string::npos);
  // report on the folder says what never ran.
  Outcome r = run_attnhost("report " + out.string() + " --format console");
  CHECK(r.code == 0);
  CHECK(r.out.find("attnhost: " + std::to_string(3 - finished) + " of 3 cases of suite 'interrupted' never ran (the run "
                   "was stopped before them: ") != std::string::npos);
  CHECK(r.out.find("attnhost run SUITE --resume " + out.string() + " runs them") != std::string::npos);
  fs::remove_all(out);
  fs::remove(said);
  fs::remove(suite);
}
