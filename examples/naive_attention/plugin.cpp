// The plugin table: describe, validate, layout, forward, backward and the key enumeration,
// through the C++ helper <attnhost/plugin.hpp>.
#include "naive_attention.h"

#include <attnhost/plugin.hpp>

#include <cstring>
#include <vector>

namespace {

using attnhost::fail;

constexpr uint32_t kDtypes = ATTNHOST_CAP_DTYPE(ATTNHOST_DTYPE_BF16) | ATTNHOST_CAP_DTYPE(ATTNHOST_DTYPE_FP16) |
                             ATTNHOST_CAP_DTYPE(ATTNHOST_DTYPE_FP32) | ATTNHOST_CAP_DTYPE(ATTNHOST_DTYPE_FP8_E4M3) |
                             ATTNHOST_CAP_DTYPE(ATTNHOST_DTYPE_FP8_E5M2);

// The call's element types, and an FP8 problem's descales (ABI 1.4: absent from a 1.3 host's
// arguments, which never carry FP8).
template <class Args> naive::Types types_of(const Args& a, int32_t out) {
  naive::Types t{a.q.dtype, out};
  if (ATTNHOST_HAS_FIELD(&a, Args, fp8) && a.fp8) {
    t.descale_q = a.fp8->descale_q;
    t.descale_k = a.fp8->descale_k;
    t.descale_v = a.fp8->descale_v;
    t.descale_do = a.fp8->descale_do;
  }
  return t;
}

class NaiveAttention {
 public:
  static const attnhost_plugin_info& info() {
    static const attnhost_param_spec params[] = {
        {ATTNHOST_STRUCT_SIZE(attnhost_param_spec, choices), "threads_per_block", ATTNHOST_PARAM_INT, "128",
         "CUDA threads per block (one thread computes one row)", nullptr},
        {ATTNHOST_STRUCT_SIZE(attnhost_param_spec, choices), "cpu_accumulate", ATTNHOST_PARAM_STRING, "\"fp32\"",
         "accumulation type of the CPU path", "fp32|fp64"},
    };
    static const attnhost_plugin_info info = {
        ATTNHOST_STRUCT_SIZE(attnhost_plugin_info, params),
        "naive_attention",
        "1.0.0",
        "example plugin: dense attention, all-gathered K/V, one thread per row",
        {ATTNHOST_STRUCT_SIZE(attnhost_capabilities, head_dims),
         ATTNHOST_CAP_DEVICE_CPU
#if NAIVE_HAVE_CUDA
             | ATTNHOST_CAP_DEVICE_CUDA
#endif
         ,
         kDtypes,
         ATTNHOST_FEATURE_CAUSAL | ATTNHOST_FEATURE_NONCAUSAL | ATTNHOST_FEATURE_WINDOW | ATTNHOST_FEATURE_GQA |
             ATTNHOST_FEATURE_VARLEN | ATTNHOST_FEATURE_BACKWARD | ATTNHOST_FEATURE_DETERMINISTIC |
             ATTNHOST_FEATURE_CROSS,
         1, 0, 0, nullptr},
        2,
        params,
    };
    return info;
  }

  static void validate(const attnhost::Problem& p) {
    if (p->head_dim <= 0 || p->head_dim > naive::kMaxHeadDim)
      fail(ATTNHOST_ERR_UNSUPPORTED, "head_dim " + std::to_string(p->head_dim) + " is not in 1..256");
    if (p->heads_kv <= 0 || p->heads_q % p->heads_kv != 0)
      fail(ATTNHOST_ERR_INVALID_ARGUMENT, "heads_q must be a multiple of heads_kv");
    if (p.packed() && p.cu_seqlens_q() != p.cu_seqlens_kv())
      fail(ATTNHOST_ERR_UNSUPPORTED, "packed input needs the same sequence lengths for queries and keys");
    if (p.get_int("threads_per_block") < 32 || p.get_int("threads_per_block") > 1024)
      fail(ATTNHOST_ERR_INVALID_ARGUMENT, "threads_per_block must be in 32..1024");
  }

