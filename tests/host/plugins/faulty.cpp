// A plugin that is right except for one planted fault, chosen by its parameter "fault": the
// runtime tests show that each fault is caught (a wrong element, a wrong rank), reported
// (an error, out of memory) or contained (a crash under --isolate). It wraps the naive_attention
// example's CPU path, so everything but the fault is a real attention.
#include "naive_attention.h"

#include <attnhost/plugin.hpp>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace {

using attnhost::fail;

class Faulty {
 public:
  static const attnhost_plugin_info& info() {
    static const attnhost_param_spec params[] = {
        {ATTNHOST_STRUCT_SIZE(attnhost_param_spec, choices), "fault", ATTNHOST_PARAM_STRING, "\"none\"",
         "the planted fault",
         "none|o_element|dk_element|rank1_o|forward_error|backward_error|alloc_huge|segfault|abort|hang|refuse|"
         "ignore_fp8_descale|wrong_amax|later_world_error"},
    };
    static const attnhost_plugin_info info = {
        ATTNHOST_STRUCT_SIZE(attnhost_plugin_info, params), "faulty", "1.0.0",
        "test plugin: dense attention with one planted fault",
        {ATTNHOST_STRUCT_SIZE(attnhost_capabilities, head_dims), ATTNHOST_CAP_DEVICE_CPU,
         ATTNHOST_CAP_DTYPE(ATTNHOST_DTYPE_BF16) | ATTNHOST_CAP_DTYPE(ATTNHOST_DTYPE_FP32) |
             ATTNHOST_CAP_DTYPE(ATTNHOST_DTYPE_FP8_E4M3),
         ATTNHOST_FEATURE_CAUSAL | ATTNHOST_FEATURE_NONCAUSAL | ATTNHOST_FEATURE_GQA | ATTNHOST_FEATURE_BACKWARD, 1,
         0, 0, nullptr},
        1, params};
    return info;
  }

  static void validate(const attnhost::Problem& p) {
    if (p.get_string("fault") == "refuse") fail(ATTNHOST_ERR_UNSUPPORTED, "faulty refuses every problem");
  }

  Faulty(const attnhost::Problem& p, attnhost::Host host) : problem_(p), host_(host), fault_(p.get_string("fault")) {
    const attnhost_problem& r = p.raw();
    // later_world_error: the forward fails in every world after the first this process makes with
    // that fault (a timing's later round). Each rank counts its own instances.
    static std::atomic<int> worlds_made[64];
    if (fault_ == "later_world_error") later_world_ = worlds_made[r.rank % 64]++ > 0;
    auto chunk = [&](int64_t n) { return (n + r.world_size - 1) / r.world_size; };
    g_ = {r.batch, r.seqlen_q, r.seqlen_kv, r.heads_q, r.heads_kv, r.head_dim, r.causal, r.window_left,
          r.window_right, static_cast<float>(r.softmax_scale), r.world_size, r.rank, chunk(r.seqlen_q),
          chunk(r.seqlen_kv), 0, nullptr};
    int64_t begin = std::min(r.seqlen_q, r.rank * g_.chunk_q), end = std::min(r.seqlen_q, (r.rank + 1) * g_.chunk_q);
    layout_.add(begin, end - begin);
    layout_.pad(g_.chunk_q - (end - begin));
    const size_t gathered = static_cast<size_t>(r.world_size) * r.batch * g_.chunk_kv * r.heads_kv * r.head_dim;
    const size_t el = attnhost::dtype_size(r.dtype);
    k_ = attnhost::HostBuffer(host_, gathered * el);
    v_ = attnhost::HostBuffer(host_, gathered * el);
    dk_ = attnhost::HostBuffer(host_, gathered * sizeof(float));
    dv_ = attnhost::HostBuffer(host_, gathered * sizeof(float));
    dk_sum_ = attnhost::HostBuffer(host_, gathered / r.world_size * sizeof(float));
    dv_sum_ = attnhost::HostBuffer(host_, gathered / r.world_size * sizeof(float));
  }

  attnhost_layout layout(int32_t) { return layout_.view(); }

  // The element types, with an FP8 problem's descales unless the fault drops them.
  template <class Args> naive::Types types(const Args& a, int32_t out) const {
    naive::Types t{a.q.dtype, out};
    if (a.fp8 && fault_ != "ignore_fp8_descale") {
      t.descale_q = a.fp8->descale_q;
      t.descale_k = a.fp8->descale_k;
      t.descale_v = a.fp8->descale_v;
      t.descale_do = a.fp8->descale_do;
    }
    return t;
  }

