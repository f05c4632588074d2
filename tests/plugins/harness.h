// Running a built-in plugin through the host's runtime, for tests.
#pragma once

#include "plugins/loader.h"
#include "runtime/backend.h"
#include "runtime/comm_factory.h"
#include "runtime/runner.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <initializer_list>
#include <map>

namespace test {

inline attnhost::PluginRegistry& builtins() {
  static attnhost::PluginRegistry r = [] {
    attnhost::LoaderOptions o;
    o.builtin = false;
    o.user = false;
    o.environment = false;
    // The plugins beside the test binary's build; ATTNHOST_TEST_PLUGIN_DIR when it runs elsewhere
    // (a staged prefix on the GPU machine).
    const char* dir = std::getenv("ATTNHOST_TEST_PLUGIN_DIR");
    o.dirs = {dir ? dir : BUILTIN_PLUGIN_DIR};
    std::vector<std::string> warnings;
    return attnhost::PluginRegistry::load(o, warnings);
  }();
  return r;
}

inline attnhost::suite::Case dense_case(const std::string& plugin, std::vector<int> world_sizes, int64_t seqlen,
                                        int32_t heads, int32_t kv_heads, int32_t head_dim, bool causal,
                                        const std::string& dtype = "bf16") {
  attnhost::suite::Case c;
  c.id = plugin + "/test";
  c.plugin = plugin;
  c.problem.batch = 2;
  c.problem.seqlen_q = c.problem.seqlen_kv = seqlen;
  c.problem.heads_q = heads;
  c.problem.heads_kv = kv_heads;
  c.problem.head_dim = head_dim;
  c.problem.causal = causal;
  c.problem.dtype = dtype;
  c.world_sizes = std::move(world_sizes);
  c.timing.method = "simple";
  c.timing.passes = {"fwd", "bwd"};
  return c;
}

inline attnhost::CaseResult run_on(attnhost::DeviceKind device, const attnhost::suite::Case& c) {
  int gpus = 0;
#if ATTNHOST_HAVE_CUDA
  if (device == attnhost::DeviceKind::cuda) gpus = attnhost::cuda_device_count();
#endif
  // GPUs exchange as attnhost does by default: by the copy engines wherever they reach one another.
  const bool copy_engines = gpus > 1 && attnhost::peer_access_among(gpus);
  auto backend = attnhost::make_thread_backend(device, gpus, std::chrono::milliseconds(20000), copy_engines);
  auto plugin = builtins().find(c.plugin);
  REQUIRE(plugin);
  return attnhost::run_case(c, plugin, *backend, attnhost::RunnerOptions{});
}

// On the GPUs, `ranks_per_gpu` ranks sharing each (worlds larger than the GPUs: copies between the
// ranks, collectives through the host).
inline attnhost::CaseResult run_shared(const attnhost::suite::Case& c, int ranks_per_gpu) {
  int gpus = 0;
#if ATTNHOST_HAVE_CUDA
  gpus = attnhost::cuda_device_count();
#endif
  auto backend = attnhost::make_thread_backend(attnhost::DeviceKind::cuda, gpus, std::chrono::milliseconds(20000),
                                               gpus > 1 && attnhost::peer_access_among(gpus), ranks_per_gpu);
  auto plugin = builtins().find(c.plugin);
  REQUIRE(plugin);
  return attnhost::run_case(c, plugin, *backend, attnhost::RunnerOptions{});
}

inline double error_of(const attnhost::RunResult& r, const std::string& tensor) {
  for (const auto& t : r.check.tensors)
    if (t.tensor == tensor) return t.rel_l2_err;
  FAIL("no check of " << tensor);
  return 0;
}

inline void all_pass(const attnhost::CaseResult& r) {
  REQUIRE(!r.runs.empty());
  for (const auto& run : r.runs) {
    INFO(r.spec.id, " at world size ", run.world_size, ": ", run.error);
    CHECK(run.status == "PASSED");
    CHECK(run.total_pairs == r.runs.front().total_pairs);  // one function, whatever the sharding
    // On a GPU every built-in plugin says which engine ran its attention calls (results.json).
    if (r.device.rfind("cuda", 0) == 0) CHECK(run.engine.rfind("engine: ", 0) == 0);
  }
}

// Partial outputs merge in fp32 and gradients sum in fp32, so a sharded run is as accurate as one
// device (the error bound: at most 1.1x the error at world size 1).
inline void error_does_not_grow(const attnhost::CaseResult& r) {
  REQUIRE(r.runs.front().world_size == 1);
  for (const char* tensor : {"O", "dQ", "dK", "dV"}) {
    const double single = error_of(r.runs.front(), tensor);
    for (const auto& run : r.runs) {
      INFO(r.spec.id, " ", tensor, " at world size ", run.world_size, ": ", error_of(run, tensor), " vs ", single);
      CHECK(error_of(run, tensor) <= 1.1 * single + 1e-7);
    }
  }
}

// The case run on the CPU once for each value of integer parameter `param`, each run passing its
// checks: the first world size's result by value.
inline std::map<int64_t, attnhost::RunResult> runs_by(attnhost::suite::Case c, const std::string& param,
                                                      std::initializer_list<int64_t> values) {
  std::map<int64_t, attnhost::RunResult> runs;
  for (int64_t v : values) {
    c.params[param] = v;
    attnhost::CaseResult r = run_on(attnhost::DeviceKind::cpu, c);
    all_pass(r);
    runs[v] = r.runs[0];
  }
  return runs;
}

}  // namespace test