  NaiveAttention(const attnhost::Problem& p, attnhost::Host host) : problem_(p), host_(host) {
    const attnhost_problem& r = p.raw();
    auto chunk = [&](int64_t n) { return (n + r.world_size - 1) / r.world_size; };
    g_ = {r.batch, r.seqlen_q, r.seqlen_kv, r.heads_q, r.heads_kv, r.head_dim, r.causal, r.window_left,
          r.window_right, static_cast<float>(r.softmax_scale), r.world_size, r.rank, chunk(r.seqlen_q),
          chunk(r.seqlen_kv), r.num_seqs, problem_.packed() ? problem_.cu_seqlens_q().data() : nullptr};
    cuda_ = r.device_type == ATTNHOST_DEVICE_CUDA;
    fp64_ = p.get_string("cpu_accumulate") == "fp64";
    threads_ = static_cast<int>(p.get_int("threads_per_block"));
    for (attnhost::Layout* l : {&q_layout_, &kv_layout_}) {
      int64_t n = l == &q_layout_ ? r.seqlen_q : r.seqlen_kv;
      int64_t c = l == &q_layout_ ? g_.chunk_q : g_.chunk_kv;
      int64_t begin = std::min(n, r.rank * c), end = std::min(n, (r.rank + 1) * c);
      l->add(begin, end - begin);
      l->pad(c - (end - begin));  // equal chunks on every rank, so all-gather needs no counts
    }
    const size_t gathered = static_cast<size_t>(r.world_size) * r.batch * g_.chunk_kv * r.heads_kv * r.head_dim;
    const size_t el = attnhost::dtype_size(r.dtype);
    k_all_ = attnhost::HostBuffer(host_, gathered * el);
    v_all_ = attnhost::HostBuffer(host_, gathered * el);
    // Backward's workspace, kept for the instance's life: kernels enqueued by one call may still
    // be reading it when the call returns.
    dk_part_ = attnhost::HostBuffer(host_, gathered * sizeof(float));
    dv_part_ = attnhost::HostBuffer(host_, gathered * sizeof(float));
    dk_sum_ = attnhost::HostBuffer(host_, gathered / r.world_size * sizeof(float));
    dv_sum_ = attnhost::HostBuffer(host_, gathered / r.world_size * sizeof(float));
#if NAIVE_HAVE_CUDA
    if (cuda_ && p.packed()) {
      cu_device_ = attnhost::HostBuffer(host_, p.cu_seqlens_q().size() * sizeof(int64_t));
      naive::upload_cuda(cu_device_.get(), problem_.cu_seqlens_q().data(), cu_device_.bytes());
      device_g_ = g_;
      device_g_.cu_seqlens = cu_device_.as<int64_t>();
    }
#endif
  }

  attnhost_layout layout(int32_t kind) { return (kind == ATTNHOST_LAYOUT_Q ? q_layout_ : kv_layout_).view(); }

  void forward(const attnhost_forward_args& a) {
    gather_kv(a.k.data, a.v.data);
    int32_t range = host_.range_begin("attention", ATTNHOST_RANGE_COMPUTE, host_.stream(0));
#if NAIVE_HAVE_CUDA
    if (cuda_) {
      naive::forward_cuda(device_g_or_g(), types_of(a, a.o.dtype), a.q.data, k_all_.get(), v_all_.get(), a.o.data,
                          static_cast<float*>(a.lse.data), threads_, host_.stream(0));
      host_.range_end(range, host_.stream(0));
      return;
    }
#endif
    naive::forward_cpu(g_, types_of(a, a.o.dtype), a.q.data, k_all_.get(), v_all_.get(), a.o.data, static_cast<float*>(a.lse.data), fp64_);
    host_.range_end(range, host_.stream(0));
  }

