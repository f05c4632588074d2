// The attnhost binary as a new user meets it: each bad input prints one line and exits 2.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct Outcome {
  int code;
  std::string out;  // stdout and stderr together
};

// cwd: where the command runs (the test's own folder where it writes one by default).
Outcome attnhost(const std::string& args, const fs::path& cwd = {}) {
  std::string cmd = (cwd.empty() ? "" : "cd '" + cwd.string() + "' && ") + std::string(ATTNHOST_BINARY) + " " + args + " 2>&1";
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

// The one line a failing command printed.
void one_line_error(const Outcome& o, const std::string& expected, int code = 2) {
  CHECK(o.code == code);
  CHECK(o.out == "attnhost: error: " + expected + "\n");
}

fs::path write_suite(const std::string& name, const std::string& text) {
  fs::path p = fs::temp_directory_path() / ("attnhost-cli-" + std::to_string(::getpid()) + "-" + name + ".toml");
  std::ofstream(p) << text;
  return p;
}

const std::string kPlugins = std::string(" --plugin-dir ") + TEST_PLUGIN_DIR + "/faulty";

}  // namespace

TEST_CASE("cli: version, help and an unknown command") {
  CHECK(attnhost("--version").out.rfind("attnhost ", 0) == 0);
  CHECK(attnhost("--help").code == 0);
  CHECK(attnhost("run --help").out.find("--timing-method") != std::string::npos);
  one_line_error(attnhost("rnu x.toml"), "unknown command 'rnu' (did you mean 'run'?); see attnhost --help");
}

TEST_CASE("cli: list plugins -v shows the example plugin with capabilities and parameters") {
  Outcome o = attnhost("list plugins -v");
  CHECK(o.code == 0);
  CHECK(o.out.find("naive_attention 1.0.0") != std::string::npos);
  CHECK(o.out.find("features: causal,noncausal,window,gqa,varlen,backward") != std::string::npos);
  CHECK(o.out.find("param cpu_accumulate (string, default \"fp32\", one of fp32 fp64)") != std::string::npos);
}

TEST_CASE("cli: bad usage") {
  one_line_error(attnhost("run"), "run: which suite? (attnhost run SUITE.toml)");
  one_line_error(attnhost("run /nonexistent/suite.toml"), "suite file /nonexistent/suite.toml not found");
  one_line_error(attnhost("compare naive_attention"), "compare: which preset? add --config NAME (attnhost list configs)");
  one_line_error(attnhost("compare naive_atention --config tiny --dry-run"),
                 "command line: unknown plugin 'naive_atention' (did you mean 'naive_attention'?)");
  one_line_error(attnhost("compare naive_attention --config tiyn --dry-run"),
                 "--config: unknown preset or preset set 'tiyn' (did you mean 'tiny'?)");
  one_line_error(attnhost("compare naive_attention --config tiny --world-sizes 1,x"), "--world-sizes: 'x' is not an integer");
  one_line_error(attnhost("compare naive_attention --config tiny --window 5"), "--window takes two values L,R (e.g. 512,0)");
  one_line_error(attnhost("list things"), "list what? configs, plugins or suites (got 'things')");
  one_line_error(attnhost("run x.toml --device gpu"), "suite file x.toml not found");
  one_line_error(attnhost("compare naive_attention --config tiny --device cpu --ranks-per-gpu 2"),
                 "--ranks-per-gpu shares GPUs among ranks: it takes a GPU run (--device cuda or auto with a GPU)");
  one_line_error(attnhost("compare naive_attention --config tiny --device cpu --ranks-per-gpu 0"),
                 "--ranks-per-gpu must be at least 1, not 0");
  Outcome bad_option = attnhost("run x.toml --frobnicate");
  CHECK(bad_option.code == 2);
  CHECK(bad_option.out == "attnhost: error: unrecognised option '--frobnicate' (see attnhost run --help)\n");
}

