#include "runtime/rank_state.h"

namespace attnhost {

void summarize_ranks(RankState& state, RunResult& result) {
  int64_t rank_pairs = 0, total_pairs = 0;
  state.attempt([&] { state.instance->count_pairs(&rank_pairs, &total_pairs); });
  state.all_ok();
  const int ws = state.env.world_size;
  std::vector<double> per_rank(3 * ws + 1, 0.0);
  per_rank[state.env.rank] = static_cast<double>(state.env.device.peak_bytes());
  per_rank[ws + state.env.rank] = static_cast<double>(state.sent_fwd);
  per_rank[2 * ws + state.env.rank] = static_cast<double>(state.sent_bwd);
  per_rank[3 * ws] = static_cast<double>(rank_pairs);
  std::vector<double> all = state.env.group.sum(per_rank);
  std::vector<double> most = state.env.group.max({static_cast<double>(rank_pairs)});
  result.total_pairs = total_pairs;
  result.max_rank_pairs = static_cast<int64_t>(most[0]);
  for (int r = 0; r < ws; ++r) {
    result.peak_bytes.push_back(static_cast<uint64_t>(all[r]));
    result.sent_bytes_fwd.push_back(static_cast<uint64_t>(all[ws + r]));
    result.sent_bytes_bwd.push_back(static_cast<uint64_t>(all[2 * ws + r]));
  }
  const double fwd_flops = 4.0 * state.problem.head_dim * static_cast<double>(total_pairs);
  const double tokens = static_cast<double>(state.problem.batch) * state.problem.seqlen_q;
  for (PassResult& p : result.passes) {
    p.flops = p.pass == "fwd" ? fwd_flops : p.pass == "bwd" ? 2.5 * fwd_flops : 3.5 * fwd_flops;
    if (p.time_ms.median > 0) {
      p.tflops_per_gpu = p.flops / (p.time_ms.median * 1e-3) / 1e12 / ws;
      p.tokens_per_s = tokens / (p.time_ms.median * 1e-3);
    }
  }
}

}  // namespace attnhost
