#include "attncore/plugin/routed.h"

#include "calls.h"

#include <algorithm>
#include <string>

namespace attncore::plugin {

RoutedAttention::RoutedAttention(const RingShape& shape, const RoutedPlan& plan, const ScheduleOptions& options)
    : s_(shape), host_(options.host), rank_(options.rank), world_(options.world_size), overlap_(options.overlap),
      // The core's own kernels whatever options.engine says: cuDNN takes no block lists.
      engine_(Engine::make(options.cuda, options.cpu_fp64, EngineOptions{EngineChoice::native, options.host})) {
  bool receives = false;
  for (int t = 0; t < world_; ++t) {
    Round r;
    r.to = (rank_ + t) % world_;
    r.from = (rank_ - t + world_) % world_;
    r.calls = plan.calls(rank_, r.from);
    if (t > 0) {
      r.send = plan.reads(r.to, rank_);
      r.recv = plan.reads(rank_, r.from);
      if (!r.calls.empty() && r.recv.empty())
        attnhost::fail(ATTNHOST_ERR_INTERNAL, "routed schedule: rank " + std::to_string(rank_) + " attends the K/V of rank " +
                                                  std::to_string(r.from) + " but reads none of it");
      for (const TokenRun& run : r.recv)
        if (run.begin < 0 || run.length <= 0 || run.begin + run.length > s_.local_kv)
          attnhost::fail(ATTNHOST_ERR_INTERNAL, "routed schedule: a piece lies outside the local K/V");
      receives = receives || !r.recv.empty();
    }
    rounds_.push_back(std::move(r));
  }
  size_t split_sums = 0;  // a sole call's workspace, where its block list has split key groups
  for (const BlockCall& c : rounds_[0].calls) {
    if (!c.blocks) continue;  // (a call without one takes the engine's workspace: the last wave's sums)
    BackwardParams p;
    p.batch = s_.batch;
    p.heads_kv = s_.heads_kv;
    p.head_dim = s_.head_dim;
    p.blocks = c.blocks;
    p.write_dkdv = true;
    split_sums = std::max(split_sums, backward_workspace_bytes(p));
  }
  work_ = Workspace<Buffers>(host_, [&](Carver& c, Pass pass) { return layout(c, pass, receives, split_sums); });
}

RoutedAttention::Buffers RoutedAttention::layout(Carver& c, Pass pass, bool receives, size_t split_sums) const {
  const LocalSizes n = local_sizes(s_);
  const size_t block = n.kv * attnhost::dtype_size(s_.dtype), grads = n.kv * 4;
  Buffers b;
  if (receives)
    for (KV& r : b.receive) r = {c.take(block), c.take(block)};
  b.rows = take_row_buffers(c, pass, s_);
  if (pass == Pass::forward) return b;
  b.own = {c.take(grads), c.take(grads)};  // adjacent (256-byte multiples): split sums may run on past own.k
  b.sums_bytes = std::max(2 * align_up(grads), align_up(split_sums));
  c.take(b.sums_bytes - 2 * align_up(grads));
  if (world_ > 1 && active_rounds() > 0) {
    b.part = {c.take(grads), c.take(grads)};
    b.home = {c.take(grads), c.take(grads)};
  }
  return b;
}

int RoutedAttention::active_rounds() const {
  int n = 0;
  for (size_t t = 1; t < rounds_.size(); ++t) n += rounds_[t].transfers();
  return n;
}

int64_t RoutedAttention::received_tokens() const {
  int64_t n = 0;
  for (size_t t = 1; t < rounds_.size(); ++t)
    for (const TokenRun& run : rounds_[t].recv) n += run.length;
  return n;
}

void RoutedAttention::exchange(const Round& r, bool reply, const void* k, const void* v, void* k_in, void* v_in,
                               int32_t dtype, void* stream, const char* what, int round) {
  // Forward direction: own slots r.send go to r.to, r.from's slots r.recv arrive. A reply runs the
  // other way over the same pieces: the partials of r.recv go back to r.from, those of r.send arrive.
  const std::vector<TokenRun>& out = reply ? r.recv : r.send;
  const std::vector<TokenRun>& in = reply ? r.send : r.recv;
  const int out_peer = reply ? r.from : r.to, in_peer = reply ? r.to : r.from;
  const size_t el = dtype == ATTNHOST_DTYPE_FP32 ? 4 : attnhost::dtype_size(s_.dtype);
  const size_t token = kv_token_elems();
  const size_t batch_stride = static_cast<size_t>(s_.local_kv) * token * el;
  auto at = [&](const void* base, int32_t b, const TokenRun& run) {
    return static_cast<const char*>(base) + b * batch_stride + static_cast<size_t>(run.begin) * token * el;
  };
  std::string name = std::string(what) + " round " + std::to_string(round);
  int32_t range = host_.range_begin(name.c_str(), ATTNHOST_RANGE_COMMUNICATION, stream);
  host_.group_start();
  for (int32_t b = 0; b < s_.batch; ++b) {
    for (const TokenRun& run : out) {
      host_.send(at(k, b, run), run.length * token, dtype, out_peer, stream);
      host_.send(at(v, b, run), run.length * token, dtype, out_peer, stream);
    }
    for (const TokenRun& run : in) {
      host_.recv(const_cast<char*>(at(k_in, b, run)), run.length * token, dtype, in_peer, stream);
      host_.recv(const_cast<char*>(at(v_in, b, run)), run.length * token, dtype, in_peer, stream);
    }
  }
  host_.group_end();
  host_.range_end(range, stream);
}

void RoutedAttention::zero_runs(void* base, const std::vector<TokenRun>& runs, void* stream) {
  const size_t token = kv_token_elems() * 4;
  for (int32_t b = 0; b < s_.batch; ++b)
    for (const TokenRun& run : runs)
      engine_->zero(static_cast<char*>(base) + (static_cast<size_t>(b) * s_.local_kv + run.begin) * token,
                    run.length * token, stream);
}

void RoutedAttention::add_runs(float* dst, const float* src, const std::vector<TokenRun>& runs, void* stream) {
  const size_t token = kv_token_elems();
  for (int32_t b = 0; b < s_.batch; ++b)
    for (const TokenRun& run : runs) {
      const size_t off = (static_cast<size_t>(b) * s_.local_kv + run.begin) * token;
      engine_->add(dst + off, src + off, run.length * token, stream);
    }
}

void RoutedAttention::forward(const attnhost_forward_args& a) {
  void* compute = host_.stream(0);
  void* comm = overlap_ ? host_.stream(1) : compute;
  const Buffers& w = work_.forward();
  std::vector<std::vector<BlockCall>> steps;
  for (const Round& r : rounds_) steps.push_back(r.calls);
  const std::vector<std::vector<OutputCall>> plans = output_calls(steps);
  OutputAccumulator out(s_, *engine_, w.rows, static_cast<float*>(a.lse.data), a.o.data);
  for (int t = 0; t < world_; ++t) {
    if (t + 1 < world_ && rounds_[t + 1].transfers()) {
      engine_->wait(comm, compute);  // the receive buffer was read two rounds ago
      KV next = w.receive[(t + 1) % 2];
      exchange(rounds_[t + 1], false, a.k.data, a.v.data, next.k, next.v, s_.dtype, comm, "K V", t + 1);
    }
    KV cur = t == 0 ? KV{a.k.data, a.v.data} : w.receive[t % 2];
    for (const OutputCall& c : plans[t]) {
      std::string name = "attention round " + std::to_string(t);
      int32_t range = host_.range_begin(name.c_str(), ATTNHOST_RANGE_COMPUTE, compute);
      out.run(forward_params(s_, c.call, a.q.data, cur.k, cur.v, fp8_scaling(a)), c, compute);
      host_.range_end(range, compute);
    }
    if (t + 1 < world_ && !rounds_[t + 1].recv.empty()) engine_->wait(compute, comm);  // the next pieces arrived
  }
  if (active_rounds() > 0) engine_->wait(compute, comm);  // sends of a round that received nothing end in the pass too
  out.finish(compute);
}

void RoutedAttention::backward(const attnhost_backward_args& a) {
  void* compute = host_.stream(0);
  void* comm = overlap_ ? host_.stream(1) : compute;
  const size_t kv_elems = local_sizes(s_).kv;
  const Buffers& w = work_.backward();
  float *delta = w.rows.delta, *dq = w.rows.dq;
  const KV own = w.own, part = w.part, home = w.home;
  compute_local_delta(s_, *engine_, a, delta, dq, compute);
  // One call that makes every local key's gradients (no other rank reads these keys, so no round
  // after the first has calls; no segments) writes dK and dV in the problem's dtype straight into
  // the outputs: no fp32 accumulators to zero and convert.
  const bool sole = active_rounds() == 0 && rounds_[0].calls.size() == 1 && covers_all_keys(s_, rounds_[0].calls[0]);
  if (!sole) {
    engine_->zero(own.k, kv_elems * 4, compute);
    engine_->zero(own.v, kv_elems * 4, compute);
  }

  for (int t = 0; t < world_; ++t) {
    const Round& r = rounds_[t];
    if (t + 1 < world_ && rounds_[t + 1].transfers()) {
      engine_->wait(comm, compute);
      KV next = w.receive[(t + 1) % 2];
      exchange(rounds_[t + 1], false, a.k.data, a.v.data, next.k, next.v, s_.dtype, comm, "K V", t + 1);
    }
    KV cur = t == 0 ? KV{a.k.data, a.v.data} : w.receive[t % 2];
    KV grad = t == 0 ? own : part;  // a received piece's partials go home to its owner
    if (t > 0 && !r.recv.empty()) {  // every piece's partials go home, computed on or not
      zero_runs(part.k, r.recv, compute);
      zero_runs(part.v, r.recv, compute);
    }
    for (const BlockCall& c : r.calls) {
      if (c.backward_segments && c.num_backward_segments == 0) continue;  // nothing attends
      std::string name = "attention backward round " + std::to_string(t);
      int32_t range = host_.range_begin(name.c_str(), ATTNHOST_RANGE_COMPUTE, compute);
      BackwardParams p = backward_params(s_, c, a, cur.k, cur.v, delta, dq, static_cast<float*>(grad.k),
                                         static_cast<float*>(grad.v));
      if (sole) {
        write_dkdv_into(p, s_, c, a);
        p.workspace = own.k;
        p.workspace_bytes = w.sums_bytes;
      }
      engine_->backward(p, compute);
      host_.range_end(range, compute);
    }
    if (t > 0 && r.transfers()) {
      // Partials of the pieces received this round go back to their owner; those of the pieces
      // this rank sent come home and are added into its own.
      engine_->wait(comm, compute);
      exchange(r, true, part.k, part.v, home.k, home.v, ATTNHOST_DTYPE_FP32, comm, "dK dV", t);
      engine_->wait(compute, comm);
      add_runs(static_cast<float*>(own.k), static_cast<float*>(home.k), r.send, compute);
      add_runs(static_cast<float*>(own.v), static_cast<float*>(home.v), r.send, compute);
    } else if (t + 1 < world_ && !rounds_[t + 1].recv.empty()) {
      engine_->wait(compute, comm);  // the next pieces arrived
    }
  }
  if (active_rounds() > 0) engine_->wait(compute, comm);  // stream 1 joins stream 0 before the pass ends
  convert_out(s_, *engine_, dq, a.dq.data, false, compute);
  if (!sole) {
    convert_out(s_, *engine_, static_cast<float*>(own.k), a.dk.data, true, compute);
    convert_out(s_, *engine_, static_cast<float*>(own.v), a.dv.data, true, compute);
  }
}

}  // namespace attncore::plugin
