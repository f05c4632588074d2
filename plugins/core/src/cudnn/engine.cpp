// The public cuDNN entry points (attncore/cudnn.h): what a call maps to, the per-device handle and
// plan cache, the variant pack, and the work around cuDNN's graphs (statistics layout, gradient adds).
#include <cuda_runtime_api.h>
#include <cudnn_graph.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "attncore/cudnn.h"
#include "backend.h"
#include "kernels.h"
#include "sdpa.h"

namespace attncore {

namespace {

using cudnn::Descriptor;
using cudnn::GraphBuilder;
using cudnn::Layout;
using cudnn::Plan;
using cudnn::SdpaGraph;
using cudnn::SdpaShape;

// The fused engines' dQ accumulator is zeroed by cuDNN itself from 9.6 (the frontend clears it before).
constexpr int kBackwardMinVersion = 90600;
// Before 9.16 the backward graph needs s_kv % 128 == 0 or explicit sequence lengths with a padding
// mask; the frontend adds them (its "workaround padding mask"), and so does this engine.
constexpr int kPaddingFixedVersion = 91600;

// fp32 outputs (O of the forward, dQ/dK/dV of the backward) from bf16/fp16 inputs. On cuDNN 9.14.0
// (H200, 2026-11-22, docs/KERNELS.md, "cuDNN engine") those graphs finalize and run, and the values are not
// the fp32 results: half of each fp32 output stays unwritten, as if it were written in the input
// type (the GQA backward does not even build). So they are served from no version until one is
// measured right; ATTNCORE_CUDNN_FP32_OUTPUTS=force serves them anyway, to measure a new version.
bool fp32_outputs_served() {
  const char* force = std::getenv("ATTNCORE_CUDNN_FP32_OUTPUTS");
  return force && std::string(force) == "force";
}

std::string fp32_outputs_refused(bool backward) {
  if (!backward)
    return "cuDNN engine: O in fp32 (a partial to merge): cuDNN's graph for it finalizes but wrote wrong values on "
           "9.14.0 (measured), so no version serves it; a bf16 O widened would carry its rounding into the merge";
  return "cuDNN engine: fp32 gradients to add (write_grads=false): cuDNN's fp32 dQ/dK/dV graphs wrote wrong values "
         "on 9.14.0 (measured; GQA ones do not build), so no version serves them; cuDNN writes gradients in dtype "
         "(write_grads=true)";
}

constexpr int64_t kMaxLen = (int64_t(1) << 31) - 1;
constexpr size_t kAlign = 256;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::string version_string(int v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

const char* dtype_name(DType t) { return t == DType::bf16 ? "bf16" : t == DType::fp16 ? "fp16" : "fp32"; }

Layout layout(const TensorRef& t) { return {t.batch_stride, t.token_stride, t.head_stride}; }
Layout packed_layout(int64_t tokens, int64_t heads, int64_t d) { return {tokens * heads * d, heads * d, d}; }

bool aligned(const TensorRef& t, bool fp32) {
  const int64_t unit = fp32 ? 4 : 8;  // 16 bytes
  return t.data && reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && t.batch_stride % unit == 0 &&
         t.token_stride % unit == 0 && t.head_stride % unit == 0;
}

bool stats_packed(const RowStatsRef& r, int64_t batch, int64_t heads, int64_t rows) {
  return (heads == 1 || r.head_stride == rows) && (batch == 1 || r.batch_stride == heads * rows);
}

// Checks shared by both directions; fills the shape's sizes, dtype and mask.
std::string common_check(DType dtype, int32_t batch, int32_t hq, int32_t hkv, int32_t d, int64_t sq, int64_t skv,
                         float scale, const Mask& mask, int32_t num_segments, const BlockList* blocks, SdpaShape* s) {
  if (dtype != DType::bf16 && dtype != DType::fp16)
    return std::string("cuDNN engine: dtype ") + dtype_name(dtype) + " (cuDNN's fused attention takes bf16 or fp16)";
  if (d < 8 || d > 256 || d % 8 != 0)
    return "cuDNN engine: head_dim " + std::to_string(d) + " (cuDNN's fused attention takes multiples of 8 up to 256)";
  if (batch < 1 || hq < 1 || hkv < 1 || hq % hkv != 0) return "cuDNN engine: heads_q must be a multiple of heads_kv";
  if (num_segments > 0) return "cuDNN engine: segments (per-segment masks are the native kernels')";
  if (blocks) return "cuDNN engine: block lists (block-sparse visiting is the native kernels')";
  if (sq < 0 || skv < 0 || sq > kMaxLen || skv > kMaxLen) return "cuDNN engine: lengths must be in [0, 2^31)";
  if (sq > 0 && skv == 0) return "cuDNN engine: no keys (rows without a key are the native kernels')";
  if (scale < 0.f) return "cuDNN engine: softmax_scale must be positive (0 means 1/sqrt(head_dim))";
  CudnnMask m;
  if (std::string why = cudnn_mask(mask, sq, skv, &m); !why.empty()) return "cuDNN engine: " + why;
  s->io = dtype == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
  s->b = batch;
  s->hq = hq;
  s->hkv = hkv;
  s->d = d;
  s->sq = sq;
  s->skv = skv;
  s->scale = scale != 0.f ? scale : 1.f / std::sqrt(float(d));
  s->mask = m;
  return {};
}

std::string shape_text(const SdpaShape& s) {
  std::string t = "B=" + std::to_string(s.b) + " Hq=" + std::to_string(s.hq) + " Hkv=" + std::to_string(s.hkv) +
                  " Sq=" + std::to_string(s.sq) + " Skv=" + std::to_string(s.skv) + " D=" + std::to_string(s.d) + " " +
                  (s.io == CUDNN_DATA_BFLOAT16 ? "bf16" : "fp16");
  t += s.mask.causal ? (s.mask.shift ? " causal+" + std::to_string(s.mask.shift) : std::string(" causal")) : " no mask";
  if (!s.backward) t += s.o_fp32 ? " O fp32" : " O io";
  else t += std::string(s.grads_fp32 ? " grads fp32" : " grads io") + (s.padding ? " padding" : "");
  return t;
}

// What a cached shape resolved to: a plan, or why there is none.
struct Entry {
  std::string why;
  Plan plan;
  SdpaGraph roles;
};

class DeviceContext {
 public:
  DeviceContext() { cudnn::check(cudnnCreate(&handle_), "create a handle"); }
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;
  // Never destroyed: contexts live as long as the process, whose CUDA teardown order is not ours.

  const Entry& get(const SdpaShape& s) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto [it, fresh] = cache_.try_emplace(s.key());
    if (fresh) it->second = build(s);
    return *it->second;
  }

  void execute(const Plan& plan, std::vector<int64_t> uids, std::vector<void*> ptrs, void* workspace, void* stream) {
    for (size_t i = 0; i < plan.by_value_uids.size(); ++i) {
      uids.push_back(plan.by_value_uids[i]);
      ptrs.push_back(const_cast<void*>(plan.by_value_ptrs[i]));
    }
    Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack");
    pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data());
    pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(ptrs.size()), ptrs.data());
    pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    pack.finalize();
    std::lock_guard<std::mutex> lock(exec_mutex_);
    cudnn::check(cudnnSetStream(handle_, static_cast<cudaStream_t>(stream)), "set the stream");
    cudnn::check(cudnnBackendExecute(handle_, plan.plan->get(), pack.get()), "execute");
  }

