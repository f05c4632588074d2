// results.json and results.jsonl: a result set survives JSON byte for byte, a journal cut short
// by a kill loses only its last line, and every bad file is one line naming it.
#include "common/errors.h"
#include "report/derived.h"
#include "report/files.h"
#include "report/render.h"
#include "report/result_set.h"
#include "report/serialize.h"
#include "report_test_support.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;
using namespace attnhost;
using namespace attnhost::report;
using test::made_case;
using test::made_run;
using test::timed_pass;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("attnhost-report-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

ResultSet sample_set() {
  ResultSet r;
  r.suite_name = "s";
  r.suite_text = "name = \"s\"\n";
  r.environment.date = "2026-01-01T00:00:00+0000";
  r.environment.device = "cpu";
  r.environment.plugins = {{"naive_attention", "1.0.0"}};
  r.environment.argv = {"attnhost", "run", "s.toml"};
  r.sessions = {r.environment};
  r.cases = {made_case("naive_attention/g/seqlen=128", 128, {made_run(1, {timed_pass("fwd", {1.5, 1.25, 1.75})})}),
             made_case("naive_attention/g/seqlen=256", 256, {made_run(1, {timed_pass("fwd", {4.5, 4.25})})})};
  return r;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("result set: results.json is a fixed point of read and write") {
  const std::string once = to_json(sample_set()).dump(1);
  const std::string twice = to_json(result_set_from_json(json::parse(once))).dump(1);
  CHECK(once == twice);
  CHECK(once.find("\"schema_version\": 1") != std::string::npos);
}

TEST_CASE("result set: a world whose ranks shared GPUs keeps its times, with no speedup made of them") {
  RunResult shared = made_run(2, {timed_pass("fwd", {1.0, 1.0}), timed_pass("bwd", {2.0, 2.0})});
  shared.shared_gpus = true;
  CaseResult c = made_case("ring/g/seqlen=128", 128,
                           {made_run(1, {timed_pass("fwd", {1.5, 1.5}), timed_pass("bwd", {3.0, 3.0})}), shared});
  const std::optional<PassResult> total = total_pass(c, c.runs[1]);
  REQUIRE(total);
  CHECK(total->time_ms.median == doctest::Approx(3.0));
  CHECK(total->speedup == 0);
  const CaseResult back = case_from_json(to_json(c));
  CHECK_FALSE(back.runs[0].shared_gpus);
  CHECK(back.runs[1].shared_gpus);
}

TEST_CASE("result set: rounds and each round's median come back from results.json") {
  RunResult pooled = made_run(1, {timed_pass("fwd", {1.0, 1.25, 1.5, 1.75})});
  pooled.passes[0].round_medians = {1.125, 1.625};
  CaseResult c = made_case("ring/g/seqlen=128", 128, {pooled});
  c.spec.timing.rounds = 2;
  const CaseResult back = case_from_json(to_json(c));
  CHECK(back.spec.timing.rounds == 2);
  CHECK(back.runs[0].passes[0].round_medians == std::vector<double>{1.125, 1.625});
}

// A world's pass time is its slowest rank's: each rank's own median comes back from results.json,
// and the console names the slowest rank where they differ by more than 2%.
TEST_CASE("result set: each rank's median comes back from results.json, and a spread over 2% is named") {
  RunResult two = made_run(2, {timed_pass("bwd", {2.0, 2.1})});
  two.passes[0].ranks = {summarize({1.9, 2.0}), summarize({2.0, 2.1})};
  CaseResult c = made_case("ring/g/seqlen=128", 128, {two});
  const CaseResult back = case_from_json(to_json(c));
  CHECK(rank_medians(back.runs[0].passes[0]) == std::vector<double>{1.95, 2.05});
  CHECK(rank_spread(back.runs[0].passes[0]) == "medians by rank: 1.950 ms, 2.050 ms, rank 1 the slowest");
  two.passes[0].ranks = {summarize({2.0, 2.05}), summarize({2.0, 2.1})};
  CHECK(rank_spread(two.passes[0]).empty());  // 2.025 against 2.05: within 2%
  CHECK(rank_spread(made_run(1, {timed_pass("bwd", {2.0})}).passes[0]).empty());
}

// Each rank's board, read after each sample: its median SM clock and power come back from
// results.json, and print as one line a pass; none read (the CPU), none printed.
TEST_CASE("result set: each rank's board readings come back from results.json and print in one line") {
  RunResult two = made_run(2, {timed_pass("fwd", {2.0, 2.1})});
  two.passes[0].sm_clock_mhz = {summarize({1620, 1618, 1622}), summarize({1668, 1669, 1667})};
  two.passes[0].power_w = {summarize({654.2, 655}), summarize({657.4})};
  const CaseResult back = case_from_json(to_json(made_case("ring/g/seqlen=128", 128, {two})));
  CHECK(medians(back.runs[0].passes[0].sm_clock_mhz) == std::vector<double>{1620, 1668});
  CHECK(medians(back.runs[0].passes[0].power_w) == std::vector<double>{654.6, 657.4});
  CHECK(board_readings(back.runs[0].passes[0]) == "boards by rank: 1620 MHz 655 W, 1668 MHz 657 W");
  RunResult one = made_run(1, {timed_pass("fwd", {2.0})});
  CHECK(board_readings(one.passes[0]).empty());
  one.passes[0].sm_clock_mhz = {summarize({1659})};
  one.passes[0].power_w = {summarize({659})};
  CHECK(board_readings(one.passes[0]) == "board: 1659 MHz 659 W");
}

TEST_CASE("result set: a journal cut short by a kill keeps every whole line") {
  fs::path dir = temp_dir("journal");
  ResultSet r = sample_set();
  {
    std::ofstream j(dir / "results.jsonl");
    j << journal_header(r.environment, r.suite_name, r.suite_text, {}).dump() << "\n"
      << journal_case(r.cases[0]).dump() << "\n"
      << journal_case(r.cases[1]).dump().substr(0, 40);  // the write a SIGKILL interrupted
  }
  Journal j = read_journal(dir / "results.jsonl");
  CHECK(j.cut_tail);
  REQUIRE(j.results.cases.size() == 1);
  CHECK(j.results.cases[0].spec.id == "naive_attention/g/seqlen=128");
  CHECK(j.results.suite_text == r.suite_text);

  // Resuming rewrites the journal without the cut line and appends after the whole ones.
  {
    ResultFolder folder(dir, {"json"}, true);
    CHECK(folder.dropped_cut_line());
    CHECK(folder.earlier_cases().size() == 1);
    folder.begin(r.environment, r.suite_name, r.suite_text, {});
    folder.append(r.cases[1]);
    ResultSet all = folder.results({r.cases[0].spec.id, r.cases[1].spec.id}, {r.cases[1]});
    REQUIRE(all.cases.size() == 2);
    CHECK(all.sessions.size() == 2);
  }
  Journal again = read_journal(dir / "results.jsonl");
  CHECK_FALSE(again.cut_tail);
  CHECK(again.results.cases.size() == 2);
  CHECK(again.results.sessions.size() == 2);
  fs::remove_all(dir);
}

TEST_CASE("result set: bad files are one-line usage errors naming the file") {
  fs::path dir = temp_dir("bad");
  auto message = [](const fs::path& p) {
    try {
      load_results(p);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message(dir / "missing.json") == (dir / "missing.json").string() + ": no such file or folder");
  CHECK(message(dir) == dir.string() + ": no results.json or results.jsonl in this folder");
  std::ofstream(dir / "broken.json") << "{\"schema_version\": 1, \"cases\": [";
  CHECK(message(dir / "broken.json").rfind((dir / "broken.json").string() + ": malformed JSON", 0) == 0);
  std::ofstream(dir / "other.json") << "{\"hello\": 1}";
  CHECK(message(dir / "other.json") == (dir / "other.json").string() +
                                           ": not an attnhost results.json: no schema_version: not an attnhost result");
  ResultSet r = sample_set();
  std::ofstream(dir / "mid.jsonl") << journal_header(r.environment, "s", "", {}).dump() << "\n{oops\n"
                                   << journal_case(r.cases[0]).dump() << "\n";
  CHECK(message(dir / "mid.jsonl").rfind((dir / "mid.jsonl").string() + ":2: malformed JSON", 0) == 0);
  for (const std::string& m : {message(dir / "broken.json"), message(dir / "mid.jsonl")})
    CHECK(m.find('\n') == std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("result set: written reports hold every case, and a re-render gives the same bytes") {
  fs::path dir = temp_dir("render");
  ResultSet r = sample_set();
  write_reports(dir, r, {"json", "csv", "markdown", "trace"});
  const std::string md = slurp(dir / "report.md"), csv_text = slurp(dir / "results.csv"), json_text = slurp(dir / "results.json");
  CHECK(md.find("## g") != std::string::npos);
  CHECK(md.find("naive_attention/g/seqlen=256") != std::string::npos);
  CHECK(csv_text.find("naive_attention/g/seqlen=128,g,naive_attention,1.0.0,cpu,1,128,") != std::string::npos);
  write_reports(dir, load_results(dir), {"json", "csv", "markdown", "trace"});
  CHECK(slurp(dir / "report.md") == md);
  CHECK(slurp(dir / "results.csv") == csv_text);
  CHECK(slurp(dir / "results.json") == json_text);
  fs::remove_all(dir);
}

TEST_CASE("trace: Chrome trace format, a process per case and world size, a thread per rank") {
  CaseResult c = made_case("p/x", 128, {made_run(2, {timed_pass("fwd", {1})})});
  c.runs[0].trace = {{0, "forward", "host", 0, 100}, {1, "all_gather K V", "communication", 2, 10},
                     {1, "attention", "compute", 12, 80}};
  json::Value doc = json::parse(chrome_trace({c}));
  int threads = 0, ranges = 0;
  for (const json::Value& e : doc["traceEvents"].array()) {
    if (e["name"].string() == "thread_name") ++threads;
    if (e["ph"].string() == "X") {
      ++ranges;
      CHECK(e["pid"].integer() == 1);
      CHECK(e.find("ts"));
      CHECK(e.find("dur"));
      CHECK(!e["cat"].string().empty());
    }
  }
  CHECK(threads == 2);
  CHECK(ranges == 3);
}

TEST_CASE("exposed communication: the part of a host range's transfers no compute range of the rank covers") {
  RunResult r = made_run(2, {timed_pass("fwd", {1})});
  // rank 0: K/V 0-30 us under compute 10-20 and 25-60: exposed 0-10 and 20-25. A range outside the
  // forward (the backward's hop) does not count for it. rank 1: nothing exposed.
  r.trace = {{0, "forward", "host", 0, 100},         {0, "K V step 0", "communication", 0, 30},
             {0, "attention step 0", "compute", 10, 10}, {0, "attention step 0", "compute", 25, 35},
             {0, "backward", "host", 100, 50},       {0, "dK dV step 1", "communication", 140, 10},
             {1, "forward", "host", 0, 100},         {1, "K V step 0", "communication", 5, 10},
             {1, "attention step 0", "compute", 0, 90}};
  const std::optional<CommExposure> f = exposed_communication(r, "forward");
  REQUIRE(f);
  CHECK(f->comm_ms == doctest::Approx(0.030));
  CHECK(f->exposed_ms == doctest::Approx(0.015));
  const std::optional<CommExposure> b = exposed_communication(r, "backward");
  REQUIRE(b);
  CHECK(b->comm_ms == doctest::Approx(0.010));
  CHECK(b->exposed_ms == doctest::Approx(0.010));
  r.trace.clear();
  CHECK(!exposed_communication(r, "forward"));
  // A plugin that marks its communication but not its compute (naive_attention on the CPU) has no
  // reading: every receive would count as exposed, however long it waited for the peer.
  r.trace = {{0, "backward", "host", 0, 100}, {0, "dK dV home", "communication", 0, 100}};
  CHECK(!exposed_communication(r, "backward"));
}