TEST_CASE("cli: a bad suite names file:line:column") {
  fs::path syntax = write_suite("syntax", "name = \"x\"\n[[case]\nplugins = 1\n");
  Outcome o = attnhost("run " + syntax.string());
  CHECK(o.code == 2);
  CHECK(o.out.rfind("attnhost: error: " + syntax.string() + ":2:", 0) == 0);
  CHECK(std::count(o.out.begin(), o.out.end(), '\n') == 1);
  fs::path unknown = write_suite("unknown", "[[case]]\nplugins = [\"naive_attention\"]\npresets = [\"tiny\"]\nhaeds = 4\n");
  Outcome u = attnhost("run " + unknown.string());
  CHECK(u.code == 2);
  CHECK(u.out.find(unknown.string() + ":4:1: ") != std::string::npos);
  CHECK(u.out.find("did you mean 'heads'?") != std::string::npos);
  fs::remove(syntax);
  fs::remove(unknown);
}

TEST_CASE("cli: a failed check exits 1 and the run still writes its results") {
  fs::path out = fs::temp_directory_path() / ("attnhost-cli-out-" + std::to_string(::getpid()));
  fs::path suite = write_suite("faulty", R"([[case]]
name = "planted"
plugins = ["faulty"]
batch = 1
seqlen = 64
heads = 4
head_dim = 16
causal = true
world_sizes = [1, 2]
[case.params]
fault = "o_element"
[[case]]
name = "clean"
plugins = ["naive_attention"]
batch = 1
seqlen = 64
heads = 4
head_dim = 16
)");
  Outcome o = attnhost("run " + suite.string() + kPlugins + " --device cpu --timing-method simple --out " + out.string());
  CHECK(o.code == 1);
  CHECK(o.out.find("FAILED") != std::string::npos);
  CHECK(fs::exists(out / "results.json"));
  std::ifstream jsonl(out / "results.jsonl");
  int lines = 0;
  for (std::string line; std::getline(jsonl, line);) ++lines;
  CHECK(lines == 3);  // the header and both cases
  fs::remove_all(out);
  fs::remove(suite);
}

TEST_CASE("cli: compare prints plugins side by side with ratios") {
  Outcome o = attnhost("compare naive_attention faulty --config tiny --seqlen 64 --batch 1 --heads 2 --world-sizes 1,2 "
                       "--timing-method simple --device cpu" + kPlugins);
  CHECK(o.code == 0);
  CHECK(o.out.find("plugin (ws=2)") != std::string::npos);
  CHECK(o.out.find("ratio to the first plugin") != std::string::npos);
  CHECK(o.out.find("   problem  ") == std::string::npos);
  // With -v each case's whole block too (each rank's medians, its board, the engine), then the table.
  Outcome full = attnhost("compare naive_attention --config tiny --seqlen 64 --batch 1 --heads 2 --world-sizes 1,2 "
                          "--timing-method simple --device cpu -v" + kPlugins);
  CHECK(full.code == 0);
  CHECK(full.out.find("   problem  ") != std::string::npos);
  CHECK(full.out.find("plugin (ws=2)") != std::string::npos);
}

TEST_CASE("cli: under --isolate a segfault, an abort and a hang cost only their own case") {
  fs::path out = fs::temp_directory_path() / ("attnhost-cli-isolate-" + std::to_string(::getpid()));
  auto faulty_case = [](const std::string& name, const std::string& fault, const std::string& ws) {
    return "[[case]]\nname = \"" + name + "\"\nplugins = [\"faulty\"]\nbatch = 1\nseqlen = 32\nheads = 2\nhead_dim = 16\n"
           "world_sizes = " + ws + "\n[case.params]\nfault = \"" + fault + "\"\n";
  };
  fs::path suite = write_suite("isolate", faulty_case("seg", "segfault", "[1, 2]") + faulty_case("abort", "abort", "[1]") +
                                              faulty_case("hang", "hang", "[1]") + faulty_case("fine", "none", "[1, 2]"));
  Outcome o = attnhost("run " + suite.string() + kPlugins +
                       " --device cpu --timing-method simple --isolate --case-timeout 3 --format console,json --out " + out.string());
  CHECK(o.code == 1);
  CHECK(o.out.find("faulty/seg ws=1: CRASHED (the case's process died of signal 11 (Segmentation fault)") != std::string::npos);
  CHECK(o.out.find("faulty/abort ws=1: CRASHED (the case's process died of signal 6 (Aborted)") != std::string::npos);
  CHECK(o.out.find("faulty/hang ws=1: TIMEOUT (killed after the 3 s time limit") != std::string::npos);
  CHECK(o.out.find("faulty/fine ws=2: PASSED") != std::string::npos);
  CHECK(fs::exists(out / "results.json"));
  fs::remove_all(out);
  fs::remove(suite);
}