 private:
  std::unique_ptr<Entry> build(const SdpaShape& s) {
    auto e = std::make_unique<Entry>();
    const std::string what = std::string(s.backward ? "backward" : "forward") + " graph (" + shape_text(s) + ")";
    try {
      e->roles = s.backward ? cudnn::backward_graph(s) : cudnn::forward_graph(s);
      e->plan = GraphBuilder::build(e->roles.graph, handle_, what.c_str());
      e->plan.engine = std::string(s.backward ? "composite backward graph, " : "composite forward graph, ") + e->plan.engine;
      return e;
    } catch (const Error& x) {
      e->why = x.what();
    }
    if (!s.backward && !s.mask.causal) {  // the single fused operation also takes an unmasked forward
      SdpaShape fused = s;
      fused.fused_op = true;
      try {
        e->roles = cudnn::forward_graph(fused);
        e->plan = GraphBuilder::build(e->roles.graph, handle_, "SDPA_FWD operation");
        e->plan.engine = "SDPA_FWD operation, " + e->plan.engine;
        e->why.clear();
        return e;
      } catch (const Error& x) {
        e->why += "; and " + std::string(x.what());
      }
    }
    e->why = "cuDNN " + cudnn_version_string() + " cannot build the " + e->why;
    return e;
  }

  cudnnHandle_t handle_ = nullptr;
  std::mutex cache_mutex_, exec_mutex_;
  std::map<std::vector<int64_t>, std::unique_ptr<Entry>> cache_;
};

