// Context parallelism by all-to-alls between sequence and head sharding (docs/VARIANTS.md, ulysses
// and usp), around the ring of ring.h.
//
// The world is r Ulysses groups of u consecutive ranks (P = u x r). A group holds one ring member's
// block of tokens (dense_plans.h), cut into u pieces of n tokens, one a rank. An all-to-all inside
// the group gives each of its ranks the whole block for 1/u of the heads; the r ranks with the same
// place in their groups then run a RingAttention over those heads; an all-to-all returns O and LSE
// to sequence sharding. ulysses is u = P (a ring of one: one call over the whole sequence); usp is
// any u that divides P (u = 1 is the ring alone).
//
// An all-to-all moves each tensor's rows for a peer as they lie, one copy by the copy engines a
// (tensor, peer), where the host moves strided blocks; elsewhere they are packed into one message.
//
// The heads go in groups through a pipeline: while group g computes on stream 0, the all-to-all of
// group g + 1 runs on stream 2 (the ring's own transfers use stream 1). Tapered, the first group's
// first batch entry and the last group's last are steps of their own: what waits before the first
// call and after the last is one entry's exchange, not a group's. Each pass tapers or not on its own. The forward's head-sharded
// Q, K, V, O and LSE stay for the backward, as a framework's autograd keeps them: a backward on the
// forward's tensors sends only dO in and dQ, dK, dV out; one on other tensors exchanges those too.
//
// Key/value heads are cut among the u ranks when u divides them, and otherwise (u a multiple of
// them) each rank takes the one kv head its query heads read: a kv head is then replicated on u / Hkv
// ranks and its gradients are summed in fp32 on the way home.
#pragma once

#include "attncore/plugin/engine.h"
#include "attncore/plugin/ring.h"

#include <attnhost/plugin.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace attncore::plugin {

// Whether the pipeline's first and last batch entries are steps of their own (above): automatic
// tapers where one entry's call over a head group is long enough to keep the group call's rate.
enum class Taper : int32_t { automatic, on, off };

struct UlyssesShape {
  RingShape ring;             // the whole problem: local_q = local_kv = n, this rank's tokens
  int32_t ulysses = 1;        // u: ranks of a Ulysses group (consecutive world ranks)
  int32_t head_groups = 0;    // groups of the pipeline; 0: two where they cut the kv heads evenly, else one
  Taper taper = Taper::automatic;
  bool packed = false;        // all-to-alls packed into one message a peer even where blocks move as they lie
};

// Empty when `heads_q` query heads and `heads_kv` kv heads can be cut among `u` ranks, else one
// line naming the numbers.
std::string check_ulysses_heads(int32_t heads_q, int32_t heads_kv, int32_t u);
// (10.3) The pipeline's head groups for `heads` query and `kv_heads` kv heads a rank of a Ulysses group
// of `u`, `pairs` the attended pairs of a query head in one batch entry: `asked` where it cuts the kv
// heads evenly (else one); auto (0) two where they cut them evenly and one entry's call over a group
// is long (ulysses.cpp says how long), else one; one where nothing is exchanged (u = 1).
int32_t ulysses_head_groups(int32_t asked, int32_t heads, int32_t kv_heads, int32_t u, int64_t pairs);
// Whether each of the kv heads is replicated on several ranks (fewer kv heads than u).
inline bool kv_heads_replicated(int32_t heads_kv, int32_t u) { return heads_kv < u; }

// The backward's last step runs as one call a member's columns of the sequence (member i's tokens,
// [i n, (i + 1) n)), so that what a run finishes goes home while the later runs compute
// (docs/KERNELS.md, "Ulysses's last step in runs of columns"). For member `member` of a group of `u`
// under `mask`: whose columns run, in order, and after each run the members whose dQ rows are final
// then (every key they reach has run). Each run is the one that finishes the most for the peers, dK
// and dV of its columns (`heads_kv` each) and dQ of the rows it completes (`heads_q`), the lower
// member on a tie.
struct ColumnRunOrder {
  std::vector<int> members;
  std::vector<std::vector<int>> final_rows;
};
ColumnRunOrder column_run_order(const DenseMask& mask, int64_t n, int u, int member, int32_t heads_q,
                                int32_t heads_kv);

class UlyssesAttention {
 public:
  // `plan` is the ring's, over the r ring members' blocks of `block_tokens` tokens (the head-sharded
  // tensors hold u * n >= block_tokens tokens; the rows past the block are padding).
  UlyssesAttention(const UlyssesShape& shape, RingPlan plan, const ScheduleOptions& options);
  ~UlyssesAttention();