TEST_CASE("cli: compare and run show world size 1 and the machine's ranks unless told otherwise") {
  // A comparison at world size 1 alone hid what a schedule is for (ring and zigzag both read 1.00x).
  Outcome compared = attnhost("compare naive_attention --config tiny --dry-run --device cpu");
  CHECK(compared.code == 0);
  CHECK(compared.out.find("world sizes 1 2  timing") != std::string::npos);
  Outcome told = attnhost("compare naive_attention --config tiny --dry-run --device cpu --world-sizes 1");
  CHECK(told.out.find("world sizes 1  timing") != std::string::npos);
  // A compare's sustained warm-up is a GPU's (its clock settling at the power limit): none on the CPU
  // unless asked for.
  CHECK(compared.out.find("warm-up") == std::string::npos);
  Outcome warmed = attnhost("compare naive_attention --config tiny --dry-run --device cpu --warmup-seconds 2");
  CHECK(warmed.out.find("timing warmup after 2 s of warm-up") != std::string::npos);
  const fs::path unwritten = write_suite("unwritten", "name = \"unwritten\"\n[[case]]\nplugins = [\"naive_attention\"]\npresets = [\"tiny\"]\n");
  const fs::path written = write_suite("written", "name = \"written\"\n[defaults]\nworld_sizes = [1]\n[[case]]\nplugins = [\"naive_attention\"]\npresets = [\"tiny\"]\n");
  CHECK(attnhost("run " + unwritten.string() + " --dry-run --device cpu").out.find("world sizes 1 2  timing") != std::string::npos);
  CHECK(attnhost("run " + written.string() + " --dry-run --device cpu").out.find("world sizes 1  timing") != std::string::npos);
  fs::remove(unwritten);
  fs::remove(written);
}

// A run that names no folder writes results/<date-time>. Where that name is taken (another run that
// started in the same second) it takes the name with -2 after it, and the other's results stay as
// they were; it once stopped with "holds the results of a run already", and two commands started
// side by side could not both run.
TEST_CASE("cli: a run that names no result folder never meets another run's") {
  const fs::path dir = fs::temp_directory_path() / ("attnhost-cli-" + std::to_string(::getpid()) + "-dated");
  fs::remove_all(dir);
  // Every second the run may start in, taken by an earlier run's results.
  const auto now = std::chrono::system_clock::now();
  std::vector<fs::path> taken;
  for (int second = -1; second < 60; ++second) {
    const std::time_t t = std::chrono::system_clock::to_time_t(now + std::chrono::seconds(second));
    std::tm tm{};
    localtime_r(&t, &tm);
    char name[32];
    std::strftime(name, sizeof name, "%Y%m%d-%H%M%S", &tm);
    taken.push_back(dir / "results" / name);
    fs::create_directories(taken.back());
    std::ofstream(taken.back() / "results.json") << "{}";
  }
  const Outcome o = attnhost("compare naive_attention --config tiny --seqlen 128 --device cpu --world-sizes 1 "
                             "--timing-method simple --no-check --format json --quiet",
                             dir);
  CHECK(o.code == 0);
  CHECK(o.out.find("error") == std::string::npos);
  int fresh = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(dir / "results")) {
    const std::string name = e.path().filename().string();
    if (name.size() > 2 && name.compare(name.size() - 2, 2, "-2") == 0) {
      ++fresh;
      CHECK(fs::file_size(e.path() / "results.json") > 2);
    }
  }
  CHECK(fresh == 1);
  for (const fs::path& p : taken) CHECK(fs::file_size(p / "results.json") == 2);
  fs::remove_all(dir);
}