DeviceContext& context() {
  struct Registry {
    std::mutex mutex;
    std::map<int, DeviceContext*> devices;
  };
  static Registry* registry = new Registry;  // leaked on purpose: see DeviceContext
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
    throw Error(std::string("cuDNN engine: no CUDA device: ") + cudaGetErrorString(e));
  std::lock_guard<std::mutex> lock(registry->mutex);
  DeviceContext*& c = registry->devices[device];
  if (!c) c = new DeviceContext;
  return *c;
}

// A call resolved: its shape, and the cached entry (plan or reason).
struct Resolved {
  std::string why;
  SdpaShape shape;
  const Entry* entry = nullptr;
  bool stats_packed = true;
};

Resolved resolve(const ForwardParams& p) {
  Resolved r;
  SdpaShape& s = r.shape;
  const auto no = [&r](std::string why) {
    r.why = std::move(why);
    return r;
  };
  r.why = common_check(p.dtype, p.batch, p.heads_q, p.heads_kv, p.head_dim, p.seqlen_q, p.seqlen_kv, p.softmax_scale,
                       p.mask, p.num_segments, p.blocks, &s);
  if (!r.why.empty()) return r;
  if (!aligned(p.q, false) || !aligned(p.k, false) || !aligned(p.v, false))
    return no("cuDNN engine: q, k, v must be 16-byte aligned with strides that are multiples of 8 elements");
  if (!aligned(p.o, p.o_fp32))
    return no("cuDNN engine: o must be 16-byte aligned with 16-byte strides");
  if (!p.lse.data) return no("cuDNN engine: lse is null");
  if (p.o_fp32 && !fp32_outputs_served()) return no(fp32_outputs_refused(false));
  s.q = layout(p.q);
  s.k = layout(p.k);
  s.v = layout(p.v);
  s.o = layout(p.o);
  s.o_fp32 = p.o_fp32;
  r.stats_packed = stats_packed(p.lse, p.batch, p.heads_q, p.seqlen_q);
  if (p.seqlen_q == 0) return r;  // nothing to do
  r.entry = &context().get(s);
  r.why = r.entry->why;
  return r;
}

