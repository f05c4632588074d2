// The public cuDNN entry points (attncore/cudnn.h): what a call maps to, the per-device handle and
// plan cache, the variant pack, and the work around cuDNN's graphs (statistics layout, gradient adds,
// the FP8 graphs' factors and conversions).
#include <cuda_runtime_api.h>
#include <cudnn_graph.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
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

// FP8: cudnn-frontend serves its FP8 attention from 9.1 on, and not on 9.10.0 (a known bug there),
// on Hopper and newer devices. Its FP8 backward on Hopper takes head_dim 128 only.
constexpr int kFp8MinVersion = 90100;
constexpr int kFp8BrokenVersion = 91000;
constexpr int kFp8MinMajor = 9;
constexpr int kFp8HopperBackwardDim = 128;

// The FP8 backward's factors for dS and the gradients are the engine's guesses (fp8_backward_factors):
// served only with ATTNCORE_CUDNN_FP8_BACKWARD=force, to time cuDNN's FP8 backward.
bool fp8_backward_served() {
  const char* force = std::getenv("ATTNCORE_CUDNN_FP8_BACKWARD");
  return force && std::string(force) == "force";
}

constexpr int64_t kMaxLen = (int64_t(1) << 31) - 1;
constexpr size_t kAlign = 256;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::string version_string(int v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

const char* dtype_name(DType t) {
  switch (t) {
  case DType::bf16: return "bf16";
  case DType::fp16: return "fp16";
  case DType::fp8_e4m3: return "fp8_e4m3";
  case DType::fp8_e5m2: return "fp8_e5m2";
  case DType::fp64: return "fp64";
  default: return "fp32";
  }
}

Layout layout(const TensorRef& t) { return {t.batch_stride, t.token_stride, t.head_stride}; }
Layout packed_layout(int64_t tokens, int64_t heads, int64_t d) { return {tokens * heads * d, heads * d, d}; }

// 16-byte aligned with 16-byte strides, for elements of `bytes` bytes.
bool aligned(const TensorRef& t, int bytes) {
  const int64_t unit = 16 / bytes;
  return t.data && reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && t.batch_stride % unit == 0 &&
         t.token_stride % unit == 0 && t.head_stride % unit == 0;
}

bool stats_packed(const RowStatsRef& r, int64_t batch, int64_t heads, int64_t rows) {
  return (heads == 1 || r.head_stride == rows) && (batch == 1 || r.batch_stride == heads * rows);
}

// Checks shared by both directions; fills the shape's sizes, dtype and mask.
std::string common_check(DType dtype, int32_t batch, int32_t hq, int32_t hkv, int32_t d, int64_t sq, int64_t skv,
                         float scale, const Mask& mask, int32_t num_segments, const BlockList* blocks, SdpaShape* s) {
  if (dtype == DType::fp8_e5m2)
    return "cuDNN engine: dtype fp8_e5m2 (this engine builds cuDNN's FP8 graphs for fp8_e4m3 only)";
  if (dtype != DType::bf16 && dtype != DType::fp16 && dtype != DType::fp8_e4m3)
    return std::string("cuDNN engine: dtype ") + dtype_name(dtype) +
           " (cuDNN's fused attention takes bf16, fp16 or fp8_e4m3)";
  if (is_fp8(dtype) && (d < 16 || d > 256 || d % 16 != 0))
    return "cuDNN engine: head_dim " + std::to_string(d) +
           " with FP8 (cuDNN's FP8 attention takes multiples of 16 up to 256)";
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
  s->io = dtype == DType::bf16 ? CUDNN_DATA_BFLOAT16 : dtype == DType::fp16 ? CUDNN_DATA_HALF : CUDNN_DATA_FP8_E4M3;
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

// The current device's compute capability major, 0 when there is none.
int device_major() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
    return 0;
  return major;
}

// What the FP8 graphs need beyond the shape: the cuDNN versions that serve them, a Hopper or newer
// device, and descales that are positive and finite.
std::string fp8_check(std::initializer_list<float> descales) {
  const int v = cudnn_version();
  if (v < kFp8MinVersion || v == kFp8BrokenVersion)
    return "cuDNN engine: FP8 attention needs cuDNN 9.1 or later, not 9.10.0 (loaded: " + cudnn_version_string() + ")";
  if (const int major = device_major(); major < kFp8MinMajor)
    return major == 0 ? "cuDNN engine: FP8 attention: no CUDA device"
                      : "cuDNN engine: FP8 attention needs a Hopper or newer GPU (this one is sm_" +
                            std::to_string(major) + "x)";
  for (float d : descales)
    if (!(d > 0.f) || !std::isfinite(d)) return "cuDNN engine: FP8 descales must be positive and finite";
  return {};
}

std::string shape_text(const SdpaShape& s) {
  std::string t = "B=" + std::to_string(s.b) + " Hq=" + std::to_string(s.hq) + " Hkv=" + std::to_string(s.hkv) +
                  " Sq=" + std::to_string(s.sq) + " Skv=" + std::to_string(s.skv) + " D=" + std::to_string(s.d) + " " +
                  (s.io == CUDNN_DATA_BFLOAT16 ? "bf16" : s.io == CUDNN_DATA_HALF ? "fp16" : "fp8_e4m3");
  t += s.mask.causal ? (s.mask.shift ? " causal+" + std::to_string(s.mask.shift) : std::string(" causal")) : " no mask";
  if (s.fp8()) return t + (s.backward ? " grads fp8" : " O fp8");
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
      if (s.fp8()) e->roles = s.backward ? cudnn::fp8_backward_graph(s) : cudnn::fp8_forward_graph(s);
      else e->roles = s.backward ? cudnn::backward_graph(s) : cudnn::forward_graph(s);
      e->plan = GraphBuilder::build(e->roles.graph, handle_, what.c_str());
      e->plan.engine = std::string(s.fp8() ? "FP8 " : "") +
                       (s.backward ? "composite backward graph, " : "composite forward graph, ") + e->plan.engine;
      return e;
    } catch (const Error& x) {
      e->why = x.what();
    }
    if (!s.backward && !s.mask.causal && !s.fp8()) {  // the single fused operation also takes an unmasked forward
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
  if (p.o_prior.data) return no("cuDNN engine: a prior partial merged into O (o_prior) is the native kernels' mode");
  const bool fp8 = is_fp8(p.dtype);
  if (fp8) {
    r.why = fp8_check({p.descale_q, p.descale_k, p.descale_v});
    if (!r.why.empty()) return r;
    if (p.o_fp32)
      return no("cuDNN engine: FP8 with O in fp32 (a partial to merge): cuDNN's Hopper engines write O in FP8, whose "
                "rounding a merge would carry");
  }
  const int in_bytes = dtype_bytes(p.dtype);
  if (!aligned(p.q, in_bytes) || !aligned(p.k, in_bytes) || !aligned(p.v, in_bytes))
    return no("cuDNN engine: q, k, v must be 16-byte aligned with 16-byte strides");
  if (!aligned(p.o, p.o_fp32 ? 4 : dtype_bytes(output_dtype(p.dtype))))
    return no("cuDNN engine: o must be 16-byte aligned with 16-byte strides");
  if (!p.lse.data) return no("cuDNN engine: lse is null");
  if (p.o_fp32 && !fp32_outputs_served()) return no(fp32_outputs_refused(false));
  s.q = layout(p.q);
  s.k = layout(p.k);
  s.v = layout(p.v);
  s.o = fp8 ? packed_layout(p.seqlen_q, p.heads_q, p.head_dim) : layout(p.o);  // FP8: O lands in scratch
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
  if (p.dk_add.data) return no("cuDNN engine: dk_add (other calls' shares added before dK and dV are written) is the native kernels' mode");
  if (p.dq_out.data) return no("cuDNN engine: dq_out (dQ rounded beside its fp32 accumulator) is the native kernels' mode");
  if (cudnn_version() < kBackwardMinVersion)
    return no("cuDNN engine: backward needs cuDNN 9.6 or later (loaded: " + cudnn_version_string() + ")");
  if (!p.o.data) return no("cuDNN engine: the final output O is not given (BackwardParams::o)");
  if (do_dtype(p) != p.dtype) return no("cuDNN engine: dO in another type than Q, K and V (the hybrid FP8 recipe)");
  const bool fp8 = is_fp8(p.dtype);
  if (fp8) {
    r.why = fp8_check({p.descale_q, p.descale_k, p.descale_v, p.descale_do});
    if (!r.why.empty()) return r;
    if (device_major() == kFp8MinMajor && p.head_dim != kFp8HopperBackwardDim)
      return no("cuDNN engine: FP8 backward with head_dim " + std::to_string(p.head_dim) +
                " (cuDNN's Hopper FP8 backward takes 128 only)");
    if (!fp8_backward_served())
      return no("cuDNN engine: FP8 backward: cuDNN writes FP8 gradients whose scales this engine can only guess "
                "(no amax history in the call); ATTNCORE_CUDNN_FP8_BACKWARD=force serves it for timing");
  }
  const int in_bytes = dtype_bytes(p.dtype);
  if (!aligned(p.q, in_bytes) || !aligned(p.k, in_bytes) || !aligned(p.v, in_bytes) || !aligned(p.d_o, in_bytes) ||
      !aligned(p.o, dtype_bytes(output_dtype(p.dtype))))
    return no("cuDNN engine: q, k, v, o, d_o must be 16-byte aligned with 16-byte strides");
  const bool fp32 = !p.write_grads;
  if (fp32 && !fp8 && !fp32_outputs_served())  // FP8 gradients are added by this engine's kernel
    return no(fp32_outputs_refused(true));
  const int grad_bytes = fp32 ? 4 : dtype_bytes(output_dtype(p.dtype));
  if (!aligned(p.dq, grad_bytes) || !aligned(p.dk, grad_bytes) || !aligned(p.dv, grad_bytes))
    return no("cuDNN engine: dq, dk, dv must be 16-byte aligned with 16-byte strides");
  if (!p.lse.data) return no("cuDNN engine: lse is null");
  s.q = layout(p.q);
  s.k = layout(p.k);
  s.v = layout(p.v);
  s.o = layout(p.o);
  s.d_o = layout(p.d_o);
  s.grads_fp32 = fp32 && !fp8;
  if (fp8) {  // O read and dQ, dK, dV written in FP8, in scratch: one plan for both gradient modes
    s.o = packed_layout(p.seqlen_q, p.heads_q, p.head_dim);
    s.dq = packed_layout(p.seqlen_q, p.heads_q, p.head_dim);
    s.dk = s.dv = packed_layout(p.seqlen_kv, p.heads_kv, p.head_dim);
  } else if (p.write_grads) {
    s.dq = layout(p.dq);
    s.dk = layout(p.dk);
    s.dv = layout(p.dv);
  } else {  // cuDNN writes into packed fp32 scratch; the accumulators' layout does not matter
    s.dq = packed_layout(p.seqlen_q, p.heads_q, p.head_dim);
    s.dk = s.dv = packed_layout(p.seqlen_kv, p.heads_kv, p.head_dim);
  }
  // The frontend adds the padding workaround to its bf16/fp16 backward only.
  s.padding = !fp8 && cudnn_version() < kPaddingFixedVersion && p.seqlen_kv % 128 != 0;
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

// The LSE rows a backward graph reads, packed: the call's own where they are, else copied into
// `scratch`.
float* packed_stats(const Resolved& r, const RowStatsRef& lse, char* scratch, void* stream) {
  if (r.stats_packed) return lse.data;
  const SdpaShape& s = r.shape;
  float* stats = reinterpret_cast<float*>(scratch);
  cudnn::copy_stats(stats, s.hq * s.sq, s.sq, lse.data, lse.batch_stride, lse.head_stride, s.b, s.hq, s.sq, stream);
  return stats;
}

char* get_workspace(const Workspace& ws, size_t bytes) {
  if (bytes == 0) return nullptr;
  if (!ws.get) throw Error("cuDNN engine: the call needs " + std::to_string(bytes) + " bytes of workspace and no allocator was given");
  char* p = static_cast<char*>(ws.get(ws.context, bytes));
  if (!p) throw Error("cuDNN engine: the workspace allocator returned null for " + std::to_string(bytes) + " bytes");
  return p;
}

// ---- FP8: the factors the graphs read, and the conversions around them ----

using cudnn::Convert;
using Fp8Factors = std::array<float, cudnn::kFp8Slots>;
static_assert(cudnn::kFp8Slots <= cudnn::kMaxFactors);

constexpr float kE4m3Max = 448.f;  // e4m3's largest finite value

// P is at most 1: times 448 it fills e4m3 without saturating. O is a convex combination of V's rows,
// |O| <= 448 descale_v: stored as O / (2 descale_v) it stays inside e4m3 with a binade to spare for
// P's rounding (a row's rounded P may sum past 1). Amax slots stay 0: the graphs write them.
float o_descale(float descale_v) { return 2.f * descale_v; }

Fp8Factors fp8_forward_factors(float descale_q, float descale_k, float descale_v) {
  Fp8Factors f{};
  f[cudnn::kDescaleQ] = descale_q;
  f[cudnn::kDescaleK] = descale_k;
  f[cudnn::kDescaleV] = descale_v;
  f[cudnn::kScaleS] = kE4m3Max;
  f[cudnn::kDescaleS] = 1.f / kE4m3Max;
  f[cudnn::kScaleO] = 1.f / o_descale(descale_v);
  return f;
}

// The largest power of two that maps `amax` to at most 448 (1 for a degenerate estimate).
float fp8_scale_for(double amax) {
  if (!(amax > 0) || !std::isfinite(amax)) return 1.f;
  return float(std::exp2(std::floor(std::log2(kE4m3Max / amax))));
}

// dS and the gradients have no bound the call could know: per-tensor FP8 training scales them by
// the amax of earlier steps, which the core's parameters do not carry. These are guesses for inputs
// that use their format's range (amax a = 448 descale, RMS about a / 4): dS of a row that attends
// one key, |P (dP - delta) scale| ~ scale sqrt(D) RMS(dO) RMS(V), and the gradients that row makes
// (dS K, dS Q, dO), each with a factor 4 spare. Rows that spread their attention over many keys
// give smaller dS, which FP8 then keeps with less precision or flushes.
Fp8Factors fp8_backward_factors(const BackwardParams& p, float softmax_scale) {
  Fp8Factors f = fp8_forward_factors(p.descale_q, p.descale_k, p.descale_v);
  f[cudnn::kDescaleO] = o_descale(p.descale_v);
  f[cudnn::kDescaleDO] = p.descale_do;
  const auto amax = [](float descale) { return double(kE4m3Max) * descale; };
  const double ds = softmax_scale * std::sqrt(double(p.head_dim)) * amax(p.descale_do) / 4 * amax(p.descale_v) / 4;
  f[cudnn::kScaleDP] = fp8_scale_for(4 * ds);
  f[cudnn::kDescaleDP] = 1.f / f[cudnn::kScaleDP];
  f[cudnn::kScaleDQ] = fp8_scale_for(4 * ds * amax(p.descale_k));
  f[cudnn::kScaleDK] = fp8_scale_for(4 * ds * amax(p.descale_q));
  f[cudnn::kScaleDV] = fp8_scale_for(4 * amax(p.descale_do));
  return f;
}

// The factors into their 16-byte slots (on the stream), and the slots the graph binds.
void bind_fp8(const SdpaGraph& g, const Fp8Factors& f, char* slots, std::vector<int64_t>* uids,
              std::vector<void*>* ptrs, void* stream) {
  cudnn::fill_f32(reinterpret_cast<float*>(slots), cudnn::kFp8SlotBytes / 4, f.data(), cudnn::kFp8Slots, stream);
  for (int i = 0; i < cudnn::kFp8Slots; ++i)
    if (g.fp8[i]) {
      uids->push_back(g.fp8[i]);
      ptrs->push_back(slots + i * cudnn::kFp8SlotBytes);
    }
}

// cuDNN writes O in FP8 into scratch; one kernel turns it into the caller's bf16 O.
void forward_fp8(const ForwardParams& p, const Resolved& r, void* stream, const Workspace& ws) {
  const SdpaShape& s = r.shape;
  const SdpaGraph& g = r.entry->roles;
  Carver carve;
  const size_t engine_at = carve.take(size_t(r.entry->plan.workspace));
  const size_t stats_at = r.stats_packed ? 0 : carve.take(size_t(s.b * s.hq * s.sq) * 4);
  const size_t slots_at = carve.take(cudnn::kFp8Slots * cudnn::kFp8SlotBytes);
  const size_t o_at = carve.take(size_t(s.b * s.sq * s.hq * s.d));
  char* base = get_workspace(ws, carve.total());
  float* stats = r.stats_packed ? p.lse.data : reinterpret_cast<float*>(base + stats_at);
  std::vector<int64_t> uids = {g.q, g.k, g.v, g.o, g.stats};
  std::vector<void*> ptrs = {p.q.data, p.k.data, p.v.data, base + o_at, stats};
  bind_fp8(g, fp8_forward_factors(p.descale_q, p.descale_k, p.descale_v), base + slots_at, &uids, &ptrs, stream);
  context().execute(r.entry->plan, uids, ptrs, base + engine_at, stream);
  cudnn::convert(Convert::e4m3_to_bf16, p.o.data, p.o.batch_stride, p.o.token_stride, p.o.head_stride, base + o_at,
                 s.o.batch, s.o.token, s.o.head, o_descale(p.descale_v), s.b, s.sq, s.hq, s.d, stream);
  if (!r.stats_packed)
    cudnn::copy_stats(p.lse.data, p.lse.batch_stride, p.lse.head_stride, stats, s.hq * s.sq, s.sq, s.b, s.hq, s.sq,
                      stream);
}

// The caller's bf16 O goes to FP8 in scratch for cuDNN to read; cuDNN writes dQ, dK, dV in FP8 into
// scratch; kernels write them in bf16 (write_grads) or add them into the fp32 accumulators.
void backward_fp8(const BackwardParams& p, const Resolved& r, void* stream, const Workspace& ws) {
  const SdpaShape& s = r.shape;
  const SdpaGraph& g = r.entry->roles;
  const size_t rows = size_t(s.b * s.hq * s.sq), q_elems = rows * size_t(s.d);
  const size_t kv_elems = size_t(s.b * s.hkv * s.skv * s.d);
  Carver carve;
  const size_t engine_at = carve.take(size_t(r.entry->plan.workspace));
  const size_t stats_at = r.stats_packed ? 0 : carve.take(rows * 4);
  const size_t slots_at = carve.take(cudnn::kFp8Slots * cudnn::kFp8SlotBytes);
  const size_t o_at = carve.take(q_elems), dq_at = carve.take(q_elems);
  const size_t dk_at = carve.take(kv_elems), dv_at = carve.take(kv_elems);
  char* base = get_workspace(ws, carve.total());

  float* stats = packed_stats(r, p.lse, base + stats_at, stream);
  const Fp8Factors f = fp8_backward_factors(p, s.scale);
  cudnn::convert(Convert::bf16_to_e4m3, base + o_at, s.o.batch, s.o.token, s.o.head, p.o.data, p.o.batch_stride,
                 p.o.token_stride, p.o.head_stride, 1.f / f[cudnn::kDescaleO], s.b, s.sq, s.hq, s.d, stream);
  std::vector<int64_t> uids = {g.q, g.k, g.v, g.o, g.d_o, g.stats, g.dq, g.dk, g.dv};
  std::vector<void*> ptrs = {p.q.data, p.k.data, p.v.data, base + o_at, p.d_o.data, stats,
                             base + dq_at, base + dk_at, base + dv_at};
  bind_fp8(g, f, base + slots_at, &uids, &ptrs, stream);
  context().execute(r.entry->plan, uids, ptrs, base + engine_at, stream);
  const Convert op = p.write_grads ? Convert::e4m3_to_bf16 : Convert::e4m3_add_fp32;
  const auto out = [&](const TensorRef& dst, size_t at, const Layout& l, cudnn::Fp8Slot scale, int64_t tokens,
                       int64_t heads) {
    cudnn::convert(op, dst.data, dst.batch_stride, dst.token_stride, dst.head_stride, base + at, l.batch, l.token,
                   l.head, 1.f / f[scale], s.b, tokens, heads, s.d, stream);
  };
  out(p.dq, dq_at, s.dq, cudnn::kScaleDQ, s.sq, s.hq);
  out(p.dk, dk_at, s.dk, cudnn::kScaleDK, s.skv, s.hkv);
  out(p.dv, dv_at, s.dv, cudnn::kScaleDV, s.skv, s.hkv);
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
  if (r.shape.fp8()) return forward_fp8(p, r, stream, ws);
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
  if (r.shape.fp8()) return backward_fp8(p, r, stream, ws);
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

  float* stats = packed_stats(r, p.lse, base + stats_at, stream);
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
