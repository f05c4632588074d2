#include "cli/options.h"

#include "common/errors.h"
#include "common/log.h"

#include <iostream>
#include <sstream>

namespace attnhost::cli {

po::options_description common_options(CommonOptions& o) {
  po::options_description d("Common options");
  d.add_options()
    ("help,h", "show this help")
    ("plugin-dir", po::value(&o.plugin_dirs)->composing(), "also load plugins from DIR (repeatable)")
    ("plugin", po::value(&o.plugin_files)->composing(), "also load the plugin FILE (repeatable)")
    ("allow-insecure-plugins", po::bool_switch(&o.allow_insecure), "load plugins from folders writable by others")
    ("configs", po::value(&o.configs_dir), "folder of presets.toml, ranges.toml and suites/")
    ("device", po::value(&o.backend.device)->default_value("auto"), "auto | cuda | cpu")
    ("gpus", po::value(&o.backend.gpus)->default_value(0), "GPUs to use (0: all visible)")
    ("ranks-per-gpu", po::value(&o.backend.ranks_per_gpu)->default_value(1),
     "ranks that may share a GPU: worlds larger than the GPUs run, for checking a schedule's many-rank paths on "
     "few GPUs (their timings are not those of more GPUs)")
    ("transport", po::value(&o.backend.transport)->default_value("auto"),
     "GPU point-to-point: auto | copy-engine | nccl (auto: copy engines where the GPUs reach one another)")
    ("comm-timeout", po::value<double>()->default_value(60.0), "seconds before an unmatched receive fails (CPU)")
    ("quiet,q", po::bool_switch(&o.quiet), "print only results and errors")
    ("verbose,v", po::bool_switch(&o.verbose), "more detail (run and compare: each case's whole block; list: capabilities and parameters)")
    ("debug", po::bool_switch(&o.debug), "print debug lines");
  return d;
}

void apply_common(Context& ctx, const po::variables_map& vm) {
  log::set_quiet(ctx.options.quiet);
  log::set_verbose(ctx.options.debug);
  double seconds = vm["comm-timeout"].as<double>();
  if (seconds <= 0) throw UsageError("--comm-timeout must be positive");
  if (ctx.options.backend.gpus < 0)
    throw UsageError("--gpus must be 0 (every visible GPU) or more, not " + std::to_string(ctx.options.backend.gpus));
  ctx.options.backend.comm_timeout = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

po::options_description timing_options() {
  po::options_description d("Timing (override the suite)");
  d.add_options()
    ("timing-method", po::value<std::string>(), "simple | warmup | adaptive | profiler")
    ("warmup-runs", po::value<int>(), "warm-up runs before timing")
    ("warmup-seconds", po::value<double>(),
     "each pass's warm-up (every world size and round) lasts this many seconds too (0-600; compare on a GPU: 1, so that its clock settles at the power limit)")
    ("heat-seconds", po::value<double>(),
     "before the first case is timed, run it (fwd+bwd at its largest world size, untimed, unchecked) this many seconds, so that every GPU starts at its running temperature (0-600)")
    ("timing-runs", po::value<int>(), "timed runs")
    ("rounds", po::value<int>(), "run the world sizes this many times in turn, each pass's samples pooled (1-100)")
    ("world-sizes", po::value<std::string>(), "comma-separated world sizes, e.g. 1,2");
  return d;
}

po::options_description problem_options() {
  po::options_description d("Problem (override every case)");
  d.add_options()
    ("batch", po::value<int64_t>(), "batch size")
    ("seqlen", po::value<int64_t>(), "sequence length")
    ("heads", po::value<int32_t>(), "query heads")
    ("kv-heads", po::value<int32_t>(), "key/value heads")
    ("head-dim", po::value<int32_t>(), "head dimension")
    ("dtype", po::value<std::string>(), "bf16 | fp16 | fp32 | fp8_e4m3 | fp8_e5m2")
    ("grad-dtype", po::value<std::string>(), "fp8_e5m2: dO in e5m2 beside --dtype fp8_e4m3 (the hybrid FP8 recipe)")
    ("causal", "causal attention")
    ("no-causal", "full attention")
    ("window", po::value<std::string>(), "sliding window L,R (-1: unbounded)")
    ("param", po::value<std::vector<std::string>>()->composing(),
     "NAME=VALUE: a plugin parameter for every case whose plugin has it, e.g. engine=cudnn (repeatable)");
  return d;
}

po::options_description output_options() {
  po::options_description d("Output");
  d.add_options()
    ("out", po::value<std::string>(), "result folder (default results/<date-time>)")
    ("force", "write over a result folder that --out names, where one is already")
    ("format", po::value<std::string>(),
     "comma-separated: console,json,jsonl,csv,markdown,trace,charts (default: the suite's [outputs])");
  return d;
}

po::options_description gate_options() {
  po::options_description d("Regression gate and history");
  d.add_options()
    ("baseline", po::value<std::string>(), "compare with an earlier results.json or results.jsonl (or its folder); "
                                            "a SLOWER case exits 1")
    ("threshold", po::value<std::string>()->default_value("20"), "percent change of a median that counts as slower or faster")
    ("history", po::value<std::string>(), "append this run's medians to a JSONL history FILE");
  return d;
}

double parse_threshold(const std::string& text) {
  std::string t = text;
  if (!t.empty() && t.back() == '%') t.pop_back();
  try {
    size_t used = 0;
    double v = std::stod(t, &used);
    if (used == t.size() && v > 0 && v <= 1000) return v / 100;
  } catch (const std::exception&) {
  }
  throw UsageError("--threshold: '" + text + "' is not a percentage between 0 and 1000 (e.g. 20 or 20%)");
}

bool parse(const std::vector<std::string>& args, const po::options_description& desc,
           const po::positional_options_description& positional, po::variables_map& vm, const std::string& usage) {
  po::store(po::command_line_parser(args).options(desc).positional(positional).run(), vm);
  if (vm.count("help")) {
    std::cout << usage << "\n\n" << desc << "\n";
    return false;
  }
  po::notify(vm);
  return true;
}

std::vector<int> parse_int_list(const std::string& text, const char* option) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      int v = std::stoi(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      throw UsageError(std::string("--") + option + ": '" + item + "' is not an integer");
    }
  }
  if (out.empty()) throw UsageError(std::string("--") + option + ": empty list");
  return out;
}

