// attnhost compare: a row per plugin, one table per world size, every figure followed by its
// ratio to the first plugin's, so "which is faster and by how much" reads down a column.
#include "report/console.h"
#include "report/derived.h"
#include "report/format.h"

#include <algorithm>
#include <functional>
#include <optional>

namespace attnhost::report {

namespace {

struct Entry {
  const CaseResult* c;
  const RunResult* r;
};

// One row of the table: how to read a figure off a run, and how to print it.
struct Metric {
  std::string name;
  std::function<std::optional<double>(const Entry&)> value;
  std::function<std::string(double)> format;
};

std::optional<double> pass_time(const Entry& e, const std::string& pass) {
  if (pass == "fwd+bwd") {
    std::optional<PassResult> t = total_pass(*e.c, *e.r);
    return t ? std::optional<double>(t->time_ms.median) : std::nullopt;
  }
  const PassResult* p = e.r->pass(pass);
  return p && p->time_ms.median > 0 ? std::optional<double>(p->time_ms.median) : std::nullopt;
}

std::vector<Metric> metrics(int ws, bool cpu) {
  std::vector<Metric> m;
  for (const char* pass : {"fwd", "bwd", "fwd+bwd"})
    m.push_back({std::string(pass), [pass](const Entry& e) { return pass_time(e, pass); },
                 [](double v) { return fmt::ms(v); }});
  auto headline = [](const Entry& e) { return headline_pass(*e.c, *e.r); };
  m.push_back({flops_heading(cpu), [headline](const Entry& e) {
                 auto h = headline(e);
                 return h && h->tflops_per_gpu > 0 ? std::optional<double>(h->tflops_per_gpu) : std::nullopt; },
               [cpu](double v) { return flops_cell(v, cpu); }});
  m.push_back({"tokens/s", [headline](const Entry& e) {
                 auto h = headline(e);
                 return h && h->tokens_per_s > 0 ? std::optional<double>(h->tokens_per_s) : std::nullopt; },
               [](double v) { return fmt::si(v); }});
  if (ws > 1) {
    m.push_back({"speedup", [headline](const Entry& e) {
                   auto h = headline(e);
                   return h && h->speedup > 0 ? std::optional<double>(h->speedup) : std::nullopt; },
                 [](double v) { return fmt::ratio(v); }});
    m.push_back({"efficiency", [headline](const Entry& e) {
                   auto h = headline(e);
                   return h && h->efficiency > 0 ? std::optional<double>(h->efficiency) : std::nullopt; },
                 [](double v) { return fmt::percent(v); }});
    m.push_back({"imbalance", [](const Entry& e) {
                   double i = load_imbalance(*e.r);
                   return i > 0 ? std::optional<double>(i) : std::nullopt; },
                 [](double v) { return fmt::ratio(v); }});
    m.push_back({"sent fwd/rank", [](const Entry& e) {
                   double b = static_cast<double>(max_sent_bytes(e.r->sent_bytes_fwd));
                   return b > 0 ? std::optional<double>(b) : std::nullopt; },
                 [](double v) { return fmt::bytes(v); }});
    m.push_back({"comm exposed", [](const Entry& e) {
                   const std::optional<CommExposure> f = exposed_communication(*e.r, "forward"),
                                                     b = exposed_communication(*e.r, "backward");
                   if (!f && !b) return std::optional<double>();
                   return std::optional<double>((f ? f->exposed_ms : 0) + (b ? b->exposed_ms : 0)); },
                 [](double v) { return fmt::ms(v); }});
  }
  m.push_back({"peak mem/rank", [](const Entry& e) {
                 double b = static_cast<double>(max_peak_bytes(*e.r));
                 return b > 0 ? std::optional<double>(b) : std::nullopt; },
               [](double v) { return fmt::bytes(v); }});
  return m;
}

}  // namespace

void print_comparison(std::ostream& out, const std::vector<CaseResult>& cases) {
  if (cases.empty()) return;
  std::vector<int> sizes;
  for (const CaseResult& c : cases)
    for (const RunResult& r : c.runs)
      if (std::find(sizes.begin(), sizes.end(), r.world_size) == sizes.end()) sizes.push_back(r.world_size);
  std::sort(sizes.begin(), sizes.end());
  out << "\n" << problem_line(cases.front().spec.problem) << "  (" << timing_line(cases.front().spec) << ")\n";
  for (int ws : sizes) {
    std::vector<Entry> entries;
    for (const CaseResult& c : cases)
      for (const RunResult& r : c.runs)
        if (r.world_size == ws) entries.push_back({&c, &r});
    if (entries.empty()) continue;
    // Only the figures some plugin has; every cell after the first plugin's carries its ratio.
    std::vector<Metric> shown;
    for (const Metric& m : metrics(ws, all_on_cpu(cases)))
      if (std::any_of(entries.begin(), entries.end(), [&](const Entry& e) { return m.value(e).has_value(); }))
        shown.push_back(m);
    std::vector<std::string> header = {"plugin (ws=" + std::to_string(ws) + ")"};
    for (const Metric& m : shown) header.push_back(m.name);
    header.insert(header.end(), {"status", "check"});
    fmt::Table t(header);
    for (size_t i = 0; i < entries.size(); ++i) {
      const Entry& e = entries[i];
      std::vector<std::string> row = {e.c->spec.plugin};
      for (const Metric& m : shown) {
        const std::optional<double> v = m.value(e), first = m.value(entries.front());
        std::string cell = v ? m.format(*v) : "-";
        if (v && i > 0 && first && *first > 0) cell += " (" + fmt::ratio(*v / *first) + ")";
        row.push_back(cell);
      }
      row.insert(row.end(), {e.r->status, check_cell(*e.r)});
      t.row(row);
    }
    out << "\n" << t.str();
  }
  out << "(in parentheses: ratio to the first plugin, " << cases.front().spec.plugin
      << "; " << flops_heading(all_on_cpu(cases)) << ", tokens/s, speedup and efficiency of fwd+bwd; imbalance: the busiest rank's attended pairs over the mean; comm exposed: communication no compute covered, forward plus backward, on the worst rank)\n";
}

}  // namespace attnhost::report
