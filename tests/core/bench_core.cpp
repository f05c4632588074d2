// Timing driver of the native kernels (not a test; the project's benchmark is the host). Prints one
// line per (shape, causal): median forward and backward times over CUDA events and TFLOP/s by the
// FlashAttention convention (forward 4 D per attended pair, backward 2.5x). Random bf16 inputs.
//   bench_core                 the reference shape B=4 H=32 S=16384 D=128, causal and not
//   bench_core B H S D [...]   other shapes (several groups of four)
//   BENCH_CAUSAL=0 bench_core  only the non-causal (or =1: causal) runs
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "attncore/cuda.h"
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

// Random bf16 N(0,1)-ish values (sum of uniforms), filled by all cores, then uploaded.
void* random_bf16(size_t n, uint64_t seed) {
  std::vector<uint16_t> h(n);
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
        h[i] = attncore::float_to_bf16((s - 2.f) * 1.7f);
      }
    });
  for (auto& th : pool) th.join();
  void* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, n * 2));
  CUDA_CHECK(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice));
  return d;
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

void bench(int B, int H, int S, int D, bool causal) {
  using namespace attncore;
  const size_t n = size_t(B) * S * H * D;
  void* q = random_bf16(n, 1);
  void* k = random_bf16(n, 2);
  void* v = random_bf16(n, 3);
  void* d_o = random_bf16(n, 4);
  void *o, *dq, *dk, *dv;
  float *lse, *delta;
  CUDA_CHECK(cudaMalloc(&o, n * 2));
  CUDA_CHECK(cudaMalloc(&dq, n * 4));
  CUDA_CHECK(cudaMalloc(&dk, n * 4));
  CUDA_CHECK(cudaMalloc(&dv, n * 4));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&lse), size_t(B) * H * S * 4));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&delta), size_t(B) * H * S * 4));
  const auto tensor = [&](void* p) { return TensorRef{p, int64_t(S) * H * D, int64_t(H) * D, D}; };
  const RowStatsRef lse_ref{lse, int64_t(H) * S, S}, delta_ref{delta, int64_t(H) * S, S};

  ForwardParams f;
  f.dtype = DType::bf16;
  f.batch = B;
  f.heads_q = f.heads_kv = H;
  f.head_dim = D;
  f.seqlen_q = f.seqlen_kv = S;
  f.q = tensor(q);
  f.k = tensor(k);
  f.v = tensor(v);
  f.o = tensor(o);
  f.lse = lse_ref;
  f.mask.causal = causal;
  DeltaParams dp;
  dp.dtype = DType::bf16;
  dp.batch = B;
  dp.heads = H;
  dp.head_dim = D;
  dp.seqlen = S;
  dp.o = tensor(o);
  dp.d_o = tensor(d_o);
  dp.delta = delta_ref;
  BackwardParams g;
  g.dtype = DType::bf16;
  g.batch = B;
  g.heads_q = g.heads_kv = H;
  g.head_dim = D;
  g.seqlen_q = g.seqlen_kv = S;
  g.q = f.q;
  g.k = f.k;
  g.v = f.v;
  g.d_o = tensor(d_o);
  g.lse = lse_ref;
  g.delta = delta_ref;
  g.dq = tensor(dq);
  g.dk = tensor(dk);
  g.dv = tensor(dv);
  g.mask.causal = causal;

  const auto backward = [&](bool det) {
    g.deterministic = det;
    CUDA_CHECK(cudaMemsetAsync(dq, 0, n * 4));
    CUDA_CHECK(cudaMemsetAsync(dk, 0, n * 4));
    CUDA_CHECK(cudaMemsetAsync(dv, 0, n * 4));
    compute_delta_cuda(dp, nullptr);
    backward_cuda(g, nullptr);
  };
  const int runs = S >= 8192 ? 10 : 20;
  const float t_fwd = median_ms([&] { forward_cuda(f, nullptr); }, 3, runs);
  const float t_bwd = median_ms([&] { backward(false); }, 2, runs);
  const float t_det = median_ms([&] { backward(true); }, 1, std::max(3, runs / 2));
  CUDA_CHECK(cudaDeviceSynchronize());
  const double pairs = causal ? double(S) * (S + 1) / 2 : double(S) * S;
  const double flops = 4.0 * D * pairs * B * H;
  std::printf("attncore B=%d H=%d S=%d D=%d causal=%d | fwd %.3f ms %.1f TFLOP/s | bwd %.3f ms %.1f TFLOP/s | "
              "bwd deterministic %.3f ms %.1f TFLOP/s\n",
              B, H, S, D, int(causal), t_fwd, flops / t_fwd / 1e9, t_bwd, 2.5 * flops / t_bwd / 1e9, t_det,
              2.5 * flops / t_det / 1e9);
  std::fflush(stdout);
  for (void* p : {q, k, v, d_o, o, dq, dk, dv, static_cast<void*>(lse), static_cast<void*>(delta)}) cudaFree(p);
}

} // namespace

int main(int argc, char** argv) {
  // Groups of four (B H S D: causal and not) or, with BENCH_CAUSAL=0/1 set, only that one.
  std::vector<int> shape = {4, 32, 16384, 128};
  if (argc > 1) {
    shape.clear();
    for (int i = 1; i < argc; ++i) shape.push_back(std::atoi(argv[i]));
  }
  if (shape.size() % 4 != 0) {
    std::fprintf(stderr, "usage: [BENCH_CAUSAL=0|1] bench_core [B H S D]...\n");
    return 2;
  }
  const char* only = std::getenv("BENCH_CAUSAL");
  try {
    for (size_t i = 0; i < shape.size(); i += 4)
      for (bool causal : {true, false})
        if (!only || (only[0] == '1') == causal) bench(shape[i], shape[i + 1], shape[i + 2], shape[i + 3], causal);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_core: %s\n", e.what());
    return 1;
  }
  return 0;
}
