// Timing driver of the core's engines (not a test; the project's benchmark is the host). Prints one
// line per (engine, shape, causal): median forward and backward times over CUDA events and TFLOP/s
// by the FlashAttention convention (forward 4 D per attended pair, backward 2.5x). Random inputs.
//   bench_core                      the reference shape B=4 H=32 S=16384 D=128, causal and not
//   bench_core B H S D [...]        other shapes (groups of four); H may be Hq:Hkv (GQA), S may be
//                                   Sq:Skv (a ring step's rectangle; causal: the rows are the last Sq
//                                   of the Skv positions)
//   BENCH_CAUSAL=0 bench_core       only the non-causal (or =1: causal) runs
//   BENCH_ENGINE=cudnn|both         the cuDNN engine (attncore/cudnn.h) instead of / besides native
//   BENCH_DTYPE=fp8_e4m3            Q, K, V, dO in that dtype (bf16 by default; fp16, fp8_e4m3,
//                                   fp8_e5m2): FP8 holds the generator's values times 2^7 (|x| <= 448,
//                                   rounded to nearest), descales 2^-7; O and written gradients in
//                                   output_dtype (bf16). The same FP8 calls go to both engines (the
//                                   native calls' workspaces, V^T and the backward's widened inputs,
//                                   allocated once); an engine that refuses one says so: "FAILED" and
//                                   why (native), "n/a" and why (cuDNN)
//   BENCH_BACKWARD=0                native forward only (a forward-kernel step times in seconds)
//   BENCH_RUNS=N                    timed runs per figure (default 10 from S = 8192, else 20)
//   BENCH_DELTA=1                   native: also time the delta pass alone, dQ's memset, both, and
//                                   the delta pass that clears dQ (DeltaParams::zero)
//   BENCH_SEGMENTS=L                native: each sequence as segments of L rows (a device list, as
//                                   varlen and dilated call the core), not L-row batches
//   BENCH_DQ_PASS=1                 native: also "bwd write" with dQ rounded by the pass after the call
//   bench_core --probe [B H S D...] which cuDNN graphs build for each shape (no timing)
// Native backward = zeroing the fp32 accumulators (dQ's in the delta pass) + compute_delta + backward: the
// core's contract (gradients added into fp32), what a ring step costs. "bwd write" is what frameworks do and
// what PyTorch's line times: dQ's accumulator cleared in the delta pass, dK and dV written in bf16
// (write_dkdv), dQ rounded to bf16 by the call (dq_out: in the kernel where it can, else a pass after).
// cuDNN: "bwd write" writes bf16 gradients (what frameworks do); "bwd add" is the core's contract (zeroing the fp32
// accumulators + cuDNN into scratch + the add kernels), what a ring step costs. FP8 on cuDNN: the forward
// includes the kernel that turns cuDNN's FP8 O into bf16; the backward (the bf16 O to FP8 first, the
// FP8 gradients written or added after) is served only with ATTNCORE_CUDNN_FP8_BACKWARD=force, for
// timing: its gradient scales are the engine's guesses.
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "attncore/cuda.h"
#include "attncore/cudnn.h"
#include "attncore/numeric.h"

