#include "report/sections.h"

#include "report/console.h"
#include "report/derived.h"

#include <algorithm>

namespace attnhost::report {

std::vector<std::pair<std::string, std::string>> environment_facts(const ResultSet& r) {
  const Environment& e = r.environment;
  std::string command;
  for (const std::string& a : e.argv) command += (command.empty() ? "" : " ") + a;
  std::string plugins;
  for (const auto& [name, version] : e.plugins) plugins += (plugins.empty() ? "" : ", ") + name + " " + version;
  std::vector<std::pair<std::string, std::string>> facts = {
      {"suite", r.suite_name},
      {"date", e.date},
      {"host", e.host},
      {"device", e.device},
      {"driver", e.driver},
      {"CUDA", e.cuda},
      {"NCCL", e.nccl},
      {"cuDNN", e.cudnn},
      {"attnhost", e.attnhost_version + " (git " + e.git_revision + ")"},
      {"plugins", plugins},
      {"command", command}};
  if (r.sessions.size() > 1) {
    std::string dates;
    for (const Environment& s : r.sessions) dates += (dates.empty() ? "" : ", ") + s.date;
    facts.emplace_back("sessions", std::to_string(r.sessions.size()) + " (resumed): " + dates);
  }
  return facts;
}

std::vector<std::string> failure_lines(const std::vector<CaseResult>& cases) {
  std::vector<std::string> out;
  for (const CaseResult& c : cases)
    for (const RunResult& r : c.runs)
      if (run_failed(r)) {
        std::string line = c.spec.id + " (world size " + std::to_string(r.world_size) + "): " + r.status;
        if (!r.error.empty()) line += " - " + r.error;
        for (const TensorCheck& t : r.check.tensors)
          if (!t.ok)
            line += "; " + t.tensor + " rel L2 " + fmt::general(t.rel_l2_err) + " over " + fmt::general(t.tol_rel_l2) +
                    (t.worst.empty() ? "" : " (worst at " + t.worst + ")");
        out.push_back(line);
      }
  return out;
}

std::vector<std::string> group_names(const std::vector<CaseResult>& cases) {
  std::vector<std::string> groups;
  for (const CaseResult& c : cases)
    if (std::find(groups.begin(), groups.end(), c.spec.group) == groups.end()) groups.push_back(c.spec.group);
  return groups;
}

fmt::Table group_table(const std::vector<CaseResult>& cases, const std::string& group) {
  const bool cpu = all_on_cpu(cases);
  fmt::Table t({"case", "problem", "ws", "status", "pass", "median", "p10-p90", "n", flops_heading(cpu), "tokens/s", "speedup",
                "efficiency", "peak mem/rank", "check"}, 5);
  for (const CaseResult& c : cases) {
    if (c.spec.group != group) continue;
    for (const RunResult& r : c.runs) {
      const std::string mem = r.peak_bytes.empty() ? "-" : fmt::bytes(max_peak_bytes(r));
      const std::string ws = std::to_string(r.world_size);
      std::vector<PassResult> passes = shown_passes(c, r);
      if (passes.empty())
        t.row({c.spec.id, problem_line(c.spec.problem), ws, r.status, "-", "-", "-", "-", "-", "-", "-", "-", mem, check_cell(r)});
      for (const PassResult& p : passes) {
        const bool sum = p.time_ms.count == 0;
        t.row({c.spec.id, problem_line(c.spec.problem), ws, r.status, pass_label(p.pass), fmt::ms(p.time_ms.median),
               sum ? "" : fmt::ms(p.time_ms.p10) + " - " + fmt::ms(p.time_ms.p90), sum ? "sum" : std::to_string(p.time_ms.count),
               flops_cell(p.tflops_per_gpu, cpu), fmt::si(p.tokens_per_s),
               r.world_size > 1 && p.speedup > 0 ? fmt::ratio(p.speedup) : "-",
               r.world_size > 1 && p.efficiency > 0 ? fmt::percent(p.efficiency) : "-", mem, check_cell(r)});
      }
    }
  }
  return t;
}

}  // namespace attnhost::report
