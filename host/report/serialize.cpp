#include "report/serialize.h"

#include "report/derived.h"

namespace attnhost::report {

namespace {

json::Value stats_json(const Stats& s) {
  json::Array samples(s.samples.begin(), s.samples.end());
  return json::Object{{"count", s.count}, {"min", s.min}, {"median", s.median}, {"mean", s.mean},
                      {"stddev", s.stddev}, {"rel_noise", s.rel_noise}, {"p10", s.p10}, {"p90", s.p90},
                      {"max", s.max}, {"stop_reason", s.stop_reason}, {"samples_ms", std::move(samples)}};
}

Stats stats_from(const json::Value& v) {
  std::vector<double> samples;
  for (const json::Value& x : v["samples_ms"].array()) samples.push_back(x.number());
  Stats s = summarize(samples);
  s.stop_reason = v["stop_reason"].string();
  return s;
}

template <class T>
json::Value numbers(const std::vector<T>& v) {
  json::Array a;
  for (const T& x : v) a.emplace_back(static_cast<T>(x));
  return a;
}

std::vector<uint64_t> u64s(const json::Value& v) {
  std::vector<uint64_t> out;
  for (const json::Value& x : v.array()) out.push_back(static_cast<uint64_t>(x.integer()));
  return out;
}

json::Value problem_json(const suite::Problem& p) {
  json::Value o = json::Object{{"batch", p.batch}, {"seqlen_q", p.seqlen_q}, {"seqlen_kv", p.seqlen_kv},
                               {"heads_q", p.heads_q}, {"heads_kv", p.heads_kv}, {"head_dim", p.head_dim},
                               {"dtype", p.dtype}, {"causal", p.causal}, {"window_left", p.window_left},
                               {"window_right", p.window_right}, {"deterministic", p.deterministic}};
  if (p.softmax_scale) o.set("softmax_scale", *p.softmax_scale);
  if (!p.grad_dtype.empty()) o.set("grad_dtype", p.grad_dtype);
  if (p.varlen) {
    o.set("seqlens", numbers(p.varlen->lengths));
    o.set("seqlen_distribution", p.varlen->distribution);
  }
  return o;
}

suite::Problem problem_from(const json::Value& v) {
  suite::Problem p;
  p.batch = v["batch"].integer();
  p.seqlen_q = v["seqlen_q"].integer();
  p.seqlen_kv = v["seqlen_kv"].integer();
  p.heads_q = static_cast<int32_t>(v["heads_q"].integer());
  p.heads_kv = static_cast<int32_t>(v["heads_kv"].integer());
  p.head_dim = static_cast<int32_t>(v["head_dim"].integer());
  p.dtype = v["dtype"].string();
  p.causal = v["causal"].boolean();
  p.window_left = v["window_left"].integer();
  p.window_right = v["window_right"].integer();
  p.deterministic = v["deterministic"].boolean();
  if (const json::Value* s = v.find("softmax_scale")) p.softmax_scale = s->number();
  if (const json::Value* g = v.find("grad_dtype")) p.grad_dtype = g->string();
  if (const json::Value* l = v.find("seqlens")) {
    suite::SeqlenSpec spec;
    for (const json::Value& x : l->array()) spec.lengths.push_back(x.integer());
    spec.distribution = v["seqlen_distribution"].string();
    p.varlen = spec;
  }
  return p;
}

json::Value param_json(const suite::ParamValue& v) {
  return std::visit([](const auto& x) -> json::Value {
    using T = std::decay_t<decltype(x)>;
    if constexpr (std::is_same_v<T, std::vector<int64_t>>) return numbers(x);
    else return json::Value(x);
  }, v);
}

suite::ParamValue param_from(const json::Value& v) {
  if (v.is_array()) {
    std::vector<int64_t> out;
    for (const json::Value& x : v.array()) out.push_back(x.integer());
    return out;
  }
  if (v.is_string()) return v.string();
  if (v.is_number()) {
    double d = v.number();
    int64_t i = v.integer();
    if (static_cast<double>(i) == d && v.dump().find('.') == std::string::npos) return i;
    return d;
  }
  return v.boolean();
}

json::Value run_json(const RunResult& r) {
  json::Array passes;
  for (const PassResult& p : r.passes) {
    json::Array kernels;
    for (const KernelTime& k : p.kernels)
      kernels.push_back(json::Object{{"name", k.name}, {"launches", k.launches}, {"total_ms", k.total_ms},
                                     {"mean_ms", k.mean_ms}, {"share", k.share}});
    passes.push_back(json::Object{{"pass", p.pass}, {"time_ms", stats_json(p.time_ms)}, {"flops", p.flops},
                                  {"tflops_per_gpu", p.tflops_per_gpu}, {"tokens_per_s", p.tokens_per_s},
                                  {"speedup", p.speedup}, {"efficiency", p.efficiency}, {"kernels", kernels},
                                  {"round_medians_ms", numbers(p.round_medians)},
                                  {"rank_medians_ms", numbers(rank_medians(p))},
                                  {"rank_sm_clock_mhz", numbers(medians(p.sm_clock_mhz))},
                                  {"rank_power_w", numbers(medians(p.power_w))}});
  }
  json::Array tensors;
  for (const TensorCheck& t : r.check.tensors)
    tensors.push_back(json::Object{{"tensor", t.tensor}, {"values", t.values}, {"nonfinite", t.nonfinite},
                                   {"max_abs_err", t.max_abs_err}, {"max_ref", t.max_ref},
                                   {"rel_l2_err", t.rel_l2_err}, {"tol_rel_l2", t.tol_rel_l2},
                                   {"tol_max", t.tol_max}, {"worst", t.worst}, {"ok", t.ok}});
  json::Array trace;
  for (const TraceEvent& e : r.trace)
    trace.push_back(json::Object{{"rank", e.rank}, {"name", e.name}, {"category", e.category},
                                 {"start_us", e.start_us}, {"duration_us", e.duration_us}});
  return json::Object{
      {"world_size", r.world_size}, {"status", r.status}, {"error", r.error}, {"passes", passes},
      {"total_pairs", r.total_pairs}, {"max_rank_pairs", r.max_rank_pairs}, {"peak_bytes", numbers(r.peak_bytes)},
      {"sent_bytes_fwd", numbers(r.sent_bytes_fwd)}, {"sent_bytes_bwd", numbers(r.sent_bytes_bwd)},
      {"check", json::Object{{"ran", r.check.ran}, {"ok", r.check.ok}, {"rows", r.check.rows},
                             {"columns", r.check.columns}, {"note", r.check.note}, {"amax", r.check.amax},
                             {"tensors", tensors}}},
      {"wall_seconds", r.wall_seconds}, {"engine", r.engine}, {"trace", trace}, {"shared_gpus", r.shared_gpus}};
}

RunResult run_from(const json::Value& v) {
  RunResult r;
  r.world_size = static_cast<int>(v["world_size"].integer());
  r.status = v["status"].string();
  r.error = v["error"].string();
  for (const json::Value& p : v["passes"].array()) {
    PassResult pr;
    pr.pass = p["pass"].string();
    pr.time_ms = stats_from(p["time_ms"]);
    pr.flops = p["flops"].number();
    pr.tflops_per_gpu = p["tflops_per_gpu"].number();
    pr.tokens_per_s = p["tokens_per_s"].number();
    pr.speedup = p["speedup"].number();
    pr.efficiency = p["efficiency"].number();
    if (const json::Value* rounds = p.find("round_medians_ms"))
      for (const json::Value& m : rounds->array()) pr.round_medians.push_back(m.number());
    // (Of each rank's times and board readings the medians alone are kept.)
    for (auto [key, into] : {std::pair{"rank_medians_ms", &pr.ranks}, std::pair{"rank_sm_clock_mhz", &pr.sm_clock_mhz},
                             std::pair{"rank_power_w", &pr.power_w}})
      if (const json::Value* ranks = p.find(key))
        for (const json::Value& m : ranks->array()) into->push_back(Stats{.median = m.number()});
    for (const json::Value& k : p["kernels"].array())
      pr.kernels.push_back({k["name"].string(), k["launches"].integer(), k["total_ms"].number(), k["mean_ms"].number(),
                            k["share"].number()});
    r.passes.push_back(std::move(pr));
  }
  r.total_pairs = v["total_pairs"].integer();
  r.max_rank_pairs = v["max_rank_pairs"].integer();
  r.peak_bytes = u64s(v["peak_bytes"]);
  r.sent_bytes_fwd = u64s(v["sent_bytes_fwd"]);
  r.sent_bytes_bwd = u64s(v["sent_bytes_bwd"]);
  const json::Value& c = v["check"];
  r.check.ran = c["ran"].boolean();
  r.check.ok = c["ok"].boolean();
  r.check.rows = c["rows"].integer();
  r.check.columns = c["columns"].integer();
  r.check.note = c["note"].string();
  if (const json::Value* a = c.find("amax")) r.check.amax = a->string();
  for (const json::Value& t : c["tensors"].array()) {
    TensorCheck tc;
    tc.tensor = t["tensor"].string();
    tc.values = t["values"].integer();
    tc.nonfinite = t["nonfinite"].integer();
    tc.max_abs_err = t["max_abs_err"].number();
    tc.max_ref = t["max_ref"].number();
    tc.rel_l2_err = t["rel_l2_err"].number();
    tc.tol_rel_l2 = t["tol_rel_l2"].number();
    tc.tol_max = t["tol_max"].number();
    tc.worst = t["worst"].string();
    tc.ok = t["ok"].boolean();
    r.check.tensors.push_back(std::move(tc));
  }
  r.wall_seconds = v["wall_seconds"].number();
  if (const json::Value* e = v.find("engine")) r.engine = e->string();
  if (const json::Value* s = v.find("shared_gpus")) r.shared_gpus = s->boolean();
  for (const json::Value& e : v["trace"].array())
    r.trace.push_back({static_cast<int>(e["rank"].integer()), e["name"].string(), e["category"].string(),
                       e["start_us"].number(), e["duration_us"].number()});
  return r;
}

// The inverse of SourceLocation::str(): "file:line:column", or "file" alone.
suite::SourceLocation location_from(const std::string& text) {
  suite::SourceLocation where;
  where.file = text;
  const size_t col = text.rfind(':');
  if (col == std::string::npos || col == 0) return where;
  const size_t line = text.rfind(':', col - 1);
  if (line == std::string::npos) return where;
  const std::string l = text.substr(line + 1, col - line - 1), c = text.substr(col + 1);
  auto digits = [](const std::string& s) { return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos; };
  if (!digits(l) || !digits(c)) return where;
  where.file = text.substr(0, line);
  where.line = std::stoll(l);
  where.column = std::stoll(c);
  return where;
}

}  // namespace

json::Value to_json(const CaseResult& c) {
  json::Object params;
  for (const auto& [k, v] : c.spec.params) params.emplace_back(k, param_json(v));
  json::Array runs;
  for (const RunResult& r : c.runs) runs.push_back(run_json(r));
  const suite::Timing& t = c.spec.timing;
  json::Array passes;
  for (const std::string& p : t.passes) passes.emplace_back(p);
  return json::Object{
      {"id", c.spec.id}, {"group", c.spec.group}, {"label", c.spec.label}, {"plugin", c.spec.plugin},
      {"plugin_version", c.plugin_version}, {"device", c.device}, {"engine", c.engine},
      {"problem", problem_json(c.spec.problem)}, {"params", params},
      {"world_sizes", numbers(c.spec.world_sizes)},
      {"timing", json::Object{{"method", t.method}, {"warmup_runs", t.warmup_runs},
                              {"warmup_seconds", t.warmup_seconds}, {"timing_runs", t.timing_runs},
                              {"rounds", t.rounds},
                              {"target_noise", t.target_noise}, {"min_samples", t.min_samples},
                              {"max_seconds", t.max_seconds}, {"passes", passes}, {"flush_l2", t.flush_l2}}},
      {"data", json::Object{{"seed", static_cast<int64_t>(c.spec.data.seed)}, {"distribution", c.spec.data.distribution},
                            {"scale", c.spec.data.scale}}},
      {"check", json::Object{{"enabled", c.spec.check.enabled}, {"query_rows", c.spec.check.query_rows},
                             {"key_columns", c.spec.check.key_columns},
                             {"tolerance_scale", c.spec.check.tolerance_scale}}},
      {"where", c.spec.where.str()},
      {"failed", c.failed()}, {"runs", runs}};
}

CaseResult case_from_json(const json::Value& v) {
  CaseResult c;
  c.spec.id = v["id"].string();
  c.spec.group = v["group"].string();
  c.spec.label = v["label"].string();
  c.spec.plugin = v["plugin"].string();
  c.plugin_version = v["plugin_version"].string();
  c.device = v["device"].string();
  c.engine = v["engine"].string();
  c.spec.problem = problem_from(v["problem"]);
  for (const auto& [k, p] : v["params"].object()) c.spec.params[k] = param_from(p);
  c.spec.world_sizes.clear();
  for (const json::Value& w : v["world_sizes"].array()) c.spec.world_sizes.push_back(static_cast<int>(w.integer()));
  const json::Value& t = v["timing"];
  c.spec.timing.method = t["method"].string();
  c.spec.timing.warmup_runs = static_cast<int>(t["warmup_runs"].integer());
  if (const json::Value* seconds = t.find("warmup_seconds")) c.spec.timing.warmup_seconds = seconds->number();
  c.spec.timing.timing_runs = static_cast<int>(t["timing_runs"].integer());
  if (const json::Value* rounds = t.find("rounds")) c.spec.timing.rounds = static_cast<int>(rounds->integer());
  c.spec.timing.target_noise = t["target_noise"].number();
  c.spec.timing.min_samples = static_cast<int>(t["min_samples"].integer());
  c.spec.timing.max_seconds = t["max_seconds"].number();
  c.spec.timing.passes.clear();
  for (const json::Value& p : t["passes"].array()) c.spec.timing.passes.push_back(p.string());
  c.spec.timing.flush_l2 = t["flush_l2"].boolean();
  c.spec.data.seed = static_cast<uint64_t>(v["data"]["seed"].integer());
  c.spec.data.distribution = v["data"]["distribution"].string();
  c.spec.data.scale = v["data"]["scale"].number();
  if (const json::Value* k = v.find("check")) {
    c.spec.check.enabled = (*k)["enabled"].boolean();
    c.spec.check.query_rows = static_cast<int>((*k)["query_rows"].integer());
    c.spec.check.key_columns = static_cast<int>((*k)["key_columns"].integer());
    c.spec.check.tolerance_scale = (*k)["tolerance_scale"].number();
  }
  if (const json::Value* w = v.find("where")) c.spec.where = location_from(w->string());
  for (const json::Value& r : v["runs"].array()) c.runs.push_back(run_from(r));
  return c;
}

json::Value to_json(const Environment& e) {
  json::Object plugins;
  for (const auto& [name, version] : e.plugins) plugins.emplace_back(name, version);
  json::Object files;
  for (const auto& [name, f] : e.plugin_files)
    files.emplace_back(name, json::Object{{"file", f.file}, {"build", f.build}});
  json::Array argv;
  for (const std::string& a : e.argv) argv.emplace_back(a);
  return json::Object{{"attnhost_version", e.attnhost_version}, {"git_revision", e.git_revision},
                      {"date", e.date}, {"host", e.host}, {"device", e.device}, {"gpus", e.gpus},
                      {"driver", e.driver}, {"cuda", e.cuda}, {"nccl", e.nccl}, {"cudnn", e.cudnn},
                      {"plugins", plugins}, {"plugin_files", files}, {"argv", argv}};
}

Environment environment_from_json(const json::Value& v) {
  Environment e;
  e.attnhost_version = v["attnhost_version"].string();
  e.git_revision = v["git_revision"].string();
  e.date = v["date"].string();
  e.host = v["host"].string();
  e.device = v["device"].string();
  e.gpus = static_cast<int>(v["gpus"].integer());
  e.driver = v["driver"].string();
  e.cuda = v["cuda"].string();
  e.nccl = v["nccl"].string();
  e.cudnn = v["cudnn"].string();
  for (const auto& [k, p] : v["plugins"].object()) e.plugins[k] = p.string();
  if (const json::Value* files = v.find("plugin_files"))
    for (const auto& [k, f] : files->object()) e.plugin_files[k] = {f["file"].string(), f["build"].string()};
  for (const json::Value& a : v["argv"].array()) e.argv.push_back(a.string());
  return e;
}

}  // namespace attnhost::report