namespace {

#define CUDA_CHECK(expr)                                                                            \
  do {                                                                                              \
    const cudaError_t e_ = (expr);                                                                  \
    if (e_ != cudaSuccess) {                                                                        \
      std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(e_));                              \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

// FP8 inputs: the generator's values (|x| < 3.4) times 2^7 fill e4m3 (|x| <= 448) without saturating.
constexpr float kFp8Scale = 128.f;

attncore::DType bench_dtype() {
  using attncore::DType;
  const char* e = std::getenv("BENCH_DTYPE");
  const std::string t = e ? e : "bf16";
  if (t == "bf16") return DType::bf16;
  if (t == "fp16") return DType::fp16;
  if (t == "fp8_e4m3") return DType::fp8_e4m3;
  if (t == "fp8_e5m2") return DType::fp8_e5m2;
  std::fprintf(stderr, "BENCH_DTYPE=%s: bf16, fp16, fp8_e4m3 or fp8_e5m2\n", t.c_str());
  std::exit(2);
}

const char* dtype_text(attncore::DType t) {
  using attncore::DType;
  return t == DType::bf16 ? "bf16" : t == DType::fp16 ? "fp16" : t == DType::fp8_e4m3 ? "fp8_e4m3" : "fp8_e5m2";
}

// Random N(0,1)-ish values (sum of uniforms) in `dtype` (FP8: times kFp8Scale), filled by all cores,
// then uploaded.
void* random_inputs(size_t n, uint64_t seed, attncore::DType dtype) {
  const size_t elem = size_t(attncore::dtype_bytes(dtype));
  std::vector<uint8_t> h(n * elem);
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      uint64_t x = seed * 0x9e3779b97f4a7c15ull + t + 1;
      for (size_t i = t; i < n; i += threads) {
        float s = 0;
        for (int k = 0; k < 4; ++k) {
          x ^= x << 13, x ^= x >> 7, x ^= x << 17;
          s += float(x >> 40) / float(1ull << 24);
        }
        const float v = (s - 2.f) * 1.7f;
        switch (dtype) {
        case attncore::DType::fp8_e4m3: h[i] = __nv_cvt_float_to_fp8(v * kFp8Scale, __NV_SATFINITE, __NV_E4M3); break;
        case attncore::DType::fp8_e5m2: h[i] = __nv_cvt_float_to_fp8(v * kFp8Scale, __NV_SATFINITE, __NV_E5M2); break;
        default: {
          const uint16_t b = dtype == attncore::DType::fp16 ? attncore::float_to_fp16(v) : attncore::float_to_bf16(v);
          std::memcpy(&h[i * 2], &b, 2);
        }
        }
      }
    });
  for (auto& th : pool) th.join();
  void* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, h.size()));
  CUDA_CHECK(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice));
  return d;
}

int timed_runs(int64_t S) {
  if (const char* r = std::getenv("BENCH_RUNS"); r && std::atoi(r) > 0) return std::atoi(r);
  return S >= 8192 ? 10 : 20;
}