Resolved resolve(const BackwardParams& p) {
  Resolved r;
  SdpaShape& s = r.shape;
  const auto no = [&r](std::string why) {
    r.why = std::move(why);
    return r;
  };
  s.backward = true;
  r.why = common_check(p.dtype, p.batch, p.heads_q, p.heads_kv, p.head_dim, p.seqlen_q, p.seqlen_kv, p.softmax_scale,
                       p.mask, p.num_segments, p.blocks, &s);
  if (!r.why.empty()) return r;
  if (p.deterministic) return no("cuDNN engine: deterministic backward (cuDNN adds dQ with atomics)");
  if (p.write_dkdv) return no("cuDNN engine: write_dkdv (dK, dV in dtype beside an fp32 dQ) is the native kernels' mode");
  if (cudnn_version() < kBackwardMinVersion)
    return no("cuDNN engine: backward needs cuDNN 9.6 or later (loaded: " + cudnn_version_string() + ")");
  if (!p.o.data) return no("cuDNN engine: the final output O is not given (BackwardParams::o)");
  if (!aligned(p.q, false) || !aligned(p.k, false) || !aligned(p.v, false) || !aligned(p.o, false) ||
      !aligned(p.d_o, false))
    return no("cuDNN engine: q, k, v, o, d_o must be 16-byte aligned with strides that are multiples of 8 elements");
  const bool fp32 = !p.write_grads;
  if (fp32 && !fp32_outputs_served())
    return no(fp32_outputs_refused(true));
  if (!aligned(p.dq, fp32) || !aligned(p.dk, fp32) || !aligned(p.dv, fp32))
    return no("cuDNN engine: dq, dk, dv must be 16-byte aligned with 16-byte strides");
  if (!p.lse.data) return no("cuDNN engine: lse is null");
  s.q = layout(p.q);
  s.k = layout(p.k);
  s.v = layout(p.v);
  s.o = layout(p.o);
  s.d_o = layout(p.d_o);
  s.grads_fp32 = fp32;
  if (p.write_grads) {
    s.dq = layout(p.dq);
    s.dk = layout(p.dk);
    s.dv = layout(p.dv);
  } else {  // cuDNN writes into packed fp32 scratch; the accumulators' layout does not matter
    s.dq = packed_layout(p.seqlen_q, p.heads_q, p.head_dim);
    s.dk = s.dv = packed_layout(p.seqlen_kv, p.heads_kv, p.head_dim);
  }
  s.padding = cudnn_version() < kPaddingFixedVersion && p.seqlen_kv % 128 != 0;
  r.stats_packed = stats_packed(p.lse, p.batch, p.heads_q, p.seqlen_q);
  if (p.seqlen_q == 0) return r;
  r.entry = &context().get(s);
  r.why = r.entry->why;
  return r;
}

// Carves one workspace allocation into aligned pieces.
class Carver {
 public:
  size_t take(size_t bytes) {
    const size_t at = total_;
    total_ += align_up(bytes);
    return at;
  }
  size_t total() const { return total_; }

 private:
  size_t total_ = 0;
};

char* get_workspace(const Workspace& ws, size_t bytes) {
  if (bytes == 0) return nullptr;
  if (!ws.get) throw Error("cuDNN engine: the call needs " + std::to_string(bytes) + " bytes of workspace and no allocator was given");
  char* p = static_cast<char*>(ws.get(ws.context, bytes));
  if (!p) throw Error("cuDNN engine: the workspace allocator returned null for " + std::to_string(bytes) + " bytes");
  return p;
}

} // namespace

int cudnn_version() { return int(cudnnGetVersion()); }

std::string cudnn_version_string() { return version_string(cudnn_version()); }

std::string cudnn_check(const ForwardParams& p) {
  try {
    return resolve(p).why;
  } catch (const Error& e) {
    return e.what();
  }
}

std::string cudnn_check(const BackwardParams& p) {
  try {
    return resolve(p).why;
  } catch (const Error& e) {
    return e.what();
  }
}

std::string cudnn_plan_info(const ForwardParams& p) {
  const Resolved r = resolve(p);
  if (!r.why.empty() || !r.entry) return r.why;
  return r.entry->plan.engine + ", workspace " + std::to_string(r.entry->plan.workspace) + " bytes";
}

std::string cudnn_plan_info(const BackwardParams& p) {
  const Resolved r = resolve(p);
  if (!r.why.empty() || !r.entry) return r.why;
  return r.entry->plan.engine + ", workspace " + std::to_string(r.entry->plan.workspace) + " bytes";
}

void forward_cudnn(const ForwardParams& p, void* stream, const Workspace& ws) {
  const Resolved r = resolve(p);
  if (!r.why.empty()) throw Error(r.why);
  if (p.seqlen_q == 0) return;
  const SdpaShape& s = r.shape;
  const SdpaGraph& g = r.entry->roles;
  Carver carve;
  const size_t engine_at = carve.take(size_t(r.entry->plan.workspace));
  const size_t stats_bytes = size_t(s.b * s.hq * s.sq) * 4;
  const size_t stats_at = r.stats_packed ? 0 : carve.take(stats_bytes);
  char* base = get_workspace(ws, carve.total());
  float* stats = r.stats_packed ? p.lse.data : reinterpret_cast<float*>(base + stats_at);
  context().execute(r.entry->plan, {g.q, g.k, g.v, g.o, g.stats}, {p.q.data, p.k.data, p.v.data, p.o.data, stats},
                    base ? base + engine_at : nullptr, stream);
  if (!r.stats_packed)
    cudnn::copy_stats(p.lse.data, p.lse.batch_stride, p.lse.head_stride, stats, s.hq * s.sq, s.sq, s.b, s.hq, s.sq,
                      stream);
}