suite::Overrides overrides_from(const po::variables_map& vm) {
  suite::Overrides o;
  if (vm.count("batch")) o.batch = vm["batch"].as<int64_t>();
  if (vm.count("seqlen")) o.seqlen = vm["seqlen"].as<int64_t>();
  if (vm.count("heads")) o.heads = vm["heads"].as<int32_t>();
  if (vm.count("kv-heads")) o.kv_heads = vm["kv-heads"].as<int32_t>();
  if (vm.count("head-dim")) o.head_dim = vm["head-dim"].as<int32_t>();
  if (vm.count("dtype")) o.dtype = vm["dtype"].as<std::string>();
  if (vm.count("grad-dtype")) o.grad_dtype = vm["grad-dtype"].as<std::string>();
  if (vm.count("causal") && vm.count("no-causal")) throw UsageError("--causal and --no-causal contradict each other");
  if (vm.count("causal")) o.causal = true;
  if (vm.count("no-causal")) o.causal = false;
  if (vm.count("window")) {
    std::vector<int> w = parse_int_list(vm["window"].as<std::string>(), "window");
    if (w.size() != 2) throw UsageError("--window takes two values L,R (e.g. 512,0)");
    o.window = std::make_pair<int64_t, int64_t>(w[0], w[1]);
  }
  if (vm.count("world-sizes")) o.world_sizes = parse_int_list(vm["world-sizes"].as<std::string>(), "world-sizes");
  if (vm.count("timing-method")) o.timing_method = vm["timing-method"].as<std::string>();
  if (vm.count("warmup-runs")) o.warmup_runs = vm["warmup-runs"].as<int>();
  if (vm.count("warmup-seconds")) o.warmup_seconds = vm["warmup-seconds"].as<double>();
  if (vm.count("timing-runs")) o.timing_runs = vm["timing-runs"].as<int>();
  if (vm.count("rounds")) o.rounds = vm["rounds"].as<int>();
  if (vm.count("param"))
    for (const std::string& item : vm["param"].as<std::vector<std::string>>()) {
      const size_t eq = item.find('=');
      if (eq == 0 || eq == std::string::npos || eq + 1 == item.size())
        throw UsageError("--param '" + item + "': expected NAME=VALUE, e.g. engine=cudnn");
      o.params.emplace_back(item.substr(0, eq), item.substr(eq + 1));
    }
  return o;
}

}  // namespace attnhost::cli
