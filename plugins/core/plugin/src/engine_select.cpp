// The GPU engine with a choice between the native kernels and cuDNN for the attention calls
// (EngineChoice in engine.h): per call, cached per shape. Everything else goes to the native engine.
// It also serves engine=native, so that every GPU result says which engine ran its calls.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "attncore/cuda.h"
#include "attncore/cudnn.h"
#include "attncore/plugin/engine.h"

namespace attncore::plugin {

namespace {

void push_tensor(std::vector<int64_t>& k, const TensorRef& t) {
  k.insert(k.end(), {t.batch_stride, t.token_stride, t.head_stride, int64_t(reinterpret_cast<uintptr_t>(t.data) % 16),
                     t.data == nullptr});
}

void push_common(std::vector<int64_t>& k, DType dtype, int32_t batch, int32_t hq, int32_t hkv, int32_t d, int64_t sq,
                 int64_t skv, float scale, const Mask& m, int32_t num_segments, const BlockList* blocks,
                 const RowStatsRef& lse) {
  int32_t scale_bits;
  static_assert(sizeof scale_bits == sizeof scale);
  __builtin_memcpy(&scale_bits, &scale, sizeof scale);
  k.insert(k.end(), {int64_t(dtype), batch, hq, hkv, d, sq, skv, scale_bits, m.causal, m.window_left, m.window_right,
                     m.q_pos0 - m.kv_pos0, num_segments, blocks != nullptr, lse.batch_stride, lse.head_stride});
}

// Everything a call's answer depends on, pointers aside.
std::vector<int64_t> shape_key(const ForwardParams& p) {
  std::vector<int64_t> k = {0, p.o_fp32, p.o_prior.data != nullptr};
  push_common(k, p.dtype, p.batch, p.heads_q, p.heads_kv, p.head_dim, p.seqlen_q, p.seqlen_kv, p.softmax_scale, p.mask,
              p.num_segments, p.blocks, p.lse);
  for (const TensorRef* t : {&p.q, &p.k, &p.v, &p.o}) push_tensor(k, *t);
  return k;
}

std::vector<int64_t> shape_key(const BackwardParams& p) {
  std::vector<int64_t> k = {1, p.deterministic, p.write_grads, p.write_dkdv, p.write_dkdv_fp32};
  push_common(k, p.dtype, p.batch, p.heads_q, p.heads_kv, p.head_dim, p.seqlen_q, p.seqlen_kv, p.softmax_scale, p.mask,
              p.num_segments, p.blocks, p.lse);
  for (const TensorRef* t : {&p.q, &p.k, &p.v, &p.o, &p.d_o, &p.dq, &p.dk, &p.dv}) push_tensor(k, *t);
  return k;
}

// Where the dtype-partial scratch will be, while deciding whether cuDNN serves the call: the
// decision reads only alignment and null-ness, and the scratch is allocated only for calls it serves.
char* const kUndecided = reinterpret_cast<char*>(uintptr_t{256});

class SelectingEngine final : public Engine {
 public:
  SelectingEngine(std::unique_ptr<Engine> native, const EngineOptions& options)
      : native_(std::move(native)), choice_(options.choice), dtype_partials_(options.dtype_partials),
        host_(options.host) {
    if (!host_.raw()) attnhost::fail(ATTNHOST_ERR_INTERNAL, "the cuDNN engine needs the host (allocator and log)");
    int device = 0;
    if (cudaGetDevice(&device) == cudaSuccess) cudaDeviceGetAttribute(&sm_major_, cudaDevAttrComputeCapabilityMajor, device);
  }
  ~SelectingEngine() override {
    if (forward_.calls + backward_.calls == 0) return;
    try {
      host_.log(ATTNHOST_LOG_INFO, summary());
    } catch (...) {  // a destructor does not throw
    }
  }

