#include "report/files.h"

#include "common/errors.h"
#include "common/json.h"
#include "report/console.h"
#include "report/format.h"
#include "report/serialize.h"

#include <algorithm>
#include <sstream>

namespace attnhost::report {

namespace fs = std::filesystem;

ResultFolder::ResultFolder(fs::path dir, std::vector<std::string> formats) : dir_(std::move(dir)), formats_(std::move(formats)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw UsageError("cannot create result folder " + dir_.string() + ": " + ec.message());
}

bool ResultFolder::wants(const std::string& f) const {
  return std::find(formats_.begin(), formats_.end(), f) != formats_.end();
}

void ResultFolder::begin(const Environment& env, const std::string& suite_name, const std::string&) {
  // results.jsonl is the run's journal: written whenever there is a folder at all, so that an
  // interrupted run keeps every finished case whatever formats were asked for.
  jsonl_.open(dir_ / "results.jsonl", std::ios::app);
  if (!jsonl_) throw UsageError("cannot write " + (dir_ / "results.jsonl").string());
  json::Value header = json::Object{{"schema_version", kSchemaVersion}, {"kind", "run"}, {"suite", suite_name},
                                    {"environment", to_json(env)}};
  jsonl_ << header.dump() << '\n' << std::flush;
}

void ResultFolder::append(const CaseResult& c) {
  if (!jsonl_.is_open()) return;
  json::Value line = to_json(c);
  line.set("kind", "case");
  jsonl_ << line.dump() << '\n' << std::flush;
}

std::vector<fs::path> ResultFolder::finish(const Environment& env, const std::string& suite_name,
                                           const std::string& suite_text, const std::vector<CaseResult>& cases) {
  std::vector<fs::path> written;
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream f(dir_ / name);
    f << text;
    if (!f) throw UsageError("cannot write " + (dir_ / name).string());
    written.push_back(dir_ / name);
  };
  written.push_back(dir_ / "results.jsonl");
  if (wants("json")) {
    json::Array all;
    for (const CaseResult& c : cases) all.push_back(to_json(c));
    json::Value doc = json::Object{{"schema_version", kSchemaVersion}, {"suite", suite_name},
                                   {"suite_text", suite_text}, {"environment", to_json(env)}, {"cases", all}};
    write("results.json", doc.dump(1) + "\n");
  }
  if (wants("json") || wants("trace")) write("trace.json", chrome_trace(cases));
  if (wants("csv")) write("results.csv", csv(cases));
  if (wants("markdown")) write("report.md", markdown(env, suite_name, cases));
  return written;
}

namespace {
std::string csv_cell(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}
}  // namespace

std::string csv(const std::vector<CaseResult>& cases) {
  std::ostringstream out;
  out << "case,group,plugin,plugin_version,device,batch,seqlen_q,seqlen_kv,heads_q,heads_kv,head_dim,dtype,causal,"
         "window_left,window_right,world_size,status,pass,median_ms,min_ms,mean_ms,stddev_ms,p10_ms,p90_ms,samples,"
         "tflops_per_gpu,tokens_per_s,speedup,efficiency,peak_bytes_max,sent_bytes_fwd_max,check,error\n";
  for (const CaseResult& c : cases) {
    const suite::Problem& p = c.spec.problem;
    for (const RunResult& r : c.runs) {
      uint64_t peak = r.peak_bytes.empty() ? 0 : *std::max_element(r.peak_bytes.begin(), r.peak_bytes.end());
      uint64_t sent = r.sent_bytes_fwd.empty() ? 0 : *std::max_element(r.sent_bytes_fwd.begin(), r.sent_bytes_fwd.end());
      std::string check = !r.check.ran ? "" : r.check.ok ? "ok" : "failed";
      auto row = [&](const PassResult* pr) {
        out << csv_cell(c.spec.id) << ',' << csv_cell(c.spec.group) << ',' << c.spec.plugin << ',' << c.plugin_version
            << ',' << csv_cell(c.device) << ',' << p.batch << ',' << p.seqlen_q << ',' << p.seqlen_kv << ',' << p.heads_q
            << ',' << p.heads_kv << ',' << p.head_dim << ',' << p.dtype << ',' << (p.causal ? 1 : 0) << ','
            << p.window_left << ',' << p.window_right << ',' << r.world_size << ',' << r.status << ',';
        if (pr)
          out << pr->pass << ',' << pr->time_ms.median << ',' << pr->time_ms.min << ',' << pr->time_ms.mean << ','
              << pr->time_ms.stddev << ',' << pr->time_ms.p10 << ',' << pr->time_ms.p90 << ',' << pr->time_ms.count
              << ',' << pr->tflops_per_gpu << ',' << pr->tokens_per_s << ',' << pr->speedup << ',' << pr->efficiency;
        else
          out << ",,,,,,,,,,,";
        out << ',' << peak << ',' << sent << ',' << check << ',' << csv_cell(r.error) << '\n';
      };
      if (r.passes.empty()) row(nullptr);
      for (const PassResult& pr : r.passes) row(&pr);
    }
  }
  return out.str();
}