  void forward(const attnhost_forward_args& a);
  void backward(const attnhost_backward_args& a);
  int64_t rank_pairs() const;
  int32_t head_groups() const { return groups_; }
  // A step of the pipeline: batch entries [b0, b0 + count) of head group `group`.
  struct Step {
    int32_t group, b0, count;
  };
  const std::vector<Step>& steps() const { return steps_; }  // the backward's
  std::vector<Step> forward_steps() const;                     // (8.1) the forward's, tapered on their own

 private:
  // One tensor of an all-to-all: `tokens` [B, n, heads, D] local and [B, u*n, count, D] head-sharded;
  // else row statistics [B, heads, n] and [B, count, u*n], fp32.
  struct Piece {
    void* local;
    void* sharded;
    int32_t heads;      // of the local tensor
    int32_t count;      // heads a rank takes
    bool kv;            // which heads a rank takes: its kv heads, else its query heads
    bool tokens = true;
    bool sum = false;   // to sequence sharding only: fp32 replicated kv gradients, added into sums [B, Hkv, n, D]
    bool output = false;  // O, dQ, dK, dV: in the outputs' dtype (bf16 in an FP8 problem), else the inputs'
  };
  size_t piece_elem(const Piece& p) const;  // bytes of one element of a tokens piece
  int32_t first_head(int member, const Piece& p, int32_t group) const;
  // Which blocks an exchange moves, where blocks go as they lie and nothing is summed: piece p's
  // block for `member` (out: mine to it; to myself, the copy between layouts) or from it (in), the
  // blocks in posted on `receive`. Empty: all of them, on the exchange's stream.
  struct Moves {
    std::function<bool(size_t piece, int member, bool out)> which;
    void* receive = nullptr;
  };
  // The all-to-all of a step's entries of `pieces` (whole-batch tensors, the step's head group), on
  // `stream`; the member's own heads, which cross no link, are copied on `own` (the compute stream
  // where it has nothing else to do: before the first call, after the last; between them, the
  // exchange stream, or in the backward the ring's idle transfer stream).
  void to_heads(const std::vector<Piece>& pieces, const Step& step, void* stream, void* own, const std::string& what);
  void to_tokens(const std::vector<Piece>& pieces, const Step& step, void* stream, void* own, const std::string& what,
                 const Moves& moves);
  void exchange(const std::vector<Piece>& pieces, bool to_heads, const Step& step, void* stream, void* own,
                const std::string& what, const Moves& moves);
  // The backward's last step in runs of columns (column_run_order), each run's finished gradients
  // sent home under the next runs. `own_in`, where not null: the point on the compute stream where
  // the member's own tokens of dO are in place, before its peers'.
  void backward_last_in_runs(const attnhost_backward_args& a, const attnhost_backward_args& x, const Step& step,
                             const std::vector<Piece>& grads, void* stream, const Engine::Event* own_in);
  attnhost_tensor sharded(void* data, bool kv, int32_t dtype) const;  // one group's head-sharded tensor
  attnhost_tensor stats(void* data) const;
  // Group `group`'s head-sharded Q, K, V, O and LSE, which the forward fills and keeps.
  void kept_tensors(int group, attnhost_tensor& q, attnhost_tensor& k, attnhost_tensor& v, attnhost_tensor& o,
                    attnhost_tensor& lse) const;

  UlyssesShape s_;
  RingShape group_shape_;       // of one head group's ring
  attnhost::Host host_;
  int u_, member_, base_;       // group size, place in the group, the group's first world rank
  int64_t n_;                   // tokens a rank holds
  int32_t heads_, kv_heads_;    // a rank's query and kv heads
  int32_t groups_;
  std::vector<Step> steps_;     // the backward's pipeline (forward_steps: the forward's)
  bool overlap_;
  bool direct_;                 // each block moved as it lies (the host's send_block), nothing packed
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<RingAttention> ring_;
  // The head-sharded tensors, group after group: Q, K, V, O, LSE (kept from the forward), dO, dQ,
  // dK, dV; the staging of one all-to-all's packed messages (none where blocks go as they lie, but
  // for the replicated kv heads' gradients); the fp32 sums of those gradients. The same for
  // both passes (workspace.h): the backward reads what the forward keeps.
  struct Buffers {
    char *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *lse = nullptr, *d_o = nullptr, *dq = nullptr,
         *dk = nullptr, *dv = nullptr, *staging = nullptr;
    float *dk_sum = nullptr, *dv_sum = nullptr;
  };
  Buffers layout(Carver& c) const;
  const Buffers& buffers() const { return work_.forward(); }
  Workspace<Buffers> work_;
  const void* kept_[5] = {};    // the forward's q, k, v, o, lse: what q_ ... lse_ hold
};

}  // namespace attncore::plugin
