// Context parallelism by routing K/V pieces straight from their owner to the ranks that read them
// (block-sparse attention, and any variant whose ranks need only part of the others' K/V).
//
// Each rank keeps its queries and its own K/V. Round 0 attends the rank's own K/V. In round t
// (1 <= t < P) rank r sends to r + t the pieces of its K/V that r + t reads, receives from r - t
// the pieces it reads itself, and attends them. A piece travels once, from its owner to a reader,
// and a round in which a rank neither sends nor receives costs that rank nothing: no message, no
// call, no wait. Backward sends the pieces again and returns their fp32 dK/dV partials to the
// owner, which adds them into its own. (A ring passes every block through every rank; here a
// P-rank local pattern moves only the edge blocks of neighbours, in one round.)
//
// Received pieces land at their owner's local offsets in a buffer shaped like the owner's K/V, so
// a call's key positions stay kv_pos0 + column and BlockCall's masks work unchanged; what was not
// received is never read, because the calls' block lists do not name it (the variant's promise).
//
// Transfers happen in one global order on every rank — K/V of round t + 1, then dK/dV of round
// t — each rank skipping those it takes no part in, so NCCL and the in-process communicator
// match them without a deadlock. A round's transfer is issued before the previous round computes
// (double-buffered, on stream 1 when `overlap`).
#pragma once

#include "attncore/plugin/engine.h"
#include "attncore/plugin/ring.h"

#include <attnhost/plugin.hpp>

#include <functional>
#include <memory>
#include <vector>

namespace attncore::plugin {

// Local K/V slots [begin, begin + length) of one rank.
struct TokenRun {
  int64_t begin = 0, length = 0;
};

struct RoutedPlan {
  // The attention calls of `rank` on the K/V of `source` (source == rank: its own K/V, which
  // should cover every local row, so that rows without keys get O = 0 and LSE = -inf). Asked
  // only for this instance's rank.
  std::function<std::vector<BlockCall>(int rank, int source)> calls;
  // The local K/V slots of `source` that the calls of `rank` read, sorted and disjoint: what
  // `source` sends to `rank`. Asked for this rank and its peers, so that both ends of every
  // transfer compute it from the same function and agree.
  std::function<std::vector<TokenRun>(int rank, int source)> reads;
};

class RoutedAttention {
 public:
  // `shape` as for RingAttention; every rank's local K/V has shape.local_kv slots.
  RoutedAttention(const RingShape& shape, const RoutedPlan& plan, const ScheduleOptions& options);

  void forward(const attnhost_forward_args& a);
  void backward(const attnhost_backward_args& a);

  // Rounds 1..P-1 in which this rank sends or receives anything, and K/V tokens it receives
  // (per batch entry) in one forward.
  int active_rounds() const;
  int64_t received_tokens() const;

 private:
  struct Round {
    int to = 0, from = 0;                // peers: this rank sends to `to`, receives from `from`
    std::vector<TokenRun> send, recv;    // its own slots `to` reads; `from`'s slots it reads
    std::vector<BlockCall> calls;        // on `from`'s K/V (round 0: its own)
    bool transfers() const { return !send.empty() || !recv.empty(); }
  };
  struct KV {
    void* k;
    void* v;
  };
  // Sends `runs_out` of (k, v) to `to` and receives `runs_in` into (k_in, v_in) from `from`, at the
  // same slot offsets, batch entry by batch entry.
  void exchange(const Round& r, bool reply, const void* k, const void* v, void* k_in, void* v_in, int32_t dtype,
                void* stream, const char* what, int round);
  void zero_runs(void* base, const std::vector<TokenRun>& runs, void* stream);
  void add_runs(float* dst, const float* src, const std::vector<TokenRun>& runs, void* stream);
  size_t kv_token_elems() const { return static_cast<size_t>(s_.heads_kv) * s_.head_dim; }
  // A pass's buffers (workspace.h). Both passes: two K/V receive buffers, when any round receives.
  // The forward: its rows' fp32 output. The backward: its rows' terms, the own dK and dV in fp32
  // (a sole call writes dK and dV itself and leaves their space, `sums_bytes` from own.k, to the
  // sums of its block list's split key groups: BlockList::pieces); with remote rounds also the
  // partials of a received piece and those other ranks send home.
  struct Buffers {
    KV receive[2]{};
    RowBuffers rows;
    KV own{}, part{}, home{};
    size_t sums_bytes = 0;
  };
  Buffers layout(Carver& c, Pass pass, bool receives, size_t split_sums) const;

  RingShape s_;
  attnhost::Host host_;
  int rank_, world_;
  bool overlap_;
  std::unique_ptr<Engine> engine_;
  std::vector<Round> rounds_;  // [0, P)
  Workspace<Buffers> work_;
};

}  // namespace attncore::plugin