std::string markdown(const Environment& env, const std::string& suite_name, const std::vector<CaseResult>& cases) {
  std::ostringstream out;
  out << "# attnhost report: " << suite_name << "\n\n";
  out << "| | |\n| --- | --- |\n";
  out << "| date | " << env.date << " |\n| device | " << env.device << " |\n| driver | " << env.driver
      << " |\n| CUDA | " << env.cuda << " |\n| NCCL | " << env.nccl << " |\n| cuDNN | " << env.cudnn
      << " |\n| attnhost | " << env.attnhost_version << " (" << env.git_revision << ") |\n";
  std::string cmd;
  for (const std::string& a : env.argv) cmd += (cmd.empty() ? "" : " ") + a;
  out << "| command | `" << cmd << "` |\n\n";

  std::vector<const CaseResult*> failed;
  for (const CaseResult& c : cases)
    if (c.failed()) failed.push_back(&c);
  if (!failed.empty()) {
    out << "## Failures\n\n";
    for (const CaseResult* c : failed)
      for (const RunResult& r : c->runs)
        if (r.status != "PASSED" && r.status != "OK" && r.status != "SKIPPED" && r.status != "UNSUPPORTED")
          out << "- **" << c->spec.id << "** (world size " << r.world_size << "): " << r.status << " - " << r.error << "\n";
    out << "\n";
  }
  std::vector<std::string> groups;
  for (const CaseResult& c : cases)
    if (std::find(groups.begin(), groups.end(), c.spec.group) == groups.end()) groups.push_back(c.spec.group);
  for (const std::string& g : groups) {
    out << "## " << g << "\n\n";
    fmt::Table t({"case", "problem", "ws", "status", "pass", "median", "TFLOP/s/GPU", "speedup", "efficiency", "peak mem", "check"});
    for (const CaseResult& c : cases) {
      if (c.spec.group != g) continue;
      for (const RunResult& r : c.runs) {
        std::string mem = r.peak_bytes.empty() ? "-" : fmt::bytes(*std::max_element(r.peak_bytes.begin(), r.peak_bytes.end()));
        std::string check = !r.check.ran ? "-" : r.check.ok ? "ok" : "FAILED";
        if (r.passes.empty())
          t.row({c.spec.id, problem_line(c.spec.problem), std::to_string(r.world_size), r.status, "-", "-", "-", "-", "-", mem, check});
        for (const PassResult& p : r.passes)
          t.row({c.spec.id, problem_line(c.spec.problem), std::to_string(r.world_size), r.status, p.pass,
                 fmt::ms(p.time_ms.median), fmt::fixed(p.tflops_per_gpu, 1),
                 p.speedup > 0 && r.world_size > 1 ? fmt::fixed(p.speedup, 2) + "x" : "-",
                 p.efficiency > 0 && r.world_size > 1 ? fmt::percent(p.efficiency) : "-", mem, check});
      }
    }
    out << t.markdown() << "\n";
  }
  return out.str();
}

std::string chrome_trace(const std::vector<CaseResult>& cases) {
  // One process per (case, world size), one thread per rank; times are relative to each traced
  // iteration's start, laid one after another so cases do not overlap.
  json::Array events;
  int pid = 0;
  for (const CaseResult& c : cases)
    for (const RunResult& r : c.runs) {
      if (r.trace.empty()) continue;
      ++pid;
      events.push_back(json::Object{{"name", "process_name"}, {"ph", "M"}, {"pid", pid},
                                    {"args", json::Object{{"name", c.spec.id + " ws=" + std::to_string(r.world_size)}}}});
      for (int rank = 0; rank < r.world_size; ++rank)
        events.push_back(json::Object{{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", rank},
                                      {"args", json::Object{{"name", "rank " + std::to_string(rank)}}}});
      for (const TraceEvent& e : r.trace)
        events.push_back(json::Object{{"name", e.name}, {"cat", e.category}, {"ph", "X"}, {"pid", pid},
                                      {"tid", e.rank}, {"ts", e.start_us}, {"dur", e.duration_us}});
    }
  json::Value doc = json::Object{{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  return doc.dump() + "\n";
}

}  // namespace attnhost::report