void backward_cudnn(const BackwardParams& p, void* stream, const Workspace& ws) {
  const Resolved r = resolve(p);
  if (!r.why.empty()) throw Error(r.why);
  if (p.seqlen_q == 0) return;
  const SdpaShape& s = r.shape;
  const SdpaGraph& g = r.entry->roles;
  const size_t rows = size_t(s.b * s.hq * s.sq), q_elems = rows * size_t(s.d);
  const size_t kv_elems = size_t(s.b * s.hkv * s.skv * s.d);
  Carver carve;
  const size_t engine_at = carve.take(size_t(r.entry->plan.workspace));
  const size_t sum_at = carve.take(rows * 4), accum_at = carve.take(q_elems * 4);
  const size_t stats_at = r.stats_packed ? 0 : carve.take(rows * 4);
  const size_t seq_at = s.padding ? carve.take(size_t(s.b) * 8) : 0;
  const bool scratch = !p.write_grads;
  const size_t dq_at = scratch ? carve.take(q_elems * 4) : 0;
  const size_t dk_at = scratch ? carve.take(kv_elems * 4) : 0, dv_at = scratch ? carve.take(kv_elems * 4) : 0;
  char* base = get_workspace(ws, carve.total());

  float* stats = p.lse.data;
  if (!r.stats_packed) {
    stats = reinterpret_cast<float*>(base + stats_at);
    cudnn::copy_stats(stats, s.hq * s.sq, s.sq, p.lse.data, p.lse.batch_stride, p.lse.head_stride, s.b, s.hq, s.sq,
                      stream);
  }
  void* dq = scratch ? base + dq_at : p.dq.data;
  void* dk = scratch ? base + dk_at : p.dk.data;
  void* dv = scratch ? base + dv_at : p.dv.data;
  std::vector<int64_t> uids = {g.q, g.k, g.v, g.o, g.d_o, g.stats, g.dq, g.dk, g.dv, g.softmax_sum, g.dq_accum};
  std::vector<void*> ptrs = {p.q.data, p.k.data, p.v.data, p.o.data, p.d_o.data, stats, dq, dk, dv,
                             base + sum_at, base + accum_at};
  if (s.padding) {
    int32_t* seq = reinterpret_cast<int32_t*>(base + seq_at);
    cudnn::fill_i32(seq, int32_t(s.sq), s.b, stream);
    cudnn::fill_i32(seq + s.b, int32_t(s.skv), s.b, stream);
    uids.insert(uids.end(), {g.seq_q, g.seq_kv});
    ptrs.insert(ptrs.end(), {seq, seq + s.b});
  }
  context().execute(r.entry->plan, uids, ptrs, base + engine_at, stream);
  if (scratch) {
    const Layout q = cudnn::Layout{s.dq}, kv = cudnn::Layout{s.dk};
    cudnn::add_fp32(static_cast<float*>(p.dq.data), p.dq.batch_stride, p.dq.token_stride, p.dq.head_stride,
                    static_cast<const float*>(dq), q.batch, q.token, q.head, s.b, s.sq, s.hq, s.d, stream);
    cudnn::add_fp32(static_cast<float*>(p.dk.data), p.dk.batch_stride, p.dk.token_stride, p.dk.head_stride,
                    static_cast<const float*>(dk), kv.batch, kv.token, kv.head, s.b, s.skv, s.hkv, s.d, stream);
    cudnn::add_fp32(static_cast<float*>(p.dv.data), p.dv.batch_stride, p.dv.token_stride, p.dv.head_stride,
                    static_cast<const float*>(dv), kv.batch, kv.token, kv.head, s.b, s.skv, s.hkv, s.d, stream);
  }
}

} // namespace attncore