template <class F> float median_ms(F&& f, int warmup, int runs) {
  for (int i = 0; i < warmup; ++i) f();
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < runs; ++i) {
    CUDA_CHECK(cudaEventRecord(a));
    f();
    CUDA_CHECK(cudaEventRecord(b));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The cuDNN engine's scratch: one buffer that grows (outside the timed runs: warm-ups first).
struct Scratch {
  void* ptr = nullptr;
  size_t bytes = 0;
  static void* get(void* c, size_t n) {
    auto* s = static_cast<Scratch*>(c);
    if (n > s->bytes) {
      CUDA_CHECK(cudaDeviceSynchronize());
      CUDA_CHECK(cudaFree(s->ptr));
      CUDA_CHECK(cudaMalloc(&s->ptr, n));
      s->bytes = n;
    }
    return s->ptr;
  }
};

struct Shape {
  int B, Hq, Hkv, S, D;
  int Skv = 0;  // keys: S unless given
};

// One problem's buffers and parameter structs ([B, S, H, D] in the dtype, O in its output dtype,
// fp32 accumulators).
struct Bench {
  Shape s;
  bool causal;
  attncore::DType dtype;
  size_t nq, nkv;
  void *q, *k, *v, *d_o, *o, *o32, *dq, *dk, *dv;
  void* fwd_ws = nullptr;  // the native FP8 forward's (ForwardParams::workspace)
  void* bwd_ws = nullptr;  // the native FP8 backward's (BackwardParams::workspace)
  float *lse, *delta;
  std::vector<attncore::Segment> segs;  // BENCH_SEGMENTS: [begin, end) of each, in every batch entry
  attncore::Segment* d_segs = nullptr;
  attncore::ForwardParams f;
  attncore::DeltaParams dp;
  attncore::BackwardParams g;

  Bench(Shape shape, bool c, attncore::DType t) : s(shape), causal(c), dtype(t) {
    using namespace attncore;
    nq = size_t(s.B) * s.S * s.Hq * s.D;
    nkv = size_t(s.B) * s.Skv * s.Hkv * s.D;
    q = random_inputs(nq, 1, dtype);
    k = random_inputs(nkv, 2, dtype);
    v = random_inputs(nkv, 3, dtype);
    d_o = random_inputs(nq, 4, dtype);
    CUDA_CHECK(cudaMalloc(&o, nq * size_t(dtype_bytes(output_dtype(dtype)))));
    CUDA_CHECK(cudaMalloc(&o32, nq * 4));
    CUDA_CHECK(cudaMalloc(&dq, nq * 4));
    CUDA_CHECK(cudaMalloc(&dk, nkv * 4));
    CUDA_CHECK(cudaMalloc(&dv, nkv * 4));
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&lse), size_t(s.B) * s.Hq * s.S * 4));
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&delta), size_t(s.B) * s.Hq * s.S * 4));
    const auto qt = [&](void* p) { return TensorRef{p, int64_t(s.S) * s.Hq * s.D, int64_t(s.Hq) * s.D, s.D}; };
    const auto kvt = [&](void* p) { return TensorRef{p, int64_t(s.Skv) * s.Hkv * s.D, int64_t(s.Hkv) * s.D, s.D}; };
    const RowStatsRef lse_ref{lse, int64_t(s.Hq) * s.S, s.S}, delta_ref{delta, int64_t(s.Hq) * s.S, s.S};
    const float descale = is_fp8(dtype) ? 1.f / kFp8Scale : 1.f;
    f.dtype = dtype;
    f.descale_q = f.descale_k = f.descale_v = descale;
    f.batch = s.B;
    f.heads_q = s.Hq;
    f.heads_kv = s.Hkv;
    f.head_dim = s.D;
    f.seqlen_q = s.S;
    f.seqlen_kv = s.Skv;
    f.q = qt(q);
    f.k = kvt(k);
    f.v = kvt(v);
    f.o = qt(o);
    f.lse = lse_ref;
    f.mask.causal = causal;
    f.mask.q_pos0 = s.Skv - s.S;
    if (const size_t n = forward_workspace_bytes(f)) {
      CUDA_CHECK(cudaMalloc(&fwd_ws, n));
      f.workspace = fwd_ws;
      f.workspace_bytes = n;
    }
    dp.dtype = dtype;
    dp.descale_do = descale;
    dp.batch = s.B;
    dp.heads = s.Hq;
    dp.head_dim = s.D;
    dp.seqlen = s.S;
    dp.o = qt(o);
    dp.d_o = qt(d_o);
    dp.delta = delta_ref;
    g.dtype = dtype;
    g.descale_q = g.descale_k = g.descale_v = g.descale_do = descale;
    g.batch = s.B;
    g.heads_q = s.Hq;
    g.heads_kv = s.Hkv;
    g.head_dim = s.D;
    g.seqlen_q = s.S;
    g.seqlen_kv = s.Skv;
    g.q = f.q;
    g.k = f.k;
    g.v = f.v;
    g.d_o = qt(d_o);
    g.o = qt(o);
    g.lse = lse_ref;
    g.delta = delta_ref;
    g.dq = qt(dq);
    g.dk = kvt(dk);
    g.dv = kvt(dv);
    g.mask = f.mask;
    BackwardParams writing_dq = g;  // (the workspace of "bwd write", which writes dq_out, serves both)
    writing_dq.dq_out = qt(o32);
    if (const size_t n = backward_workspace_bytes(writing_dq)) {
      CUDA_CHECK(cudaMalloc(&bwd_ws, n));
      g.workspace = bwd_ws;
      g.workspace_bytes = n;
    }
    if (const char* e = std::getenv("BENCH_SEGMENTS"); e && std::atoi(e) > 0 && s.Skv == s.S)
      for (int b = 0, L = std::atoi(e); b < s.S; b += L)
        segs.push_back({b, std::min(b + L, s.S), b, std::min(b + L, s.S), b, b});
    if (!segs.empty()) {
      CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d_segs), segs.size() * sizeof(Segment)));
      CUDA_CHECK(cudaMemcpy(d_segs, segs.data(), segs.size() * sizeof(Segment), cudaMemcpyHostToDevice));
      f.segments = g.segments = d_segs;
      f.num_segments = g.num_segments = int32_t(segs.size());
    }
  }
  ~Bench() {
    for (void* p : {q, k, v, d_o, o, o32, dq, dk, dv, fwd_ws, bwd_ws, static_cast<void*>(lse), static_cast<void*>(delta),
                    static_cast<void*>(d_segs)})
      cudaFree(p);
  }
  void zero_grads() {
    CUDA_CHECK(cudaMemsetAsync(dq, 0, nq * 4));
    zero_kv_grads();
  }
  void zero_kv_grads() {
    CUDA_CHECK(cudaMemsetAsync(dk, 0, nkv * 4));
    CUDA_CHECK(cudaMemsetAsync(dv, 0, nkv * 4));
  }
  // The forward of a ring's partial: the same call with O in fp32.
  attncore::ForwardParams forward_fp32() const {
    attncore::ForwardParams p = f;
    p.o = attncore::TensorRef{o32, f.o.batch_stride, f.o.token_stride, f.o.head_stride};
    p.o_fp32 = true;
    return p;
  }
  double flops() const {
    const auto pairs = [&](double n) { return causal ? n * (n + 1) / 2 : n * n; };
    const double extra = double(s.S) * (s.Skv - s.S);  // keys before the rows (a rectangle)
    double sum = segs.empty() ? (causal ? pairs(s.S) + extra : double(s.S) * s.Skv) : 0;
    for (const attncore::Segment& g : segs) sum += pairs(g.q_end - g.q_begin);
    return 4.0 * s.D * sum * s.B * s.Hq;
  }
  std::string name() const {
    char b[128];
    std::snprintf(b, sizeof b, "B=%d H=%d:%d S=%d D=%d causal=%d", s.B, s.Hq, s.Hkv, s.S, s.D, int(causal));
    std::string n = b;
    if (s.Skv != s.S) n.insert(n.find(" D="), ":" + std::to_string(s.Skv));
    if (dtype != attncore::DType::bf16) n += std::string(" ") + dtype_text(dtype);
    return segs.empty() ? n : n + " segments of " + std::to_string(segs[0].q_end);
  }
  std::string figure(float ms, double fl) const {
    char b[64];
    std::snprintf(b, sizeof b, "%.3f ms %.1f TFLOP/s", ms, fl / ms / 1e9);
    return b;
  }
};

