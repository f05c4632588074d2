// blocksparse_mask_time: what building a mask costs on the host, the way the plugin's create
// builds it — the whole mask (shared by the ranks, cached per shape), then one rank's block lists
// and the pieces it exchanges — to set beside the attention time the mask serves.
//
//   blocksparse_mask_time SEQLEN HEADS [key=value ...]
//     keys: the plugin's parameters (pattern, block_size, window_blocks, stride_blocks, dilation,
//           global_blocks, random_blocks, sink_blocks, seed, per_head, mask_file), causal (0/1,
//           default 1), window_left, window_right, world (ranks, default 1), repeat (default 20)
//
// Prints the medians of `repeat` builds of each part (thread CPU time and wall time, ms) and the density.
#include "pattern.h"
#include "routes.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

// Medians of `repeat` runs: this thread's CPU time (what the build costs, even on a busy machine)
// and wall time, in milliseconds.
struct Times {
  double cpu = 0, wall = 0;
};

double thread_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

template <class F>
Times median_ms(int repeat, F f) {
  std::vector<double> cpu, wall;
  for (int i = 0; i < repeat; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_ms();
    f();
    cpu.push_back(thread_ms() - c0);
    wall.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(cpu.begin(), cpu.end());
  std::sort(wall.begin(), wall.end());
  return {cpu[cpu.size() / 2], wall[wall.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s SEQLEN HEADS [key=value ...]   (see the top of tools/mask_time.cpp)\n", argv[0]);
    return 2;
  }
  const int64_t seqlen = std::atoll(argv[1]);
  const int32_t heads = std::atoi(argv[2]);
  std::map<std::string, std::string> kv;
  for (int i = 3; i < argc; ++i) {
    std::string a = argv[i];
    const size_t eq = a.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "expected key=value, got '%s'\n", argv[i]);
      return 2;
    }
    kv[a.substr(0, eq)] = a.substr(eq + 1);
  }
  auto num = [&](const char* k, int64_t d) { return kv.count(k) ? std::atoll(kv[k].c_str()) : d; };
  blocksparse::Pattern p;
  if (kv.count("pattern")) p.name = kv["pattern"];
  p.block_size = static_cast<int32_t>(num("block_size", p.block_size));
  p.window = num("window_blocks", p.window);
  p.stride = num("stride_blocks", p.stride);
  p.dilation = num("dilation", p.dilation);
  p.global = num("global_blocks", p.global);
  p.random = num("random_blocks", p.random);
  p.sink = num("sink_blocks", p.sink);
  p.seed = num("seed", p.seed);
  p.per_head = num("per_head", 0) != 0;
  if (kv.count("mask_file")) p.mask_file = kv["mask_file"];
  attncore::plugin::DenseMask dense;
  dense.seqlen = seqlen;
  dense.causal = num("causal", 1) != 0;
  dense.window_left = num("window_left", -1);
  dense.window_right = num("window_right", -1);
  const int world = static_cast<int>(num("world", 1));
  const int repeat = static_cast<int>(std::max<int64_t>(1, num("repeat", 20)));

  try {
    std::unique_ptr<blocksparse::MaskFile> file;
    if (p.name == "explicit") file = std::make_unique<blocksparse::MaskFile>(blocksparse::read_mask_file(p.mask_file));
    blocksparse::BlockMask m;
    const Times build = median_ms(repeat, [&] { m = blocksparse::build_mask(p, seqlen, heads, dense, file.get()); });
    const blocksparse::Sharding shard{seqlen, m.block, m.blocks, world};
    Times lists;  // the slowest rank
    for (int r = 0; r < world; ++r) {
      const Times t = median_ms(repeat, [&] {
                for (int s = 0; s < world; ++s) {
                  (void)blocksparse::call_list(m, shard, r, s);
                  (void)blocksparse::reads(m, shard, r, s);
                  (void)blocksparse::reads(m, shard, s, r);
                }
              });
      if (t.cpu > lists.cpu) lists = t;
    }
    std::printf("%s, block %d, S=%lld, %d heads%s%s: %d x %d blocks, %lld kept, density %.4f of the grid (%.4f of the "
                "blocks the mask of the problem leaves)\n",
                p.describe().c_str(), m.block, static_cast<long long>(seqlen), heads, m.heads == 1 ? " (shared mask)" : "",
                dense.causal ? ", causal" : "", m.blocks, m.blocks, static_cast<long long>(m.kept()), m.density(),
                m.density_of_visible());
    std::printf("mask build %.4f ms CPU (%.4f ms wall); block lists and pieces of the slowest of %d ranks %.4f ms CPU "
                "(%.4f ms wall); medians of %d\n",
                build.cpu, build.wall, world, lists.cpu, lists.wall, repeat);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