  void forward(const attnhost_forward_args& a) {
    if (fault_ == "forward_error") fail(ATTNHOST_ERR_INTERNAL, "planted forward error");
    if (later_world_) fail(ATTNHOST_ERR_INTERNAL, "planted forward error in a later world");
    if (fault_ == "alloc_huge") attnhost::HostBuffer huge(host_, size_t{1} << 50);  // 1 PiB
    if (fault_ == "segfault") std::raise(SIGSEGV);
    if (fault_ == "abort") std::abort();
    if (fault_ == "hang") std::this_thread::sleep_for(std::chrono::hours(1));
    gather(a.k.data, a.v.data);
    naive::forward_cpu(g_, types(a, a.o.dtype), a.q.data, k_.get(), v_.get(), a.o.data, static_cast<float*>(a.lse.data), false);
    const bool rank_fault = fault_ == "rank1_o" && problem_->rank == 1;
    if (fault_ == "o_element" || rank_fault) corrupt(a.o, 3 * problem_->head_dim + 1);  // row 3, element 1
    if (fault_ == "wrong_amax" && ATTNHOST_HAS_FIELD(&a, attnhost_forward_args, amax) && a.amax) a.amax->o = 1e6f;
  }

  void backward(const attnhost_backward_args& a) {
    if (fault_ == "backward_error") fail(ATTNHOST_ERR_INTERNAL, "planted backward error");
    gather(a.k.data, a.v.data);
    const attnhost_problem& r = problem_.raw();
    naive::backward_cpu(g_, types(a, a.dq.dtype), a.q.data, k_.get(), v_.get(), a.o.data, static_cast<const float*>(a.lse.data),
                        a.d_o.data, a.dq.data, dk_.as<float>(), dv_.as<float>(), false);
    const size_t local = static_cast<size_t>(r.batch) * g_.chunk_kv * r.heads_kv * r.head_dim;
    host_.reduce_scatter(dk_.get(), dk_sum_.get(), local, ATTNHOST_DTYPE_FP32, ATTNHOST_REDUCE_SUM, nullptr);
    host_.reduce_scatter(dv_.get(), dv_sum_.get(), local, ATTNHOST_DTYPE_FP32, ATTNHOST_REDUCE_SUM, nullptr);
    naive::convert_cpu(dk_sum_.as<float>(), a.dk.data, a.dk.dtype, local);
    naive::convert_cpu(dv_sum_.as<float>(), a.dv.data, a.dv.dtype, local);
    if (fault_ == "dk_element" && r.rank == r.world_size - 1) corrupt(a.dk, 2 * r.head_dim + 5);
  }

  attnhost::PairCount count_pairs() {
    attnhost::PairCount c;
    for (int64_t i = 0; i < problem_->seqlen_q; ++i) {
      naive::Interval k = naive::keys_of(g_, i);
      c.total_pairs += k.hi - k.lo;
      if (i >= g_.q_begin() && i < g_.q_begin() + g_.chunk_q) c.rank_pairs += k.hi - k.lo;
    }
    c.total_pairs *= problem_->batch * problem_->heads_q;
    c.rank_pairs *= problem_->batch * problem_->heads_q;
    return c;
  }
  attnhost_span_list enumerate_keys(int64_t, int32_t, int64_t q) {
    spans_.clear();
    naive::Interval k = naive::keys_of(g_, q);
    spans_.add(k.lo, k.hi);
    return spans_.view();
  }
  attnhost_span_list enumerate_queries(int64_t, int32_t kvh, int64_t key) {
    spans_.clear();
    naive::Interval q = naive::queries_of(g_, key);
    const int32_t group = g_.heads_q / g_.heads_kv;
    for (int32_t h = kvh * group; h < (kvh + 1) * group; ++h) spans_.add(q.lo, q.hi, 1, h);
    return spans_.view();
  }

 private:
  void gather(const void* k, const void* v) {
    const attnhost_problem& r = problem_.raw();
    const size_t local = static_cast<size_t>(r.batch) * g_.chunk_kv * r.heads_kv * r.head_dim;
    host_.all_gather(k, k_.get(), local, r.dtype, nullptr);
    host_.all_gather(v, v_.get(), local, r.dtype, nullptr);
  }
  // Adds 0.5 to one element: small enough to hide in a norm, not in a maximum.
  static void corrupt(const attnhost_tensor& t, int64_t i) {
    if (t.dtype == ATTNHOST_DTYPE_FP32) {
      static_cast<float*>(t.data)[i] += 0.5f;
      return;
    }
    uint16_t& h = static_cast<uint16_t*>(t.data)[i];
    uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    f += 0.5f;
    std::memcpy(&bits, &f, 4);
    h = static_cast<uint16_t>(bits >> 16);
  }

  attnhost::Problem problem_;
  attnhost::Host host_;
  std::string fault_;
  bool later_world_ = false;  // later_world_error, in a world after the first
  naive::Geometry g_{};
  attnhost::Layout layout_;
  attnhost::HostBuffer k_, v_, dk_, dv_, dk_sum_, dv_sum_;
  attnhost::SpanList spans_;
};

}  // namespace

ATTNHOST_EXPORT_PLUGIN(Faulty)