  void backward(const attnhost_backward_args& a) {
    gather_kv(a.k.data, a.v.data);
    const attnhost_problem& r = problem_.raw();
    const size_t local = static_cast<size_t>(r.batch) * g_.chunk_kv * r.heads_kv * r.head_dim;
    void* s = host_.stream(0);
    int32_t range = host_.range_begin("gradients", ATTNHOST_RANGE_COMPUTE, s);
#if NAIVE_HAVE_CUDA
    if (cuda_)
      naive::backward_cuda(device_g_or_g(), types_of(a, a.dq.dtype), a.q.data, k_all_.get(), v_all_.get(), a.o.data,
                           static_cast<const float*>(a.lse.data), a.d_o.data, a.dq.data, dk_part_.as<float>(),
                           dv_part_.as<float>(), threads_, s);
    else
#endif
      naive::backward_cpu(g_, types_of(a, a.dq.dtype), a.q.data, k_all_.get(), v_all_.get(), a.o.data,
                          static_cast<const float*>(a.lse.data), a.d_o.data, a.dq.data, dk_part_.as<float>(),
                          dv_part_.as<float>(), fp64_);
    host_.range_end(range, s);
    // Each rank's partial dK/dV covers every key; the sum of the owner's block is its gradient.
    range = host_.range_begin("reduce_scatter dK dV", ATTNHOST_RANGE_COMMUNICATION, s);
    host_.reduce_scatter(dk_part_.get(), dk_sum_.get(), local, ATTNHOST_DTYPE_FP32, ATTNHOST_REDUCE_SUM, s);
    host_.reduce_scatter(dv_part_.get(), dv_sum_.get(), local, ATTNHOST_DTYPE_FP32, ATTNHOST_REDUCE_SUM, s);
    host_.range_end(range, s);
#if NAIVE_HAVE_CUDA
    if (cuda_) {
      naive::convert_cuda(dk_sum_.as<float>(), a.dk.data, a.dk.dtype, local, s);
      naive::convert_cuda(dv_sum_.as<float>(), a.dv.data, a.dv.dtype, local, s);
      return;
    }
#endif
    naive::convert_cpu(dk_sum_.as<float>(), a.dk.data, a.dk.dtype, local);
    naive::convert_cpu(dv_sum_.as<float>(), a.dv.data, a.dv.dtype, local);
  }

  attnhost::PairCount count_pairs() {
    const attnhost_problem& r = problem_.raw();
    attnhost::PairCount c;
    for (int64_t i = 0; i < r.seqlen_q; ++i) {
      naive::Interval k = naive::keys_of(g_, i);
      int64_t n = k.hi - k.lo;
      c.total_pairs += n;
      if (i >= g_.q_begin() && i < g_.q_begin() + g_.chunk_q) c.rank_pairs += n;
    }
    c.total_pairs *= r.batch * r.heads_q;
    c.rank_pairs *= r.batch * r.heads_q;
    return c;
  }

  attnhost_span_list enumerate_keys(int64_t, int32_t, int64_t q) {
    spans_.clear();
    naive::Interval k = naive::keys_of(g_, q);
    spans_.add(k.lo, k.hi);
    return spans_.view();
  }

  attnhost_span_list enumerate_queries(int64_t, int32_t kv_head, int64_t key) {
    spans_.clear();
    naive::Interval q = naive::queries_of(g_, key);
    const int32_t group = g_.heads_q / g_.heads_kv;
    for (int32_t h = kv_head * group; h < (kv_head + 1) * group; ++h) spans_.add(q.lo, q.hi, 1, h);
    return spans_.view();
  }

 private:
  void gather_kv(const void* k, const void* v) {
    const attnhost_problem& r = problem_.raw();
    const size_t local = static_cast<size_t>(r.batch) * g_.chunk_kv * r.heads_kv * r.head_dim;
    void* s = host_.stream(0);
    int32_t range = host_.range_begin("all_gather K V", ATTNHOST_RANGE_COMMUNICATION, s);
    host_.all_gather(k, k_all_.get(), local, r.dtype, s);
    host_.all_gather(v, v_all_.get(), local, r.dtype, s);
    host_.range_end(range, s);
  }

#if NAIVE_HAVE_CUDA
  const naive::Geometry& device_g_or_g() const { return problem_.packed() ? device_g_ : g_; }
  naive::Geometry device_g_{};
  attnhost::HostBuffer cu_device_;
#endif

  attnhost::Problem problem_;
  attnhost::Host host_;
  naive::Geometry g_{};
  bool cuda_ = false, fp64_ = false;
  int threads_ = 128;
  attnhost::Layout q_layout_, kv_layout_;
  attnhost::HostBuffer k_all_, v_all_, dk_part_, dv_part_, dk_sum_, dv_sum_;
  attnhost::SpanList spans_;
};

}  // namespace

ATTNHOST_EXPORT_PLUGIN(NaiveAttention)
