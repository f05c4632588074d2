// attnhost verify: every plugin (or those named) over the presets of a set (default
// "correctness"), scaled down to what the device checks quickly, at world sizes 1..N, with the
// float64 check on. A plugin that cannot run a preset (capabilities, validate) is listed as
// such, not failed.
#include "cli/app.h"
#include "cli/options.h"
#include "common/errors.h"
#include "common/log.h"

#include <algorithm>
#include <cmath>
#include <iostream>

namespace attnhost::cli {

namespace {

// Small enough for the CPU reference, and divisible by 2P for P = 1..4 and 6 (zigzag).
constexpr int64_t kCpuSeqlen = 240;
constexpr int64_t kGpuSeqlen = 4096;
// A plugin's own verify set keeps its lengths on the CPU up to this.
constexpr int64_t kCpuOwnSetSeqlen = 2048;

suite::Problem scaled(const suite::Problem& p, bool cpu) {
  suite::Problem s = p;
  const int64_t target = cpu ? kCpuSeqlen : kGpuSeqlen;
  if (s.seqlen_q > target) {
    double f = static_cast<double>(target) / s.seqlen_q;
    s.seqlen_q = target;
    if (s.seqlen_kv > 0) s.seqlen_kv = std::max<int64_t>(1, static_cast<int64_t>(s.seqlen_kv * f));
    if (s.window_left > 0) s.window_left = std::max<int64_t>(1, static_cast<int64_t>(s.window_left * f));
    if (s.window_right > 0) s.window_right = std::max<int64_t>(1, static_cast<int64_t>(s.window_right * f));
  }
  if (cpu) {
    s.batch = 1;
    int32_t hkv = s.heads_kv > 0 ? s.heads_kv : s.heads_q;
    int32_t group = s.heads_q / hkv;  // keep the GQA ratio (up to 4), shrink the count
    int32_t kv = std::min<int32_t>(hkv, 2);
    s.heads_kv = kv;
    s.heads_q = kv * std::min<int32_t>(group, 4);
  } else {
    s.batch = std::min<int64_t>(s.batch, 2);
  }
  return s;
}

}  // namespace

int verify_command(Context& ctx, const std::vector<std::string>& args) {
  po::options_description desc;
  desc.add(common_options(ctx.options));
  po::options_description own("Verify");
  own.add_options()("plugins", po::value<std::vector<std::string>>()->multitoken(), "plugins to verify (default: all)")
                   ("set", po::value<std::string>()->default_value("correctness"),
                    "preset set to verify on (default: verify_<plugin> when presets.toml has it, else correctness)")
                   ("world-sizes", po::value<std::string>(), "world sizes (default: CPU 1,2,3,4; GPUs 1..visible)")
                   ("dtype", po::value<std::string>(),
                    "every case in this element type, e.g. fp8_e4m3 (default: each preset's)")
                   ("param", po::value<std::vector<std::string>>()->composing(),
                    "NAME=VALUE: a plugin parameter for every plugin that has it, e.g. engine=cudnn (repeatable)");
  desc.add(own);
  po::positional_options_description pos;
  pos.add("plugins", -1);
  po::variables_map vm;
  if (!parse(args, desc, pos, vm, "usage: attnhost verify [PLUGIN...] [options]")) return kExitOk;
  log::set_quiet(ctx.options.quiet);
  ctx.options.backend.comm_timeout = std::chrono::milliseconds(static_cast<int64_t>(vm["comm-timeout"].as<double>() * 1000));
  ctx.load_presets();
  ctx.load_plugins();
  std::unique_ptr<Backend> probe = make_backend(ctx.options.backend);
  const bool cpu = probe->device_kind() == DeviceKind::cpu;
  std::vector<int> sizes;
  if (vm.count("world-sizes")) sizes = parse_int_list(vm["world-sizes"].as<std::string>(), "world-sizes");
  else if (cpu) sizes = {1, 2, 3, 4};
  else for (int w = 1; w <= probe->max_world_size(); ++w) sizes.push_back(w);
  probe.reset();

  std::vector<std::string> names = vm.count("plugins") ? vm["plugins"].as<std::vector<std::string>>() : ctx.registry.names();
  for (const std::string& n : names)
    if (!ctx.registry.find(n)) {
      std::string hint = suite::did_you_mean(n, ctx.registry.names());
      throw UsageError("unknown plugin '" + n + "'" + (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
    }
  // A plugin whose problems are not the dense presets' (packed sequences, dilation, block
  // patterns) names its own set verify_<plugin> in presets.toml; --set overrides both.
  const bool set_given = !vm["set"].defaulted();
  // Such a set is sized to be checked as it is; the dense presets are scaled down.
  auto set_for = [&](const std::string& plugin) {
    std::string set = vm["set"].as<std::string>();
    if (!set_given && ctx.presets.sets.count("verify_" + plugin)) set = "verify_" + plugin;
    auto members = ctx.presets.sets.find(set);
    if (members == ctx.presets.sets.end()) throw UsageError("unknown preset set '" + set + "'");
    return std::make_pair(members->second, set.rfind("verify_", 0) == 0);
  };

  suite::Suite s;
  s.name = "verify";
  s.outputs.formats = {"console"};
  for (const std::string& plugin : names) {
    const auto [presets, own_set] = set_for(plugin);
    for (const std::string& preset_name : presets) {
      const suite::Preset* preset = ctx.presets.find(preset_name);
      if (!preset) continue;
      suite::Case c;
      c.plugin = plugin;
      c.label = preset_name;
      c.group = "verify/" + plugin;
      c.id = plugin + "/" + preset_name;
      // Packed lengths are the problem itself: a shorter sequence would contradict them. A
      // plugin's own set is sized for checking, but long ones still shrink on the CPU.
      const bool keep = preset->problem.varlen || (own_set && (!cpu || preset->problem.seqlen_q <= kCpuOwnSetSeqlen));
      c.problem = keep ? preset->problem : scaled(preset->problem, cpu);
      c.world_sizes = sizes;
      c.where.file = "verify";
      for (const suite::PluginSchema& schema : ctx.catalog())
        if (schema.name == plugin) c.params = suite::preset_params(*preset, schema, c.where);
      c.timing.method = "simple";
      c.timing.passes = {"fwd", "bwd"};
      c.check.enabled = true;
      s.cases.push_back(std::move(c));
    }
  }
  suite::Overrides params;
  const suite::Overrides given = overrides_from(vm);
  params.params = given.params;
  params.dtype = given.dtype;
  suite::apply_overrides(s, params, ctx.catalog());
  ExecuteOptions ex;
  ex.verification = true;
  ex.formats = {"console"};
  return execute_suite(ctx, s, ex);
}

}  // namespace attnhost::cli
