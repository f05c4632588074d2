#include "schedule.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <queue>
#include <utility>

namespace varlen {

namespace {

using attncore::Segment;
using attncore::plugin::DenseMask;

struct Planned {  // an attending segment and the pairs it computes
  Segment segment;
  int64_t pairs;
};

Segment segment(int64_t q_begin, int64_t q_end, int64_t kv_begin, int64_t kv_end, int64_t q_pos0, int64_t kv_pos0) {
  return {static_cast<int32_t>(q_begin), static_cast<int32_t>(q_end), static_cast<int32_t>(kv_begin),
          static_cast<int32_t>(kv_end), q_pos0, kv_pos0};
}

// The call of `planned`: the forward's segments (attending by pairs, most last, then the rows
// they leave out) and the backward's (attending, most pairs first).
StepCall finish(std::vector<Planned> planned, bool masked, int64_t local_tokens) {
  std::stable_sort(planned.begin(), planned.end(), [](const Planned& a, const Planned& b) { return a.pairs < b.pairs; });
  StepCall call;
  call.masked = masked;
  std::vector<std::pair<int64_t, int64_t>> rows;
  for (const Planned& p : planned) {
    call.forward.push_back(p.segment);
    call.pairs += p.pairs;
    rows.emplace_back(p.segment.q_begin, p.segment.q_end);
  }
  call.backward.assign(call.forward.rbegin(), call.forward.rend());
  std::sort(rows.begin(), rows.end());
  int64_t at = 0;
  for (auto [begin, end] : rows) {
    if (begin > at) call.forward.push_back(segment(at, begin, 0, 0, 0, 0));
    at = std::max(at, end);
  }
  if (at < local_tokens) call.forward.push_back(segment(at, local_tokens, 0, 0, 0, 0));
  return call;
}

// The local rows a step's calls cover: all of them with the rank's own block, else the split
// sequences' (the placed ones attend their own block alone).
int64_t rows_of(const Sharding& sh, int rank, int source) { return source == rank ? sh.local_tokens() : sh.split_slots(); }

// Causal, no left window: one call a step (schedule.h).
std::vector<StepCall> plan_causal(const Sharding& sh, int rank, int source) {
  std::vector<Planned> planned;
  for (int64_t s = 0; s < sh.num_seqs(); ++s) {
    const Piece q_early = sh.piece(rank, s, 0), q_late = sh.piece(rank, s, 1);
    const Piece k_early = sh.piece(source, s, 0), k_late = sh.piece(source, s, 1);
    const int64_t base = sh.base(s);
    const int64_t q_real = q_early.real + q_late.real, k_real = k_early.real + k_late.real;
    if (source == rank) {  // slots numbered 0, 1, ...: the causal order of the two chunks
      if (q_real > 0) planned.push_back({segment(base, base + q_real, base, base + q_real, 0, 0), q_real * (q_real + 1) / 2});
    } else if (source < rank) {  // both local chunks come after the source's early chunk
      if (q_real > 0 && k_early.real > 0)
        planned.push_back({segment(base, base + q_real, k_early.slot, k_early.slot + k_early.real, q_early.pos, k_early.pos),
                           q_real * k_early.real});
    } else {  // only the late chunk comes after both of the source's chunks
      if (q_late.real > 0 && k_real > 0)
        planned.push_back({segment(q_late.slot, q_late.slot + q_late.real, base, base + k_real, q_late.pos, k_early.pos),
                           q_late.real * k_real});
    }
  }
  if (planned.empty()) return {};
  return {finish(std::move(planned), source == rank, rows_of(sh, rank, source))};
}

// Any mask: (chunk, chunk) segments at true positions, as many calls as a chunk needs.
std::vector<StepCall> plan_chunks(const Sharding& sh, const SequenceMask& mask, int rank, int source, bool deterministic) {
  struct Open {
    std::vector<Planned> planned;
    std::vector<char> rows_taken, keys_taken;  // by (sequence, chunk)
  };
  std::vector<Open> calls;
  const int K = sh.pieces();
  const size_t chunks = static_cast<size_t>(sh.num_seqs()) * K;
  for (int64_t s = 0; s < sh.num_seqs(); ++s) {
    const DenseMask m = mask.of(sh.length(s));
    for (int qk = 0; qk < K; ++qk) {
      const Piece q = sh.piece(rank, s, qk);
      if (q.real == 0) continue;
      for (int kk = 0; kk < K; ++kk) {
        const Piece k = sh.piece(source, s, kk);
        if (k.real == 0) continue;
        const DenseMask::Block block = m.block(q.pos, q.pos + q.real, k.pos, k.pos + k.real);
        if (block == DenseMask::Block::empty) continue;
        const int64_t pairs =
            block == DenseMask::Block::full ? q.real * k.real : m.pairs(q.pos, q.pos + q.real, k.pos, k.pos + k.real);
        const size_t qi = static_cast<size_t>(s) * K + qk, ki = static_cast<size_t>(s) * K + kk;
        auto fits = [&](const Open& o) { return !o.rows_taken[qi] && !(deterministic && o.keys_taken[ki]); };
        auto it = std::find_if(calls.begin(), calls.end(), fits);
        if (it == calls.end()) {
          calls.push_back({{}, std::vector<char>(chunks, 0), std::vector<char>(chunks, 0)});
          it = calls.end() - 1;
        }
        it->planned.push_back({segment(q.slot, q.slot + q.real, k.slot, k.slot + k.real, q.pos, k.pos), pairs});
        it->rows_taken[qi] = it->keys_taken[ki] = 1;
      }
    }
  }
  std::vector<StepCall> out;
  for (Open& o : calls) out.push_back(finish(std::move(o.planned), true, rows_of(sh, rank, source)));
  return out;
}

}  // namespace

std::vector<StepCall> plan_step(const Sharding& sharding, const SequenceMask& mask, int rank, int source,
                                bool deterministic) {
  if (sharding.zigzag() && mask.causal && mask.window_left < 0) return plan_causal(sharding, rank, source);
  return plan_chunks(sharding, mask, rank, source, deterministic);
}

std::vector<int> place_sequences(const std::vector<int64_t>& cu, const SequenceMask& mask, int world_size) {
  const size_t n = cu.size() - 1;
  std::vector<int64_t> pairs(n);
  for (size_t s = 0; s < n; ++s) pairs[s] = mask.of(cu[s + 1] - cu[s]).pairs(0, cu[s + 1] - cu[s], 0, cu[s + 1] - cu[s]);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return pairs[a] > pairs[b]; });
  const double share = static_cast<double>(std::accumulate(pairs.begin(), pairs.end(), int64_t{0})) / world_size;
  // The owners when the first `split` of `order` are split and the rest placed, and the most pairs
  // a rank then computes.
  const auto place = [&](size_t split, std::vector<int>& owner) {
    double split_pairs = 0;
    for (size_t i = 0; i < split; ++i) split_pairs += static_cast<double>(pairs[order[i]]);
    using Load = std::pair<double, int>;  // (pairs so far, rank): the least first
    std::priority_queue<Load, std::vector<Load>, std::greater<Load>> ranks;
    for (int r = 0; r < world_size; ++r) ranks.push({split_pairs / world_size, r});
    owner.assign(n, -1);
    for (size_t i = split; i < n; ++i) {
      Load least = ranks.top();
      ranks.pop();
      owner[order[i]] = least.second;
      least.first += static_cast<double>(pairs[order[i]]);
      ranks.push(least);
    }
    double most = 0;
    for (; !ranks.empty(); ranks.pop()) most = std::max(most, ranks.top().first);
    return most;
  };
  // The fewest split, counted up from none: the most is not monotonic in the count (eight equal
  // sequences place evenly on two ranks, but not seven beside an eighth split), and the search
  // ends after the few long sequences of a realistic mix. All split meets any slack.
  std::vector<int> owner;
  for (size_t split = 0; split < n; ++split)
    if (place(split, owner) <= (1 + kPlacementSlack) * share) return owner;
  place(n, owner);
  return owner;
}

int64_t total_pairs(const Sharding& sharding, const SequenceMask& mask) {
  int64_t pairs = 0;
  for (int64_t s = 0; s < sharding.num_seqs(); ++s) {
    const int64_t L = sharding.length(s);
    pairs += mask.of(L).pairs(0, L, 0, L);
  }
  return pairs;
}

}  // namespace varlen