  bool on_device() const override { return true; }
  void forward(const ForwardParams& p, void* s) override {
    ++forward_.calls;
    if (p.o_fp32 && dtype_partials_) {  // cuDNN writes O in dtype into scratch; widened into the partial
      ForwardParams r = in_dtype(p);
      if (use_cudnn(r, forward_)) {
        r.o.data = partials(elements(p.seqlen_q, p.heads_q, p), output_dtype(p.dtype), s);
        forward_cudnn(r, s, workspace(s));
        widen(output_dtype(p.dtype), r.o, p.o, p.batch, p.heads_q, p.head_dim, p.seqlen_q, false, s);
        ++forward_.cudnn;
        return;
      }
    } else if (use_cudnn(p, forward_)) {
      forward_cudnn(p, s, workspace(s));
      ++forward_.cudnn;
      return;
    }
    native_->forward(with_workspace(p, forward_workspace_bytes(p), s), s);
  }
  void backward(const BackwardParams& p, void* s) override {
    ++backward_.calls;
    if (cudnn_serves(p)) {
      BackwardParams r = *cudnn_form(p);
      const DType out = output_dtype(p.dtype);
      const size_t nq = elements(p.seqlen_q, p.heads_q, p), nkv = elements(p.seqlen_kv, p.heads_kv, p);
      if (p.write_dkdv) {  // cuDNN writes dK, dV in place and dQ in dtype into scratch, added into fp32
        r.dq.data = partials(nq, out, s);
        backward_cudnn(r, s, workspace(s));
        widen(out, r.dq, p.dq, p.batch, p.heads_q, p.head_dim, p.seqlen_q, true, s);
      } else if (!p.write_grads && dtype_partials_) {  // every gradient in dtype into scratch, added into fp32
        char* scratch = static_cast<char*>(partials(nq + 2 * nkv, out, s));
        const size_t el = dtype_bytes(out);
        r.dq.data = scratch;
        r.dk.data = scratch + nq * el;
        r.dv.data = scratch + (nq + nkv) * el;
        backward_cudnn(r, s, workspace(s));
        widen(out, r.dq, p.dq, p.batch, p.heads_q, p.head_dim, p.seqlen_q, true, s);
        widen(out, r.dk, p.dk, p.batch, p.heads_kv, p.head_dim, p.seqlen_kv, true, s);
        widen(out, r.dv, p.dv, p.batch, p.heads_kv, p.head_dim, p.seqlen_kv, true, s);
      } else {
        backward_cudnn(p, s, workspace(s));
      }
      ++backward_.cudnn;
      return;
    }
    native_->backward(with_workspace(p, backward_workspace_bytes(p), s), s);
  }
  void widen(const WidenParams& p, void* s) override { native_->widen(p, s); }
  void compute_delta(const DeltaParams& p, void* s) override { native_->compute_delta(p, s); }
  void merge(const MergeParams& p, void* s) override { native_->merge(p, s); }
  void convert(const ConvertParams& p, void* s) override { native_->convert(p, s); }
  void amax(const AmaxParams& p, void* s) override { native_->amax(p, s); }
  // The native kernels add by atomics; cuDNN's gradients are added into fp32 by a pass of their own
  // (dtype partials widened with add; fp32 or FP8 sums read and written).
  bool adds_atomically(const BackwardParams& p) override {
    if (p.write_grads || p.write_dkdv) return false;
    return !cudnn_serves(p) && native_->adds_atomically(p);
  }
  bool adds_dq_atomically(const BackwardParams& p) override {
    return !cudnn_serves(p) && native_->adds_dq_atomically(p);
  }
  // The native kernels merge a prior; a call cuDNN serves is asked as forward() will ask it.
  bool merges_prior(const ForwardParams& p) override {
    if (choice_ == EngineChoice::native) return true;
    return !use_cudnn(p.o_fp32 && dtype_partials_ ? in_dtype(p) : p, forward_);
  }
  void zero(void* dst, size_t bytes, void* s) override { native_->zero(dst, bytes, s); }
  void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows,
                 void* s) override {
    native_->copy_rows(dst, dst_pitch, src, src_pitch, width, rows, s);
  }
  void copy_slices(void* dst, size_t dst_pitch, size_t dst_slice_pitch, const void* src, size_t src_pitch,
                   size_t src_slice_pitch, size_t width, size_t rows, size_t slices, void* s) override {
    native_->copy_slices(dst, dst_pitch, dst_slice_pitch, src, src_pitch, src_slice_pitch, width, rows, slices, s);
  }
  void fill(float* dst, float value, size_t count, void* s) override { native_->fill(dst, value, count, s); }
  void add(float* dst, const float* src, size_t count, void* s) override { native_->add(dst, src, count, s); }
  Event record(void* s) override { return native_->record(s); }
  void wait(void* s, const Event& e) override { native_->wait(s, e); }
  void upload(void* dst, const void* src, size_t bytes) override { native_->upload(dst, src, bytes); }