TEST_CASE("cli: --heat-seconds runs the first case untimed at its largest world size, once, before the timed cases") {
  const fs::path two = write_suite("heat", "name = \"heat\"\n[defaults]\nworld_sizes = [1, 2]\n"
                                           "[[case]]\nname = \"first\"\nplugins = [\"naive_attention\"]\nbatch = 1\nseqlen = 64\n"
                                           "heads = 2\nhead_dim = 16\n"
                                           "[[case]]\nname = \"second\"\nplugins = [\"naive_attention\"]\nbatch = 1\nseqlen = 64\n"
                                           "heads = 2\nhead_dim = 16\n");
  const Outcome planned = attnhost("run " + two.string() + " --dry-run --device cpu --heat-seconds 3");
  CHECK(planned.out.find("first, untimed: naive_attention/first at world size 2 for 3 s (--heat-seconds)") != std::string::npos);
  const auto start = std::chrono::steady_clock::now();
  // (Console only: the run leaves no result folder behind.)
  const Outcome heated = attnhost("run " + two.string() + " --device cpu --timing-method simple --heat-seconds 0.5 --format console");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(heated.code == 0);
  const size_t line = heated.out.find("attnhost: heated naive_attention/first at world size 2 for ");
  CHECK(line != std::string::npos);
  CHECK(heated.out.find("attnhost: heated", line + 1) == std::string::npos);  // once, not a case
  CHECK(line < heated.out.find("naive_attention/first ws=1"));                 // before the timed cases
  CHECK(took >= 0.5);
  const Outcome bad = attnhost("run " + two.string() + " --device cpu --heat-seconds 700");
  CHECK(bad.code == 2);
  CHECK(bad.out.find("attnhost: error: --heat-seconds must be between 0 and 600, got 700") != std::string::npos);
  fs::remove(two);
}

TEST_CASE("cli: --case runs only the named cases, and names the suite's cases when none is") {
  const fs::path two = write_suite("two_cases", "name = \"two\"\n[defaults]\nworld_sizes = [1]\n"
                                                "[[case]]\nname = \"first\"\nplugins = [\"naive_attention\"]\npresets = [\"tiny\"]\n"
                                                "[[case]]\nname = \"second\"\nplugins = [\"naive_attention\"]\npresets = [\"tiny\"]\n");
  const Outcome all = attnhost("run " + two.string() + " --dry-run --device cpu");
  CHECK(all.out.find("2 cases in two") != std::string::npos);
  const Outcome one = attnhost("run " + two.string() + " --dry-run --device cpu --case second");
  CHECK(one.code == 0);
  CHECK(one.out.find("1 cases in two") != std::string::npos);
  CHECK(one.out.find("naive_attention/second") != std::string::npos);
  one_line_error(attnhost("run " + two.string() + " --dry-run --device cpu --case third"),
                 "--case third: two has no case of that name (first, second)");
  fs::remove(two);
}

TEST_CASE("cli: verify prints each tensor's error against float64 and its tolerance, and no timings") {
  // Timings of first calls once read "609.40x speedup, 30470.0% efficiency" in verify's table.
  Outcome o = attnhost("verify naive_attention --device cpu --world-sizes 1,2 --set correctness --quiet");
  CHECK(o.code == 0);
  CHECK(o.out.find("O err / tol") != std::string::npos);
  CHECK(o.out.find("dV err / tol") != std::string::npos);
  CHECK(o.out.find("TFLOP/s") == std::string::npos);
  CHECK(o.out.find("speedup") == std::string::npos);
}

TEST_CASE("cli: verify --dtype checks every case in that element type, and a wrong one is a usage error") {
  Outcome o = attnhost("verify naive_attention --device cpu --world-sizes 1 --set multi_gpu --dtype fp8_e4m3 --quiet");
  CHECK(o.code == 0);
  CHECK(o.out.find("dtype=fp8_e4m3") != std::string::npos);
  CHECK(o.out.find("0 failed") != std::string::npos);
  one_line_error(attnhost("verify naive_attention --device cpu --dtype fp9"),
                 "command line: --dtype: unknown dtype 'fp9' (expected bf16, fp16, fp32, fp8_e4m3 or fp8_e5m2)");
}

