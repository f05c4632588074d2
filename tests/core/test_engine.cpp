// attncore_plugin's engine choice (engine.h: native | cudnn | auto) through the ring schedule at world
// size 1, on the GPU (label gpu): the same problem with every choice gives the same outputs within
// the dtype's tolerance, and the engine logs once which engine served how many calls. The host is a
// small stand-in (default stream, cudaMalloc, a log that keeps its lines).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attncore/cudnn.h"
#include "attncore/numeric.h"
#include "attncore/cuda.h"
#include "attncore/plugin/engine.h"
#include "attncore/plugin/ring.h"

using namespace attncore;
using namespace attncore::plugin;

namespace {

#define CUDA_OK(expr) REQUIRE((expr) == cudaSuccess)

// A bf16 call's shape: B entries of S rows and S keys, Hq query and Hkv kv heads of D.
template <class Params> void set_shape(Params& p, int B, int Hq, int Hkv, int D, int S) {
  p.dtype = DType::bf16;
  p.batch = B;
  p.heads_q = Hq;
  p.heads_kv = Hkv;
  p.head_dim = D;
  p.seqlen_q = p.seqlen_kv = S;
}

// The host services a ring at world size 1 uses.
struct FakeHost {
  attnhost_host_api api{};
  std::vector<std::string> lines;
  size_t allocated = 0;  // bytes asked for, in all
  FakeHost() {
    api.struct_size = ATTNHOST_STRUCT_SIZE(attnhost_host_api, log);
    api.context = this;
    api.stream = [](void*, int32_t) -> void* { return nullptr; };
    api.alloc = [](void* c, size_t bytes, void** out) -> int32_t {
      static_cast<FakeHost*>(c)->allocated += bytes;
      return cudaMalloc(out, bytes) == cudaSuccess ? ATTNHOST_OK : ATTNHOST_ERR_OUT_OF_MEMORY;
    };
    api.free = [](void*, void* p) { cudaFree(p); };
    api.range_begin = [](void*, const char*, int32_t, void*) -> int32_t { return 0; };
    api.range_end = [](void*, int32_t, void*) {};
    api.log = [](void* c, int32_t, const char* m) { static_cast<FakeHost*>(c)->lines.push_back(m); };
  }
};

struct DeviceArray {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceArray(size_t n) : bytes(n) { REQUIRE(cudaMalloc(&ptr, n) == cudaSuccess); }
  ~DeviceArray() { cudaFree(ptr); }
  template <class T> std::vector<T> download() const {
    std::vector<T> h(bytes / sizeof(T));
    REQUIRE(cudaMemcpy(h.data(), ptr, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
};

attnhost_tensor tensor(void* data) {
  attnhost_tensor t{};
  t.struct_size = sizeof t;
  t.data = data;
  t.device_type = ATTNHOST_DEVICE_CUDA;
  return t;
}

struct Result {
  std::vector<uint16_t> o, dq, dk, dv;
  std::vector<float> lse;
  std::vector<std::string> log;
  size_t allocated = 0;
};

// One forward and backward of the ring at world size 1 with `calls` as its plan.
Result run(EngineChoice choice, const RingShape& base, const std::vector<BlockCall>& calls,
           const std::vector<uint16_t>& q, const std::vector<uint16_t>& kv, const std::vector<uint16_t>& d_o,
           bool dtype_partials = false) {
  FakeHost host;
  const RingShape& s = base;
  ScheduleOptions options;
  options.host = options.engine.host = attnhost::Host(&host.api);
  options.cuda = true;
  options.overlap = false;
  options.engine.choice = choice;
  options.engine.dtype_partials = dtype_partials;
  const size_t nq = q.size(), nkv = kv.size(), rows = size_t(s.batch) * s.heads_q * s.local_q;
  DeviceArray dq_in(nq * 2), dk_in(nkv * 2), dv_in(nkv * 2), ddo(nq * 2), o(nq * 2), lse(rows * 4), dq(nq * 2),
      dk(nkv * 2), dv(nkv * 2);
  CUDA_OK(cudaMemcpy(dq_in.ptr, q.data(), nq * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dk_in.ptr, kv.data(), nkv * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dv_in.ptr, kv.data(), nkv * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(ddo.ptr, d_o.data(), nq * 2, cudaMemcpyHostToDevice));
  Result r;
  {
    RingAttention ring(s, [&](int, int) { return calls; }, options);
    attnhost_forward_args fa{sizeof fa, tensor(dq_in.ptr), tensor(dk_in.ptr), tensor(dv_in.ptr), tensor(o.ptr),
                             tensor(lse.ptr)};
    ring.forward(fa);
    attnhost_backward_args ba{sizeof ba,          tensor(dq_in.ptr), tensor(dk_in.ptr), tensor(dv_in.ptr),
                              tensor(o.ptr),      tensor(lse.ptr),   tensor(ddo.ptr),   tensor(dq.ptr),
                              tensor(dk.ptr),     tensor(dv.ptr)};
    ring.backward(ba);
    CUDA_OK(cudaDeviceSynchronize());
  }  // the engine logs when the ring goes
  r.o = o.download<uint16_t>();
  r.lse = lse.download<float>();
  r.dq = dq.download<uint16_t>();
  r.dk = dk.download<uint16_t>();
  r.dv = dv.download<uint16_t>();
  r.log = host.lines;
  r.allocated = host.allocated;
  return r;
}

// Max error over max |b| of two bf16 arrays; NaN counts as a failure.
double rel_max(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = bf16_to_float(a[i]), y = bf16_to_float(b[i]);
    if (!std::isfinite(x)) return INFINITY;
    err = std::max(err, std::abs(x - y));
    ref = std::max(ref, std::abs(y));
  }
  return err / std::max(ref, 1e-3);
}

// O and gradients within the bf16 tolerances of the native result, LSE within 1e-4 (1 + |LSE|).
void check_agrees(const Result& got, const Result& native) {
  CHECK(rel_max(got.o, native.o) < 2e-2);
  CHECK(rel_max(got.dq, native.dq) < 5e-2);
  CHECK(rel_max(got.dk, native.dk) < 5e-2);
  CHECK(rel_max(got.dv, native.dv) < 5e-2);
  long lse_bad = 0;
  for (size_t i = 0; i < got.lse.size(); ++i)
    lse_bad += !(std::abs(got.lse[i] - native.lse[i]) <= 1e-4 * (1 + std::abs(native.lse[i])));
  CHECK(lse_bad == 0);
}

std::vector<uint16_t> random_bf16(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(d(rng));
  return v;
}

} // namespace

TEST_CASE("engine: the ring at world size 1 gives the same result with native, cudnn and auto, and logs once") {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  REQUIRE_MESSAGE(devices > 0, "needs a CUDA device");
  std::mt19937_64 rng(11);
  RingShape s;
  s.dtype = ATTNHOST_DTYPE_BF16;
  s.batch = 2;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim = 128;
  s.local_q = s.local_kv = 256;
  s.softmax_scale = 1.f / std::sqrt(128.f);
  const auto q = random_bf16(size_t(s.batch) * s.local_q * s.heads_q * s.head_dim, rng);
  const auto kv = random_bf16(size_t(s.batch) * s.local_kv * s.heads_kv * s.head_dim, rng);
  const auto d_o = random_bf16(q.size(), rng);
  for (int causal = 0; causal < 2; ++causal) {
    s.mask.seqlen = s.local_q;
    s.mask.causal = causal == 1;
    // One call for the whole block, or the split a zigzag-like plan makes (rows in halves: each
    // call sees a sub-range of the rows, the second half merges two partials).
    const int64_t h = s.local_q / 2;
    const std::vector<std::vector<BlockCall>> plans = {
        {BlockCall{0, s.local_q, 0, s.local_kv, 0, 0, causal == 1}},
        {BlockCall{0, h, 0, h, 0, 0, causal == 1}, BlockCall{h, s.local_q, 0, h, h, 0, false},
         BlockCall{h, s.local_q, h, s.local_kv, h, h, causal == 1}}};
    for (size_t plan = 0; plan < plans.size(); ++plan) {
      // the non-causal split also covers the first half's rows against the second half's keys
      std::vector<BlockCall> calls = plans[plan];
      if (plan == 1 && causal == 0) calls.push_back(BlockCall{0, h, h, s.local_kv, 0, h, false});
      CAPTURE(causal);
      CAPTURE(plan);
      const Result native = run(EngineChoice::native, s, calls, q, kv, d_o);
      REQUIRE(native.log.size() == 1);  // every result says which engine ran it
      CHECK(native.log[0] == "engine: native (" + std::string(native_kernels()) + ") for " +
                                 std::to_string(calls.size()) + " forward calls and " + std::to_string(calls.size()) +
                                 " backward calls (engine=native)");
      for (EngineChoice choice : {EngineChoice::cudnn, EngineChoice::automatic}) {
        CAPTURE(engine_choice_name(choice));
        const Result got = run(choice, s, calls, q, kv, d_o);
        check_agrees(got, native);
        REQUIRE(got.log.size() == 1);
        MESSAGE(got.log[0]);
        CHECK(got.log[0].rfind("engine: cudnn " + cudnn_version_string() + " for ", 0) == 0);
        const std::string calls_text = std::to_string(calls.size());
        CHECK(got.log[0].find(" of " + calls_text + " forward calls") != std::string::npos);
      }
      // Partials in dtype: cuDNN serves every call of the split too (the fp32 ones it refuses
      // otherwise), each partial rounded once to bf16 before the fp32 merge.
      // The native engine asked for dtype partials has nothing to round: same result, no scratch
      // (it once allocated the scratch before asking whether cuDNN serves the call).
      const Result native_rounded = run(EngineChoice::native, s, calls, q, kv, d_o, true);
      CHECK(native_rounded.o == native.o);
      CHECK(native_rounded.allocated == native.allocated);
      const Result rounded = run(EngineChoice::cudnn, s, calls, q, kv, d_o, true);
      check_agrees(rounded, native);
      REQUIRE(rounded.log.size() == 1);
      MESSAGE(rounded.log[0]);
      const std::string n = std::to_string(calls.size());
      CHECK(rounded.log[0].find(" for " + n + " of " + n + " forward calls and " + n + " of " + n + " backward calls") !=
            std::string::npos);
      CHECK(rounded.log[0].find("partials in dtype") != std::string::npos);
    }
  }
  CHECK(engine_choice(std::string("auto")) == EngineChoice::automatic);
  CHECK_THROWS(engine_choice(std::string("fast")));
}


// The engine alone, on calls cuDNN serves on every version measured (O in dtype, gradients written
// in dtype): the cudnn and auto choices run cuDNN (workspace from the host's allocator), the native
// choice the kernels, the results agree, and the log counts the cuDNN calls.
TEST_CASE("engine: cudnn and auto serve a dtype-O forward and a gradient-writing backward, native agrees") {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  REQUIRE_MESSAGE(devices > 0, "needs a CUDA device");
  std::mt19937_64 rng(12);
  const int B = 2, Hq = 8, Hkv = 2, D = 128, S = 2048;  // auto takes cuDNN for both passes here (measured)
  const size_t nq = size_t(B) * S * Hq * D, nkv = size_t(B) * S * Hkv * D, rows = size_t(B) * Hq * S;
  const auto q = random_bf16(nq, rng), kv = random_bf16(nkv, rng), d_o = random_bf16(nq, rng);
  DeviceArray dq_in(nq * 2), dk_in(nkv * 2), ddo(nq * 2);
  CUDA_OK(cudaMemcpy(dq_in.ptr, q.data(), nq * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dk_in.ptr, kv.data(), nkv * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(ddo.ptr, d_o.data(), nq * 2, cudaMemcpyHostToDevice));
  const auto qt = [&](void* p) { return TensorRef{p, int64_t(S) * Hq * D, int64_t(Hq) * D, D}; };
  const auto kvt = [&](void* p) { return TensorRef{p, int64_t(S) * Hkv * D, int64_t(Hkv) * D, D}; };
  for (int causal = 0; causal < 2; ++causal) {
    CAPTURE(causal);
    struct Out {
      std::vector<uint16_t> o, dk, dv;
      std::vector<float> lse, dq;
      std::vector<std::string> log;
    };
    // native: O in dtype, gradients added into fp32 (zeroed); the others write gradients in dtype
    const auto run_engine = [&](EngineChoice choice) {
      FakeHost host;
      Out r;
      DeviceArray o(nq * 2), lse(rows * 4), delta(rows * 4), dq(nq * 4), dk(nkv * 4), dv(nkv * 4);
      CUDA_OK(cudaMemset(dq.ptr, 0, nq * 4));
      CUDA_OK(cudaMemset(dk.ptr, 0, nkv * 4));
      CUDA_OK(cudaMemset(dv.ptr, 0, nkv * 4));
      {
        auto engine = Engine::make(true, false, EngineOptions{choice, attnhost::Host(&host.api)});
        ForwardParams f;
        set_shape(f, B, Hq, Hkv, D, S);
        f.q = qt(dq_in.ptr);
        f.k = f.v = kvt(dk_in.ptr);
        f.o = qt(o.ptr);
        f.lse = RowStatsRef{static_cast<float*>(lse.ptr), int64_t(Hq) * S, S};
        f.mask.causal = causal == 1;
        engine->forward(f, nullptr);
        BackwardParams g;
        set_shape(g, B, Hq, Hkv, D, S);
        g.q = f.q;
        g.k = g.v = f.k;
        g.o = f.o;
        g.d_o = qt(ddo.ptr);
        g.lse = f.lse;
        g.mask = f.mask;
        g.write_grads = choice != EngineChoice::native;
        const bool fp32 = !g.write_grads;
        g.dq = fp32 ? TensorRef{dq.ptr, int64_t(S) * Hq * D, int64_t(Hq) * D, D} : qt(dq.ptr);
        g.dk = fp32 ? TensorRef{dk.ptr, int64_t(S) * Hkv * D, int64_t(Hkv) * D, D} : kvt(dk.ptr);
        g.dv = fp32 ? TensorRef{dv.ptr, int64_t(S) * Hkv * D, int64_t(Hkv) * D, D} : kvt(dv.ptr);
        if (fp32) {
          DeltaParams dp;
          dp.dtype = DType::bf16;
          dp.batch = B;
          dp.heads = Hq;
          dp.head_dim = D;
          dp.seqlen = S;
          dp.o = f.o;
          dp.d_o = g.d_o;
          dp.delta = RowStatsRef{static_cast<float*>(delta.ptr), int64_t(Hq) * S, S};
          engine->compute_delta(dp, nullptr);
          g.delta = dp.delta;
        }
        engine->backward(g, nullptr);
        CUDA_OK(cudaDeviceSynchronize());
      }
      r.o = o.download<uint16_t>();
      r.lse = lse.download<float>();
      // gradients as bf16 for the comparison (fp32 accumulators rounded like the ring's convert)
      const auto as_bf16 = [](const std::vector<float>& v) {
        std::vector<uint16_t> out(v.size());
        for (size_t i = 0; i < v.size(); ++i) out[i] = float_to_bf16(v[i]);
        return out;
      };
      if (choice == EngineChoice::native) {
        r.dq = dq.download<float>();
        r.dk = as_bf16(dk.download<float>());
        r.dv = as_bf16(dv.download<float>());
      } else {
        const auto dq16 = dq.download<uint16_t>();
        r.dq.resize(nq);
        for (size_t i = 0; i < nq; ++i) r.dq[i] = bf16_to_float(dq16[i]);
        const auto dk16 = dk.download<uint16_t>(), dv16 = dv.download<uint16_t>();
        r.dk.assign(dk16.begin(), dk16.begin() + nkv);
        r.dv.assign(dv16.begin(), dv16.begin() + nkv);
      }
      r.log = host.lines;
      return r;
    };
    const Out native = run_engine(EngineChoice::native);
    for (EngineChoice choice : {EngineChoice::cudnn, EngineChoice::automatic}) {
      CAPTURE(engine_choice_name(choice));
      const Out got = run_engine(choice);
      CHECK(rel_max(got.o, native.o) < 2e-2);
      std::vector<uint16_t> dq_got(nq), dq_native(nq);
      for (size_t i = 0; i < nq; ++i) {
        dq_got[i] = float_to_bf16(got.dq[i]);
        dq_native[i] = float_to_bf16(native.dq[i]);
      }
      CHECK(rel_max(dq_got, dq_native) < 5e-2);
      CHECK(rel_max(got.dk, native.dk) < 5e-2);
      CHECK(rel_max(got.dv, native.dv) < 5e-2);
      long lse_bad = 0;
      for (size_t i = 0; i < rows; ++i)
        lse_bad += !(std::abs(got.lse[i] - native.lse[i]) <= 1e-4 * (1 + std::abs(native.lse[i])));
      CHECK(lse_bad == 0);
      REQUIRE(got.log.size() == 1);
      MESSAGE(got.log[0]);
      CHECK(got.log[0].find("for 1 of 1 forward calls and 1 of 1 backward calls") != std::string::npos);
    }
  }
}

TEST_CASE("engine: a backward call adds into fp32 dK and dV by atomics only where the native kernels serve it") {
  // Two such calls may then run at once on two streams over the same keys (allgather's query ranges).
  // (cuDNN serves no call that adds into fp32 gradients of bf16 inputs: those stay native.)
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  REQUIRE_MESSAGE(devices > 0, "needs a CUDA device");
  const int B = 2, Hq = 8, Hkv = 2, D = 128, S = 2048;  // a block cuDNN serves (see the case above)
  const size_t nq = size_t(B) * S * Hq * D, nkv = size_t(B) * S * Hkv * D, rows = size_t(B) * Hq * S;
  DeviceArray q(nq * 2), kv(nkv * 2), o(nq * 2), d_o(nq * 2), lse(rows * 4), delta(rows * 4), dq(nq * 4),
      dk(nkv * 4), dv(nkv * 4);
  BackwardParams g;
  set_shape(g, B, Hq, Hkv, D, S);
  g.q = {q.ptr, int64_t(S) * Hq * D, int64_t(Hq) * D, D};
  g.k = g.v = {kv.ptr, int64_t(S) * Hkv * D, int64_t(Hkv) * D, D};
  g.o = {o.ptr, int64_t(S) * Hq * D, int64_t(Hq) * D, D};
  g.d_o = {d_o.ptr, int64_t(S) * Hq * D, int64_t(Hq) * D, D};
  g.lse = RowStatsRef{static_cast<float*>(lse.ptr), int64_t(Hq) * S, S};
  g.delta = RowStatsRef{static_cast<float*>(delta.ptr), int64_t(Hq) * S, S};
  g.dq = {dq.ptr, int64_t(S) * Hq * D, int64_t(Hq) * D, D};
  g.dk = {dk.ptr, int64_t(S) * Hkv * D, int64_t(Hkv) * D, D};
  g.dv = {dv.ptr, int64_t(S) * Hkv * D, int64_t(Hkv) * D, D};
  g.mask.causal = true;
  FakeHost host;
  const auto atomic = [&](EngineChoice choice, bool dtype_partials, const BackwardParams& p) {
    auto engine = Engine::make(true, false, EngineOptions{choice, attnhost::Host(&host.api), dtype_partials});
    return engine->adds_atomically(p);
  };
  CHECK(atomic(EngineChoice::native, false, g));
  BackwardParams deterministic = g, writes = g;
  deterministic.deterministic = true;  // (its dQ kernels are others; it keeps one stream)
  writes.write_dkdv = true;
  CHECK_FALSE(atomic(EngineChoice::native, false, deterministic));
  CHECK_FALSE(atomic(EngineChoice::native, false, writes));
  CHECK(atomic(EngineChoice::native, true, g));  // partials in dtype matter only where cuDNN may serve
  if (cudnn_version() > 0) {  // cuDNN writes this call's gradients in dtype, added into fp32 by a pass of its own
    CHECK_FALSE(atomic(EngineChoice::cudnn, true, g));
    CHECK_FALSE(atomic(EngineChoice::automatic, true, g));
  }
  // A call cuDNN has no form for (dK and dV written in fp32: allgather's) goes native with engine=cudnn,
  // and the engine's line says why rather than only counting it out.
  if (cudnn_version() > 0) {
    BackwardParams fp32_writes = g;
    fp32_writes.write_dkdv = fp32_writes.write_dkdv_fp32 = true;
    FakeHost logged;
    {
      auto engine = Engine::make(true, false, EngineOptions{EngineChoice::cudnn, attnhost::Host(&logged.api), false});
      engine->backward(fp32_writes, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
    }
    REQUIRE(logged.lines.size() == 1);
    MESSAGE(logged.lines[0]);
    CHECK(logged.lines[0].find("0 of 1 backward calls") != std::string::npos);
    CHECK(logged.lines[0].find("has no cuDNN form") != std::string::npos);
  }
}