 private:
  struct Tally {
    long calls = 0, cudnn = 0;
    std::string why_native;  // the first reason a call went native
    std::map<std::vector<int64_t>, bool> decided;
  };

  template <class Params> bool use_cudnn(const Params& p, Tally& t) {
    if (choice_ == EngineChoice::native) return false;
    const std::vector<int64_t> key = shape_key(p);
    if (auto it = t.decided.find(key); it != t.decided.end()) return it->second;
    const std::string why = cudnn_check(p);
    std::string slower = auto_keeps_fp8(p.dtype);
    // (A causal mask whose first row already reaches every key cuts nothing: a full block.)
    const bool causal = p.mask.causal && p.mask.q_pos0 - p.mask.kv_pos0 < p.seqlen_kv - 1;
    if (slower.empty())
      slower = native_measured_faster(&t == &forward_, sm_major_, p.head_dim, p.seqlen_q, p.seqlen_kv,
                                      row_keys(p.mask, p.seqlen_kv), causal);
    const bool use = why.empty() && (choice_ == EngineChoice::cudnn || slower.empty());
    if (!use && t.why_native.empty()) t.why_native = why.empty() ? slower : why;
    t.decided.emplace(key, use);
    return use;
  }

  // "engine: cudnn 9.14.0 for 3 of 4 forward calls and ... (engine=auto); native (wgmma) forward: <why>"
  std::string summary() const {
    using std::to_string;
    const std::string kernels = native_kernels();
    if (choice_ == EngineChoice::native)
      return "engine: native (" + kernels + ") for " + to_string(forward_.calls) + " forward calls and " +
             to_string(backward_.calls) + " backward calls (engine=native)";
    std::string line = "engine: cudnn " + cudnn_version_string() + " for " + to_string(forward_.cudnn) + " of " +
                       to_string(forward_.calls) + " forward calls and " + to_string(backward_.cudnn) + " of " +
                       to_string(backward_.calls) + " backward calls (engine=" + engine_choice_name(choice_) +
                       (dtype_partials_ ? ", partials in dtype" : "") + ")";
    for (const Tally* t : {&forward_, &backward_})
      if (!t->why_native.empty())
        line += "; native (" + kernels + ") " + std::string(t == &forward_ ? "forward" : "backward") + ": " +
                t->why_native;
    return line;
  }