TEST_CASE("cli: bad input ends the command before anything runs, a dry run too") {
  one_line_error(attnhost("compare naive_attention --config tiny --dry-run --gpus -1"),
                 "--gpus must be 0 (every visible GPU) or more, not -1");
  one_line_error(attnhost("compare naive_attention --config tiny --dry-run --device bogus"),
                 "--device must be auto, cuda or cpu, not 'bogus'");
  const fs::path folder = fs::temp_directory_path();
  one_line_error(attnhost("run " + folder.string() + " --dry-run --device cpu"),
                 folder.string() + " is a folder; run takes a suite file (SUITE.toml) or a shipped suite's name");
  one_line_error(attnhost("compare naive_attention --config tiny --dry-run --device cpu --history " + folder.string()),
                 "--history " + folder.string() + " is a folder; give a file (each run appends a line to it)");
  const fs::path not_results = write_suite("not_results", "name = \"x\"\n");
  const Outcome baseline = attnhost("compare naive_attention --config tiny --dry-run --device cpu --baseline " + not_results.string());
  CHECK(baseline.code == 2);
  CHECK(baseline.out.find("cases in compare") == std::string::npos);
  fs::remove(not_results);
}

TEST_CASE("cli: compare writes a result folder with --out, and takes --resume and --isolate as run does") {
  const fs::path out = fs::temp_directory_path() / ("attnhost-cli-" + std::to_string(::getpid()) + "-compare-out");
  fs::remove_all(out);
  const std::string args = "compare naive_attention --config tiny --seqlen 64 --batch 1 --heads 2 --world-sizes 1 "
                           "--timing-method simple --device cpu";
  Outcome o = attnhost(args + " --out " + out.string());
  CHECK(o.code == 0);
  CHECK(fs::exists(out / "results.json"));  // files without --format: a folder was asked for
  CHECK(fs::exists(out / "report.md"));
  Outcome resumed = attnhost(args + " --resume " + out.string());
  CHECK(resumed.code == 0);
  CHECK(resumed.out.find("1 cases already there") != std::string::npos);
  Outcome isolated = attnhost(args + " --isolate --out " + out.string() + " --force");
  CHECK(isolated.code == 0);
  fs::remove_all(out);
}

TEST_CASE("cli: a run in which nothing ran says so and exits 1") {
  // It once reported "0 failed" and exited 0.
  Outcome o = attnhost("compare zigzag --config tiny --world-sizes 1 --no-causal --device cpu");  // zigzag is causal only
  INFO(o.out);
  CHECK(o.code == 1);
  CHECK(o.out.find("attnhost: nothing ran: every case was unsupported or skipped at every world size") != std::string::npos);
  // A world size past the CPU's ranks is skipped at once (it once started 1000 threads for minutes).
  const auto start = std::chrono::steady_clock::now();
  Outcome many = attnhost("compare naive_attention --config tiny --seqlen 256 --world-sizes 1000 --device cpu");
  INFO(many.out);
  CHECK(many.code == 1);
  CHECK(many.out.find("needs 1000 ranks") != std::string::npos);
  CHECK(many.out.find("64 available") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
}

TEST_CASE("cli: run prints a line a case, and its whole block with -v") {
  // The 25-line block a case once printed by default buried the results.
  Outcome brief = attnhost("run quick --device cpu --world-sizes 1 --timing-runs 1 --warmup-runs 0 --format console");
  INFO(brief.out);
  CHECK(brief.code == 0);
  CHECK(brief.out.find("naive_attention/causal  ws=1 ") != std::string::npos);
  CHECK(brief.out.find("   problem  ") == std::string::npos);
  Outcome full = attnhost("run quick --device cpu --world-sizes 1 --timing-runs 1 --warmup-runs 0 --format console -v");
  CHECK(full.code == 0);
  CHECK(full.out.find("   problem  ") != std::string::npos);
}
