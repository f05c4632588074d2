#include "report/gate.h"

#include "report/console.h"
#include "report/derived.h"
#include "report/mann_whitney.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace attnhost::report {

namespace {

using Key = std::tuple<std::string, int, std::string>;  // id, world size, pass

struct Timed {
  Key key;
  const Stats* stats;
  std::string problem;  // what was computed: two records of one id compare only when these agree
};

std::string problem_of(const suite::Problem& p) {
  std::string s = problem_line(p);
  if (p.varlen) {
    s += " lengths";
    for (int64_t n : p.varlen->lengths) s += " " + std::to_string(n);
  }
  if (p.softmax_scale) s += " scale=" + fmt::general(*p.softmax_scale);
  if (p.deterministic) s += " deterministic";
  return s;
}

// Every timed pass of every run that finished, in the order of the records.
std::vector<Timed> timed(const std::vector<CaseResult>& cases) {
  std::vector<Timed> out;
  for (const CaseResult& c : cases)
    for (const RunResult& r : c.runs) {
      if (!r.ok()) continue;
      for (const PassResult& p : r.passes)
        if (p.time_ms.median > 0) out.push_back({{c.spec.id, r.world_size, p.pass}, &p.time_ms, problem_of(c.spec.problem)});
    }
  return out;
}

GateRow row_for(const Key& k) {
  GateRow row;
  row.id = std::get<0>(k);
  row.world_size = std::get<1>(k);
  row.pass = std::get<2>(k);
  return row;
}

}  // namespace

bool GateReport::slower() const { return count("SLOWER") > 0; }

int GateReport::count(const std::string& verdict) const {
  return static_cast<int>(std::count_if(rows.begin(), rows.end(), [&](const GateRow& r) { return r.verdict == verdict; }));
}

GateReport regression_gate(const std::vector<CaseResult>& baseline, const std::vector<CaseResult>& current,
                           const GateOptions& options, const std::string& baseline_name) {
  GateReport g;
  g.baseline = baseline_name;
  g.options = options;
  std::map<Key, Timed> base;
  for (const Timed& t : timed(baseline)) base.emplace(t.key, t);
  std::map<Key, bool> seen;
  for (const Timed& t : timed(current)) {
    GateRow row = row_for(t.key);
    row.current_ms = t.stats->median;
    row.current_n = t.stats->count;
    seen[t.key] = true;
    auto b = base.find(t.key);
    if (b == base.end()) {
      row.verdict = "NEW";
      g.rows.push_back(row);
      continue;
    }
    const Stats& bs = *b->second.stats;
    row.baseline_ms = bs.median;
    row.baseline_n = bs.count;
    if (b->second.problem != t.problem) {
      row.verdict = "MISMATCH";
      row.note = "baseline " + b->second.problem + "; current " + t.problem;
      g.rows.push_back(row);
      continue;
    }
    row.change = row.current_ms / row.baseline_ms - 1;
    bool significant = true;
    if (static_cast<int>(bs.samples.size()) >= options.min_samples &&
        static_cast<int>(t.stats->samples.size()) >= options.min_samples) {
      row.p_value = mann_whitney(t.stats->samples, bs.samples).p_value;
      significant = *row.p_value < options.alpha;
    }
    row.verdict = !significant                          ? "SAME"
                  : row.change > options.threshold      ? "SLOWER"
                  : row.change < -options.threshold     ? "FASTER"
                                                         : "SAME";
    g.rows.push_back(row);
  }
  for (const Timed& t : timed(baseline)) {
    if (seen.count(t.key)) continue;
    seen[t.key] = true;
    GateRow row = row_for(t.key);
    row.baseline_ms = t.stats->median;
    row.baseline_n = t.stats->count;
    row.verdict = "MISSING";
    g.rows.push_back(row);
  }
  return g;
}

fmt::Table gate_table(const GateReport& g) {
  fmt::Table t({"case", "ws", "pass", "baseline", "current", "change", "p", "verdict"}, 3);
  for (const GateRow& r : g.rows) {
    const bool both = r.baseline_ms > 0 && r.current_ms > 0 && r.verdict != "MISMATCH";
    t.row({r.id, std::to_string(r.world_size), pass_label(r.pass), r.baseline_ms > 0 ? fmt::ms(r.baseline_ms) : "-",
           r.current_ms > 0 ? fmt::ms(r.current_ms) : "-", both ? fmt::signed_percent(r.change) : "-",
           r.p_value ? fmt::general(*r.p_value) : "-", r.verdict});
  }
  return t;
}

std::string gate_summary(const GateReport& g) {
  std::string counts;
  for (const char* v : {"SLOWER", "FASTER", "SAME", "NEW", "MISSING", "MISMATCH"})
    if (int n = g.count(v); n > 0) counts += (counts.empty() ? "" : ", ") + std::to_string(n) + " " + v;
  if (counts.empty()) counts = "nothing to compare";
  return "regression gate against " + g.baseline + ": " + counts + " (threshold " + fmt::sig(100 * g.options.threshold) +
         "% on the median; Mann-Whitney p < " + fmt::general(g.options.alpha) + " where both sides have " +
         std::to_string(g.options.min_samples) + "+ samples)";
}

void print_gate(std::ostream& out, const GateReport& g) {
  out << "\n" << gate_table(g).str();
  for (const GateRow& r : g.rows)
    if (r.verdict == "MISMATCH")
      out << r.id << " (ws=" << r.world_size << ", " << pass_label(r.pass) << "): not compared, the problems differ: " << r.note
          << "\n";
  out << gate_summary(g) << "\n";
}

json::Value to_json(const GateReport& g) {
  json::Array rows;
  for (const GateRow& r : g.rows) {
    json::Value row = json::Object{{"id", r.id}, {"world_size", r.world_size}, {"pass", r.pass},
                                   {"baseline_ms", r.baseline_ms}, {"current_ms", r.current_ms},
                                   {"baseline_n", r.baseline_n}, {"current_n", r.current_n}, {"change", r.change},
                                   {"verdict", r.verdict}};
    if (r.p_value) row.set("p_value", *r.p_value);
    if (!r.note.empty()) row.set("note", r.note);
    rows.push_back(std::move(row));
  }
  return json::Object{{"baseline", g.baseline}, {"threshold", g.options.threshold}, {"alpha", g.options.alpha},
                      {"min_samples", g.options.min_samples}, {"rows", rows}};
}

GateReport gate_from_json(const json::Value& v) {
  GateReport g;
  g.baseline = v["baseline"].string();
  g.options.threshold = v["threshold"].number();
  g.options.alpha = v["alpha"].number();
  g.options.min_samples = static_cast<int>(v["min_samples"].integer());
  for (const json::Value& r : v["rows"].array()) {
    GateRow row;
    row.id = r["id"].string();
    row.world_size = static_cast<int>(r["world_size"].integer());
    row.pass = r["pass"].string();
    row.baseline_ms = r["baseline_ms"].number();
    row.current_ms = r["current_ms"].number();
    row.baseline_n = static_cast<int>(r["baseline_n"].integer());
    row.current_n = static_cast<int>(r["current_n"].integer());
    row.change = r["change"].number();
    if (const json::Value* p = r.find("p_value")) row.p_value = p->number();
    if (const json::Value* n = r.find("note")) row.note = n->string();
    row.verdict = r["verdict"].string();
    g.rows.push_back(std::move(row));
  }
  return g;
}

}  // namespace attnhost::report
