#include "report/derived.h"
#include "report/render.h"

#include <sstream>

namespace attnhost::report {

namespace {
std::string cell(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}
}  // namespace

std::string csv(const std::vector<CaseResult>& cases) {
  std::ostringstream out;
  out.precision(6);  // six significant digits: past a microsecond in milliseconds, timings are noise (results.json keeps all)
  out << "case,group,plugin,plugin_version,device,batch,seqlen_q,seqlen_kv,heads_q,heads_kv,head_dim,dtype,grad_dtype,causal,"
         "window_left,window_right,world_size,status,pass,median_ms,min_ms,mean_ms,stddev_ms,p10_ms,p90_ms,samples,"
         "tflops_per_gpu,tokens_per_s,speedup,efficiency,peak_bytes_max,sent_bytes_fwd_max,sent_bytes_bwd_max,check,error\n";
  for (const CaseResult& c : cases) {
    const suite::Problem& p = c.spec.problem;
    for (const RunResult& r : c.runs) {
      std::string check = !r.check.ran ? "" : r.check.ok ? "ok" : "failed";
      auto row = [&](const PassResult* pr) {
        out << cell(c.spec.id) << ',' << cell(c.spec.group) << ',' << cell(c.spec.plugin) << ',' << cell(c.plugin_version)
            << ',' << cell(c.device) << ',' << p.batch << ',' << p.seqlen_q << ',' << p.seqlen_kv << ',' << p.heads_q
            << ',' << p.heads_kv << ',' << p.head_dim << ',' << p.dtype << ',' << p.grad_dtype << ',' << (p.causal ? 1 : 0) << ','
            << p.window_left << ',' << p.window_right << ',' << r.world_size << ',' << r.status << ',';
        if (pr)
          out << pr->pass << ',' << pr->time_ms.median << ',' << pr->time_ms.min << ',' << pr->time_ms.mean << ','
              << pr->time_ms.stddev << ',' << pr->time_ms.p10 << ',' << pr->time_ms.p90 << ',' << pr->time_ms.count
              << ',' << pr->tflops_per_gpu << ',' << pr->tokens_per_s << ',' << pr->speedup << ',' << pr->efficiency;
        else
          out << ",,,,,,,,,,,";
        out << ',' << max_peak_bytes(r) << ',' << max_sent_bytes(r.sent_bytes_fwd) << ','
            << max_sent_bytes(r.sent_bytes_bwd) << ',' << check << ',' << cell(r.error) << '\n';
      };
      if (r.passes.empty()) row(nullptr);
      for (const PassResult& pr : r.passes) row(&pr);
    }
  }
  return out.str();
}

}  // namespace attnhost::report