  template <class Params> static size_t elements(int64_t tokens, int32_t heads, const Params& p) {
    return static_cast<size_t>(p.batch) * tokens * heads * p.head_dim;
  }
  // A [batch, tokens, heads, dim] view of contiguous scratch.
  template <class Params> static TensorRef packed(void* base, int64_t tokens, int32_t heads, const Params& p) {
    const int64_t token = static_cast<int64_t>(heads) * p.head_dim;
    return {base, tokens * token, token, p.head_dim};
  }
  void widen(DType dtype, const TensorRef& src, const TensorRef& dst, int32_t batch, int32_t heads, int32_t head_dim,
             int64_t seqlen, bool add, void* s) {
    WidenParams w;
    w.dtype = dtype;
    w.batch = batch;
    w.heads = heads;
    w.head_dim = head_dim;
    w.seqlen = seqlen;
    w.src = src;
    w.dst = dst;
    w.add = add;
    native_->widen(w, s);
  }
  // Forward call `p` as cuDNN is asked to serve a partial in dtype: O in the dtype, into scratch not
  // yet placed.
  static ForwardParams in_dtype(const ForwardParams& p) {
    ForwardParams r = p;
    r.o_fp32 = false;
    r.o = packed(kUndecided, p.seqlen_q, p.heads_q, p);
    return r;
  }
  // Backward call `p` in the form cuDNN is asked to serve it: none for the native kernels' modes
  // alone (dK and dV written in fp32, or with other calls' shares added first); with dK and dV
  // written, dQ in the dtype into scratch not yet placed; as dtype partials, every gradient so;
  // else the call itself. backward() and the queries about it ask alike.
  std::optional<BackwardParams> cudnn_form(const BackwardParams& p) const {
    if (p.write_dkdv_fp32 || p.dk_add.data) return std::nullopt;
    BackwardParams r = p;
    if (p.write_dkdv) {
      r.write_dkdv = false;
      r.write_grads = true;
      r.dq = packed(kUndecided, p.seqlen_q, p.heads_q, p);
    } else if (!p.write_grads && dtype_partials_) {
      const size_t nq = elements(p.seqlen_q, p.heads_q, p), nkv = elements(p.seqlen_kv, p.heads_kv, p);
      const size_t el = dtype_bytes(output_dtype(p.dtype));
      r.write_grads = true;
      r.dq = packed(kUndecided, p.seqlen_q, p.heads_q, p);
      r.dk = packed(kUndecided + nq * el, p.seqlen_kv, p.heads_kv, p);
      r.dv = packed(kUndecided + (nq + nkv) * el, p.seqlen_kv, p.heads_kv, p);
    }
    return r;
  }
  bool cudnn_serves(const BackwardParams& p) {
    const std::optional<BackwardParams> r = cudnn_form(p);
    if (!r && choice_ != EngineChoice::native && backward_.why_native.empty())  // (the summary says why)
      backward_.why_native =
          "cuDNN engine: a call that writes dK and dV in fp32, or adds other calls' shares first, has no cuDNN form";
    return r && use_cudnn(*r, backward_);
  }
  // A stream's scratch: cuDNN's workspace, outputs in dtype, and the native kernels' workspace where
  // the caller gave too little (FP8: V^T, the widened inputs). Each grows to the largest call;
  // freeing an old buffer waits for the device. One set a stream, so that calls on two streams at
  // once (allgather's query ranges side by side) never share one.
  struct Scratch {
    attnhost::Host host;
    attnhost::HostBuffer cudnn, partials, native;
  };
  static void* grown(attnhost::HostBuffer& b, const attnhost::Host& host, size_t bytes) {
    if (bytes > b.bytes()) {
      b.reset();
      b = attnhost::HostBuffer(host, bytes);
    }
    return b.get();
  }
  Scratch& scratch(void* s) {
    auto [it, fresh] = scratch_.try_emplace(s);
    if (fresh) it->second.host = host_;
    return it->second;
  }
  void* partials(size_t count, DType dtype, void* s) {
    Scratch& sc = scratch(s);
    return grown(sc.partials, sc.host, count * dtype_bytes(dtype));
  }
  static void* grow(void* context, size_t bytes) {
    auto* sc = static_cast<Scratch*>(context);
    return grown(sc->cudnn, sc->host, bytes);
  }
  Workspace workspace(void* s) { return {&SelectingEngine::grow, &scratch(s)}; }
  template <class Params> Params with_workspace(const Params& p, size_t need, void* s) {
    if (need == 0 || (p.workspace && p.workspace_bytes >= need)) return p;
    Scratch& sc = scratch(s);
    Params r = p;
    r.workspace = grown(sc.native, sc.host, need);
    r.workspace_bytes = need;
    return r;
  }

  std::unique_ptr<Engine> native_;
  EngineChoice choice_;
  bool dtype_partials_;
  attnhost::Host host_;
  int sm_major_ = 0;
  Tally forward_, backward_;
  std::map<void*, Scratch> scratch_;  // by stream (a map: a Scratch's address is the workspace's context)
};

}  // namespace

std::unique_ptr<Engine> make_selecting_engine(std::unique_ptr<Engine> native, const EngineOptions& options) {
  return std::make_unique<SelectingEngine>(std::move(native), options);
}

}  // namespace attncore::plugin