// The native backward's figures (" | bwd ... | bwd write ..."); throws attncore::Error as the kernels do.
std::string native_backward(Bench& x, int runs) {
  using namespace attncore;
  // dQ's accumulator is cleared by the delta pass (DeltaParams::zero), dK's and dV's apart.
  DeltaParams delta_clearing_dq = x.dp;
  delta_clearing_dq.zero = x.dq;
  delta_clearing_dq.zero_bytes = x.nq * 4;
  const auto backward = [&](bool det) {
    x.g.deterministic = det;
    x.zero_kv_grads();
    compute_delta_cuda(delta_clearing_dq, nullptr);
    backward_cuda(x.g, nullptr);
  };
  const float t_bwd = median_ms([&] { backward(false); }, 2, runs);
  const float t_det = median_ms([&] { backward(true); }, 1, std::max(3, runs / 2));
  x.g.deterministic = false;
  // dK, dV and dQ in the output dtype into the (larger) fp32 buffers' memory, same element strides: dK
  // and dV over their accumulators, dQ (dq_out, rounded by the call) over the fp32 O of the partial
  // forward, unused here.
  BackwardParams w = x.g;
  w.write_dkdv = true;
  w.dq_out = TensorRef{x.o32, x.g.dq.batch_stride, x.g.dq.token_stride, x.g.dq.head_stride};
  const auto write = [&](const BackwardParams& call, bool pass) {
    compute_delta_cuda(delta_clearing_dq, nullptr);
    backward_cuda(call, nullptr);
    if (pass) convert_cuda(dq_out_conversion(w), nullptr);
  };
  const float t_write = median_ms([&] { write(w, false); }, 2, runs);
  std::string figures = " | bwd " + x.figure(t_bwd, 2.5 * x.flops()) + " | bwd deterministic " +
                        x.figure(t_det, 2.5 * x.flops()) + " | bwd write " + x.figure(t_write, 2.5 * x.flops());
  // BENCH_DQ_PASS=1: also with dQ rounded by the conversion pass after the call.
  if (const char* e = std::getenv("BENCH_DQ_PASS"); e && e[0] == '1') {
    BackwardParams adds_only = w;
    adds_only.dq_out = {};
    const float t_pass = median_ms([&] { write(adds_only, true); }, 2, runs);
    figures += " | bwd write, dQ pass " + x.figure(t_pass, 2.5 * x.flops());
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  return figures;
}

void bench_native(Bench& x) {
  using namespace attncore;
  const int runs = timed_runs(x.s.S);
  const float t_fwd = median_ms([&] { forward_cuda(x.f, nullptr); }, 3, runs);
  // A direction the kernels refuse (FP8's backward, say) ends its own figure, not the forward's.
  bool failed = false;
  const auto or_failed = [&failed](const char* label, auto&& figures) -> std::string {
    try {
      return figures();
    } catch (const Error& e) {
      failed = true;
      return std::string(" | ") + label + " FAILED: " + e.what();
    }
  };
  if (const char* b = std::getenv("BENCH_BACKWARD"); b && b[0] == '0') { // and the forward of a ring's partial
    const ForwardParams f32 = x.forward_fp32();
    const std::string t_f32 = or_failed("fwd O fp32", [&] {
      return " | fwd O fp32 " + x.figure(median_ms([&] { forward_cuda(f32, nullptr); }, 3, runs), x.flops());
    });
    std::printf("native %s | fwd %s%s\n", x.name().c_str(), x.figure(t_fwd, x.flops()).c_str(), t_f32.c_str());
    std::fflush(stdout);
    return;
  }
  const std::string bwd = or_failed("bwd", [&] { return native_backward(x, runs); });
  std::printf("native %s | fwd %s%s\n", x.name().c_str(), x.figure(t_fwd, x.flops()).c_str(), bwd.c_str());
  if (const char* e = std::getenv("BENCH_DELTA"); e && e[0] == '1' && !failed) {
    // the row pass before the backward
    DeltaParams delta_clearing_dq = x.dp;
    delta_clearing_dq.zero = x.dq;
    delta_clearing_dq.zero_bytes = x.nq * 4;
    const float t_delta = median_ms([&] { compute_delta_cuda(x.dp, nullptr); }, 3, runs);
    const float t_zero = median_ms([&] { CUDA_CHECK(cudaMemsetAsync(x.dq, 0, x.nq * 4)); }, 3, runs);
    const float t_both = median_ms(
        [&] {
          CUDA_CHECK(cudaMemsetAsync(x.dq, 0, x.nq * 4));
          compute_delta_cuda(x.dp, nullptr);
        },
        3, runs);
    const float t_fused = median_ms([&] { compute_delta_cuda(delta_clearing_dq, nullptr); }, 3, runs);
    std::printf("  delta %.1f us, dQ memset %.1f us, both %.1f us, delta clearing dQ %.1f us\n", 1e3 * t_delta,
                1e3 * t_zero, 1e3 * t_both, 1e3 * t_fused);
  }
  std::fflush(stdout);
}

void bench_cudnn(Bench& x, Scratch& scratch) {
  using namespace attncore;
  const Workspace ws{&Scratch::get, &scratch};
  const int runs = timed_runs(x.s.S);
  std::string line = "cudnn " + cudnn_version_string() + " " + x.name();
  std::string notes;
  // forward, O in bf16 (what frameworks produce) and in fp32 (a ring's partial)
  const ForwardParams f = x.f, f32 = x.forward_fp32();
  for (const ForwardParams* p : {&f, &f32}) {
    const char* label = p->o_fp32 ? "fwd O fp32" : "fwd";
    std::string why;
    if (!cudnn_supports(*p, &why)) {
      line += std::string(" | ") + label + " n/a";
      notes += std::string("\n  ") + label + ": " + why;
      continue;
    }
    const float t = median_ms([&] { forward_cudnn(*p, nullptr, ws); }, 3, runs);
    line += std::string(" | ") + label + " " + x.figure(t, x.flops());
    notes += std::string("\n  ") + label + ": " + cudnn_plan_info(*p);
  }
  // O and LSE for the backward, from whichever engine serves the forward
  std::string no_forward;
  if (cudnn_supports(f)) {
    forward_cudnn(f, nullptr, ws);
  } else {
    try {
      forward_cuda(f, nullptr);
    } catch (const Error& e) {
      no_forward = e.what();
    }
  }
  // backward: written in bf16, and added into the fp32 accumulators
  BackwardParams w = x.g, a = x.g;
  w.write_grads = true;  // bf16 gradients into the (larger) fp32 buffers' memory, same element strides
  for (const BackwardParams* p : {&w, &a}) {
    const char* label = p->write_grads ? "bwd write" : "bwd add";
    std::string why;
    if (!no_forward.empty()) {
      line += std::string(" | ") + label + " n/a";
      notes += std::string("\n  ") + label + ": no forward made O and LSE for it: " + no_forward;
      continue;
    }
    if (!cudnn_supports(*p, &why)) {
      line += std::string(" | ") + label + " n/a";
      notes += std::string("\n  ") + label + ": " + why;
      continue;
    }
    const float t = p->write_grads ? median_ms([&] { backward_cudnn(*p, nullptr, ws); }, 2, runs)
                                   : median_ms(
                                         [&] {
                                           x.zero_grads();
                                           backward_cudnn(*p, nullptr, ws);
                                         },
                                         2, runs);
    line += std::string(" | ") + label + " " + x.figure(t, 2.5 * x.flops());
    notes += std::string("\n  ") + label + ": " + cudnn_plan_info(*p);
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  std::printf("%s%s\n", line.c_str(), notes.c_str());
  std::fflush(stdout);
}

// Which graphs build for a shape, without timing (the docs' table of what cuDNN could and could not do).
void probe(const Shape& s, attncore::DType dtype) {
  using namespace attncore;
  for (bool causal : {false, true}) {
    Bench x(s, causal, dtype);
    const ForwardParams f32 = x.forward_fp32();
    BackwardParams w = x.g, a = x.g;
    w.write_grads = true;
    const char* out = dtype_text(output_dtype(dtype));
    std::printf("probe cudnn %s %s\n  fwd O %s: %s\n  fwd O fp32: %s\n  bwd write %s: %s\n  bwd add fp32: %s\n",
                cudnn_version_string().c_str(), x.name().c_str(), out, cudnn_plan_info(x.f).c_str(),
                cudnn_plan_info(f32).c_str(), out, cudnn_plan_info(w).c_str(), cudnn_plan_info(a).c_str());
    std::fflush(stdout);
  }
}

} // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  const bool probing = !args.empty() && args[0] == "--probe";
  if (probing) args.erase(args.begin());
  if (args.empty()) args = {"4", "32", "16384", "128"};
  if (args.size() % 4 != 0) {
    std::fprintf(stderr, "usage: [BENCH_CAUSAL=0|1] [BENCH_ENGINE=native|cudnn|both] [BENCH_DTYPE=bf16|fp16|fp8_e4m3|fp8_e5m2] "
                         "bench_core [--probe] [B H[:Hkv] S D]...\n");
    return 2;
  }
  std::vector<Shape> shapes;
  for (size_t i = 0; i < args.size(); i += 4) {
    Shape s{std::atoi(args[i].c_str()), 0, 0, std::atoi(args[i + 2].c_str()), std::atoi(args[i + 3].c_str())};
    const size_t colon = args[i + 1].find(':');
    s.Hq = std::atoi(args[i + 1].substr(0, colon).c_str());
    s.Hkv = colon == std::string::npos ? s.Hq : std::atoi(args[i + 1].substr(colon + 1).c_str());
    const size_t keys = args[i + 2].find(':');
    s.Skv = keys == std::string::npos ? s.S : std::atoi(args[i + 2].substr(keys + 1).c_str());
    if (s.Skv < s.S) {
      std::fprintf(stderr, "bench_core: Sq:Skv needs Skv >= Sq (%s)\n", args[i + 2].c_str());
      return 2;
    }
    shapes.push_back(s);
  }
  const char* only = std::getenv("BENCH_CAUSAL");
  const std::string engine = std::getenv("BENCH_ENGINE") ? std::getenv("BENCH_ENGINE") : "native";
  const attncore::DType dtype = bench_dtype();
  Scratch scratch;
  int failed = 0;
  for (const Shape& s : shapes) {
    if (probing) {
      try {
        probe(s, dtype);
      } catch (const std::exception& err) {
        std::printf("probe: FAILED: %s\n", err.what());
        ++failed;
      }
      continue;
    }
    for (bool causal : {true, false}) {
      if (only && (only[0] == '1') != causal) continue;
      Bench x(s, causal, dtype);
      for (const char* e : {"native", "cudnn"}) {
        if (engine != e && engine != "both") continue;
        try {  // a failing engine ends its own line, not the run
          if (e == std::string("native")) bench_native(x);
          else bench_cudnn(x, scratch);
        } catch (const std::exception& err) {
          std::printf("%s %s: FAILED: %s\n", e, x.name().c_str(), err.what());
          std::fflush(stdout);
          ++failed;
        }
      }
    }
  }
  return failed ? 1 : 0;
}
