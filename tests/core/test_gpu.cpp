// attncore CUDA kernels against the CPU reference (label gpu: needs a CUDA device).
// Shapes are random within each case (lengths that are not multiples of any tile), outputs are
// poisoned with NaN before each call so that an element a kernel forgets to write fails the check,
// and rows a call must not touch must still hold the poison afterwards.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <optional>
#include <vector>
#include <string>

#include "attncore/cpu.h"
#include "attncore/cuda.h"
#include "gpu_support.h"
#include "problem.h"

using namespace coretest;

namespace {

// An environment variable a test sets, put back as it found it when the scope ends (a failed
// REQUIRE included), so that a value given to the whole binary reaches the tests after it.
class ScopedEnv {
 public:
  explicit ScopedEnv(const char* name) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
  }
  ~ScopedEnv() { set(old_ ? old_->c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  void set(const char* value) {  // (nullptr: unset)
    if (value) setenv(name_, value, 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// How the backward puts dK and dV out (BackwardParams::write_dkdv, write_dkdv_fp32).
enum class Dkdv { add, write, write_fp32 };

// Other calls' fp32 shares of keys [begin, end), added before dK and dV are written
// (BackwardParams::dk_add).
struct Shares {
  const Tensor *dk = nullptr, *dv = nullptr;
  int64_t begin = 0, end = 0;
};

// The backward on the device into host tensors dq, dk, dv (fp32 accumulators starting from their
// contents; written dk and dv, in the problem's dtype or in fp32, over NaN poison), and dq_out
// (BackwardParams::dq_out, over poison) where given. The call gets the workspace it asks for,
// unless `workspace` is false.
void backward_gpu(Problem& p, Stats lse, Stats delta, Tensor& dq, Tensor& dk, Tensor& dv, bool deterministic,
                  Dkdv out, bool workspace = true, Shares shares = {}, Tensor* dq_out = nullptr) {
  DeviceProblem dp(p);
  DeviceStats lse_d(lse), delta_d(delta);
  DeviceTensor dq_d(dq), dk_d(dk), dv_d(dv);
  std::unique_ptr<DeviceTensor> dq_out_d;
  if (dq_out) {
    dq_out_d = std::make_unique<DeviceTensor>(*dq_out);
    dq_out_d->buf->poison();
  }
  std::unique_ptr<DeviceTensor> dk_add, dv_add;
  if (shares.dk) {
    dk_add = std::make_unique<DeviceTensor>(*shares.dk);
    dv_add = std::make_unique<DeviceTensor>(*shares.dv);
  }
  if (out != Dkdv::add) {
    dk_d.buf->poison();
    dv_d.buf->poison();
  }
  BackwardParams g = p.backward_params(lse, delta, dq, dk, dv);
  dp.point(p, g);
  g.lse = lse_d.ref;
  g.delta = delta_d.ref;
  g.dq = dq_d.ref;
  g.dk = dk_d.ref;
  g.dv = dv_d.ref;
  g.deterministic = deterministic;
  g.write_dkdv = out != Dkdv::add;
  g.write_dkdv_fp32 = out == Dkdv::write_fp32;
  if (dq_out_d) g.dq_out = dq_out_d->ref;
  if (dk_add) {
    g.dk_add = dk_add->ref;
    g.dv_add = dv_add->ref;
    g.add_begin = shares.begin;
    g.add_end = shares.end;
  }
  // The sums of a block list's split key groups (and FP8's widened inputs), over poison: the call
  // writes what it reads.
  std::unique_ptr<DeviceBuffer> room;
  if (const size_t bytes = backward_workspace_bytes(g); bytes > 0 && workspace) {
    room = std::make_unique<DeviceBuffer>(bytes);
    room->poison();
    g.workspace = room->ptr;
    g.workspace_bytes = bytes;
  }
  backward_cuda(g, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  dq_d.download(dq);
  dk_d.download(dk);
  dv_d.download(dv);
  if (dq_out_d) dq_out_d->download(*dq_out);
}

// The same on the GPU. The backward takes the CPU's LSE and delta so that its check isolates it.
Outputs run_gpu(Problem& p, bool grads, bool deterministic, const Outputs* cpu_ref) {
  DeviceProblem dp(p);
  Outputs r;
  r.o = Tensor(output_dtype(p.dtype), p.B, p.Sq, p.Hq, p.D);
  r.o32 = Tensor(DType::fp32, p.B, p.Sq, p.Hq, p.D);
  r.lse = Stats(p.B, p.Hq, p.Sq);
  r.lse32 = r.lse;
  DeviceTensor o(r.o), o32(r.o32);
  DeviceStats lse(r.lse), lse32(r.lse32);
  o.buf->poison();
  o32.buf->poison();
  lse.buf->poison();
  lse32.buf->poison();
  ForwardParams f = p.forward_params(r.o, r.lse, false);
  dp.point(p, f);
  // An FP8 forward's V^T, over poison: every byte the kernel reads is written first.
  DeviceBuffer workspace(forward_workspace_bytes(f));
  workspace.poison();
  f.workspace = workspace.ptr;
  f.workspace_bytes = workspace.bytes;
  f.o = o.ref;
  f.lse = lse.ref;
  forward_cuda(f, nullptr);
  f.o = o32.ref;
  f.lse = lse32.ref;
  f.o_fp32 = true;
  forward_cuda(f, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  o.download(r.o);
  o32.download(r.o32);
  lse.download(r.lse);
  lse32.download(r.lse32);
  if (!grads) return r;

  // delta on the GPU from the GPU's dtype O
  r.delta = Stats(p.B, p.Hq, p.Sq);
  DeviceStats delta(r.delta);
  delta.buf->poison();
  compute_delta_cuda(p.delta_params(o.ref, false, dp.d_o.ref, delta.ref), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  delta.download(r.delta);

  r.dq = Tensor(DType::fp32, p.B, p.Sq, p.Hq, p.D); // zero: accumulators start empty
  r.dk = Tensor(DType::fp32, p.B, p.Skv, p.Hkv, p.D);
  r.dv = Tensor(DType::fp32, p.B, p.Skv, p.Hkv, p.D);
  backward_gpu(p, cpu_ref ? cpu_ref->lse : r.lse, cpu_ref ? cpu_ref->delta : r.delta, r.dq, r.dk, r.dv, deterministic,
               Dkdv::add);
  return r;
}

// 700 tokens of batch 1, 4 query heads on 2 kv heads, random data; the caller sets the segments.
Problem segments_problem(std::mt19937_64& rng, DType dtype, int32_t D, bool causal) {
  Problem p;
  p.dtype = dtype;
  p.D = D;
  p.Hq = 4;
  p.Hkv = 2;
  p.Sq = p.Skv = 700;
  std::mt19937_64 data(rng());
  p.randomize(data);
  p.mask.causal = causal;
  return p;
}

// One batch, two query heads on one K/V head, the given lengths, random data: the long-row cases
// (the CPU reference's cost grows with the rows, not with heads the kernels treat alike).
Problem two_heads_problem(std::mt19937_64& rng, DType dtype, int32_t D, int64_t Sq, int64_t Skv) {
  Problem p = random_problem(rng, dtype, D, 2, 10);
  p.B = 1;
  p.Hkv = 1;
  p.Hq = 2;
  p.Sq = Sq;
  p.Skv = Skv;
  std::mt19937_64 data(rng());
  p.randomize(data);
  return p;
}

// Two batches of `S` tokens, the given heads, random data drawn from `data`.
Problem two_batches_problem(std::mt19937_64& data, DType dtype, int32_t D, int32_t Hq, int32_t Hkv, int64_t S) {
  Problem p;
  p.dtype = dtype;
  p.D = D;
  p.B = 2;
  p.Hq = Hq;
  p.Hkv = Hkv;
  p.Sq = p.Skv = S;
  p.randomize(data);
  return p;
}

// Causal, a random window (causal or not), or no mask; and random query and key offsets.
enum class MaskKind { causal, window, full };
void random_mask(std::mt19937_64& rng, Problem& p, MaskKind kind) {
  p.mask.causal = kind == MaskKind::causal;
  if (kind == MaskKind::window) {
    p.mask.causal = rng() % 2 == 0;
    p.mask.window_left = int64_t(rng() % 100);
    p.mask.window_right = p.mask.causal ? -1 : int64_t(rng() % 50);
  }
  p.mask.q_pos0 = int64_t(rng() % 64);
  p.mask.kv_pos0 = int64_t(rng() % 64);
}

void check_all(Problem& p, bool grads = true) {
  REQUIRE((grads ? check_supported(p.dtype, p.D) : check_supported_forward(p.dtype, p.D)).empty());
  const Outputs want = run_cpu(p, grads);
  const Outputs got = run_gpu(p, grads, false, &want);
  check_forward(p, want, got);
  if (!grads) return;
  check_backward(p, want, got);
  const Outputs det = run_gpu(p, grads, true, &want);
  check_backward(p, want, det);
}

// The backward with write_dkdv: dK and dV in the output dtype over NaN poison. Each key's gradient
// is one add into zero in accumulator mode (no GQA group cut over CTAs at these lengths), so the
// written values must be `acc`'s dK and dV rounded, bit for bit, on every key (zeros where no query
// sees it).
void check_write_dkdv(Problem& p, const Outputs& want, const Outputs& acc) {
  const DType out = output_dtype(p.dtype); // (FP8 calls write bf16 gradients)
  Tensor dq32(DType::fp32, p.B, p.Sq, p.Hq, p.D), dk(out, p.B, p.Skv, p.Hkv, p.D), dv(out, p.B, p.Skv, p.Hkv, p.D);
  backward_gpu(p, want.lse, want.delta, dq32, dk, dv, false, Dkdv::write);
  CHECK(differ_from_shared(dk, dv, acc.dk, acc.dv, acc.dk, acc.dv, 0, 0) == 0);  // (no key takes a share)
}

} // namespace

TEST_CASE("gpu: a CUDA device is present") { REQUIRE_MESSAGE(device_count() > 0, "the gpu tests need a CUDA device"); }

TEST_CASE("gpu: every head dim and dtype, random shapes, causal and windows") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(42);
  for (DType dt : {DType::bf16, DType::fp16})
    for (int32_t D : {64, 80, 96, 128, 256})
      for (int variant = 0; variant < 3; ++variant) {
        Problem p = random_problem(rng, dt, D, 1 + int(rng() % 3), 300);
        random_mask(rng, p, variant == 0 ? MaskKind::causal : variant == 1 ? MaskKind::window : MaskKind::full);
        CAPTURE(name(dt));
        CAPTURE(D);
        CAPTURE(variant);
        CAPTURE(p.Sq);
        CAPTURE(p.Skv);
        CAPTURE(p.Hq);
        CAPTURE(p.Hkv);
        check_all(p);
      }
}

// Causal calls of 513-1024 rows (2048 at d64) take the Hopper forward's pair configuration
// (pair_serves); the random shapes above stay under 300 rows. Lengths that are not multiples of a
// tile, a query offset, and GQA.
// FP8 (e4m3 Q, K, V and dO with descales) against the CPU reference on the same quantized inputs:
// the Hopper forward (bf16 and fp32 O), delta from FP8 dO, and the backward (the long d128 calls
// with e4m3 products, tested in full below; the rest on widened inputs, by the Hopper and the
// deterministic kernels); random shapes with causal, full and window masks, query offsets and GQA,
// and rows long enough to run the tile pipeline. Elsewhere, and for what it does not take, the
// one-line refusals.
TEST_CASE("gpu: FP8 e4m3 forward and backward, head dims 64, 128 and 256") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(8);
  Problem probe = random_problem(rng, DType::fp8_e4m3, 128, 1, 100);
  if (std::string(native_kernels()) != "wgmma") {
    CHECK_THROWS_WITH_AS(run_gpu(probe, false, false, nullptr),
                         "attncore cuda: the FP8 forward runs on the Hopper kernels only (an sm_90a build on a Hopper "
                         "GPU, ATTNCORE_KERNELS not mma)",
                         Error);
    return;
  }
  for (int32_t D : {64, 128, 256})
    for (int variant = 0; variant < 4; ++variant) {
      Problem p = random_problem(rng, DType::fp8_e4m3, D, 1 + int(rng() % 3), variant == 3 ? 1200 : 300);
      std::mt19937_64 data(rng());
      p.randomize(data, /*pad=*/16 * int64_t(rng() % 2)); // rows of 16-byte multiples, as bulk copies read
      random_mask(rng, p, variant == 0 || variant == 3 ? MaskKind::causal : variant == 2 ? MaskKind::window : MaskKind::full);
      CAPTURE(D);
      CAPTURE(variant);
      CAPTURE(p.Sq);
      CAPTURE(p.Skv);
      CAPTURE(p.Hq);
      CAPTURE(p.Hkv);
      check_all(p);
    }
  // The hybrid recipe: dO in e5m2 (widened from it, and delta read from it) beside e4m3 Q, K, V.
  for (int32_t D : {64, 128}) {
    Problem p = random_problem(rng, DType::fp8_e4m3, D, 2, 700);
    p.dtype_do = DType::fp8_e5m2;
    std::mt19937_64 data(rng());
    p.randomize(data);
    random_mask(rng, p, MaskKind::causal);
    REQUIRE(p.d_o.dtype == DType::fp8_e5m2);
    CAPTURE(D);
    check_all(p);
  }
  // 192-key tiles (d128, plain calls of 2048 keys and more): ragged lengths, both masks, a query offset.
  for (bool causal : {true, false}) {
    Problem p = two_heads_problem(rng, DType::fp8_e4m3, 128, 2500, 2100);
    p.mask.causal = causal;
    p.mask.q_pos0 = causal ? 400 : 0;
    CAPTURE(causal);
    check_all(p);
  }
  // Scores that grow along the keys (K scaled from 1 to 4 over its rows, the largest saturating):
  // each row's maximum grows by more than 2^8 in exp2 units, so the forwards that keep a maximum
  // until then (192-key tiles at d128, d256) rescale O partway along the row, and every FP8
  // forward's softmax against the kept maxima finds P past 448 and takes the tile's scores again.
  for (int32_t D : {128, 256}) {
    Problem p = two_heads_problem(rng, DType::fp8_e4m3, D, 2500, 2100);
    for (int64_t j = 0; j < p.Skv; ++j)
      for (int32_t h = 0; h < p.Hkv; ++h)
        for (int32_t d = 0; d < D; ++d) p.k.set(0, j, h, d, p.k.get(0, j, h, d) * (1.0 + 3.0 * double(j) / double(p.Skv)));
    CAPTURE(D);
    check_all(p);
  }
  Problem no_room = random_problem(rng, DType::fp8_e4m3, 64, 1, 100);
  std::mt19937_64 no_room_data(rng());
  no_room.randomize(no_room_data, /*pad=*/0); // FP8 strides of 16-element multiples: the workspace is the refusal
  Outputs want = run_cpu(no_room, true);
  Tensor dq(DType::fp32, no_room.B, no_room.Sq, no_room.Hq, no_room.D);
  Tensor dk(DType::fp32, no_room.B, no_room.Skv, no_room.Hkv, no_room.D), dv = dk;
  CHECK_THROWS_WITH_AS(backward_gpu(no_room, want.lse, want.delta, dq, dk, dv, false, Dkdv::add, /*workspace=*/false),
                       "attncore cuda: an FP8 backward needs backward_workspace_bytes(params) bytes of workspace, "
                       "256-byte aligned (its inputs widened to bf16)",
                       Error);
  Problem e5m2 = random_problem(rng, DType::fp8_e5m2, 128, 1, 100);
  CHECK_THROWS_WITH_AS(run_gpu(e5m2, false, false, nullptr),
                       "attncore: FP8 on CUDA takes e4m3 (e5m2 runs on the CPU path)", Error);
  Problem d80 = random_problem(rng, DType::fp8_e4m3, 80, 1, 100);
  CHECK_THROWS_AS(run_gpu(d80, false, false, nullptr), Error);
  Problem padded = random_problem(rng, DType::fp8_e4m3, 128, 1, 100);
  std::mt19937_64 data(rng());
  padded.randomize(data, /*pad=*/8);
  CHECK_THROWS_WITH_AS(run_gpu(padded, false, false, nullptr),
                       "attncore cuda: FP8 q, k and v must be 16-byte aligned with strides that are multiples of 16 elements",
                       Error);
  Problem segs = segments_problem(rng, DType::fp8_e4m3, 128, true);
  segs.segments = {{0, 300, 0, 300, 0, 0}, {300, 700, 300, 700, 0, 0}};
  CHECK_THROWS_WITH_AS(run_gpu(segs, false, false, nullptr),
                       "attncore: the FP8 forward on CUDA takes calls without segments", Error);
}

// The FP8 backward with e4m3 products (d128, e4m3 dO, plain calls of at least 1024 rows): against
// the CPU reference within FP8's tolerance, causal with a query offset and full, ragged lengths
// (rows not whole 32-query groups of dO^T, keys not whole tiles), a GQA pair, dK and dV written,
// and the pair cut over two CTAs; then two batch entries of 4 query heads on 2, padded rows, a key
// offset, and a descale of its own for each tensor (a descale applied to the wrong product fails);
// then rows of 65536 keys, where P^T's scale a key row keeps dV's precision.
// The products are the default; ATTNCORE_FP8_PRODUCTS=0 takes the widened inputs' path, whose dV
// keeps P in bf16 where the products round it to e4m3: the two must differ, or the products did not run.
TEST_CASE("gpu: FP8 backward with e4m3 products") {
  REQUIRE(device_count() > 0);
  if (std::string(native_kernels()) != "wgmma") return; // (the FP8 test above checks the refusal)
  ScopedEnv products_env("ATTNCORE_FP8_PRODUCTS"), splits_env("ATTNCORE_HEAD_SPLITS");
  const auto products = [&](bool on) { products_env.set(on ? nullptr : "0"); };
  std::mt19937_64 rng(21);
  const auto differ = [](const Tensor& a, const Tensor& b) {
    int64_t n = 0;
    for (int64_t i = 0; i < a.B; ++i)
      for (int64_t j = 0; j < a.S; ++j)
        for (int64_t h = 0; h < a.H; ++h)
          for (int64_t d = 0; d < a.D; ++d) n += a.get(i, j, h, d) != b.get(i, j, h, d);
    return n;
  };
  for (bool causal : {true, false}) {
    Problem p = two_heads_problem(rng, DType::fp8_e4m3, 128, 2 * 1024 + 77, 1900 + 45);
    p.mask.causal = causal;
    p.mask.q_pos0 = causal ? 300 : 0;
    CAPTURE(causal);
    const Outputs want = run_cpu(p, true);
    products(true);
    const Outputs got = run_gpu(p, true, false, &want);
    check_backward(p, want, got);
    check_write_dkdv(p, want, got);
    splits_env.set("2");
    const Outputs split = run_gpu(p, true, false, &want);
    splits_env.set(nullptr);
    check_backward(p, want, split);
    products(false);
    const Outputs widened = run_gpu(p, true, false, &want);
    check_backward(p, want, widened);
    CHECK(differ(got.dv, widened.dv) > 0);
  }
  Problem p = random_problem(rng, DType::fp8_e4m3, 128, 2, 10);
  p.B = 2;
  p.Hkv = 2;
  p.Hq = 4;
  p.Sq = 1024 + 93;
  p.Skv = 1100 + 7;
  p.fp8_descales = {1.0 / 32, 1.0 / 16, 1.0 / 8, 1.0 / 64};
  std::mt19937_64 data(rng());
  p.randomize(data, /*pad=*/16);
  p.mask.causal = true;
  p.mask.q_pos0 = 50;
  p.mask.kv_pos0 = 20;
  const Outputs want = run_cpu(p, true);
  products(true);
  const Outputs got = run_gpu(p, true, false, &want);
  check_backward(p, want, got);
  products(false);
  const Outputs widened = run_gpu(p, true, false, &want);
  CHECK(differ(got.dv, widened.dv) > 0);

  // Rows of 65536 keys without a mask, against the widened path's dV (itself within 0.0025 of
  // float64): P is about 2^-16 here, where one scale for every key row left P^T in e4m3's subnormals
  // and dV's error grew with the rows. With a scale a key row P keeps e4m3's relative rounding, u /
  // sqrt(3) = 0.036 of the norm at most (docs/SUITES.md, "FP8 tolerances").
  Problem wide = two_heads_problem(rng, DType::fp8_e4m3, 128, 1024, 65536);
  products(true);
  const Outputs wide_got = run_gpu(wide, true, false, nullptr);
  products(false);
  const Outputs wide_widened = run_gpu(wide, true, false, nullptr);
  Diff dv;
  for (int64_t j = 0; j < wide.Skv; ++j)
    for (int32_t d = 0; d < wide.D; ++d) dv.add(wide_got.dv.get(0, j, 0, d), wide_widened.dv.get(0, j, 0, d));
  CAPTURE(dv.rel_norm());
  CHECK(dv.nonfinite == 0);
  CHECK(dv.rel_norm() < 0.036 + 0.0025);
  CHECK(differ(wide_got.dv, wide_widened.dv) > 0);
}

// The outputs' amax (an FP8 step's statistic): the CPU's value exactly, for each output dtype, packed
// rows (one run of 16-byte words) and rows with padding, a row of NaN (never written) skipped, odd
// head dims on the one-element path.
TEST_CASE("gpu: amax of an output equals the CPU's") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(77);
  // At D=128, 2 x 8192 x 8 rows: more than the capped grid covers in one stride (the row walk's,
  // and in fp32 the packed walk's: 4M words against 2M a stride).
  for (DType dt : {DType::bf16, DType::fp16, DType::fp32})
    for (int32_t D : {128, 36, 7})
    for (int64_t pad : {int64_t{0}, int64_t{D == 7 ? 1 : 8}}) {
      const int32_t heads = D == 128 ? 8 : 3;
      const int64_t tokens = D == 128 ? 8192 : 301;
      Tensor x(dt, 2, tokens, heads, D, pad);
      std::normal_distribution<double> normal(0.0, 2.0);
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t i = 0; i < tokens; ++i)
          for (int32_t h = 0; h < heads; ++h)
            for (int32_t d = 0; d < D; ++d) x.set(b, i, h, d, normal(rng));
      for (int32_t d = 0; d < D; ++d) x.set(1, 17, 2, d, std::numeric_limits<double>::quiet_NaN());
      x.set(1, tokens - 1, heads - 1, D - 1, 40.0); // the largest in the last row the grid reaches
      float want = -1.f, got = -1.f;
      AmaxParams p{dt, 2, heads, D, tokens, x.ref(), &want};
      cpu::amax(p);
      DeviceTensor xd(x);
      DeviceBuffer out(sizeof(float));
      out.poison();
      p.x = xd.ref;
      p.amax = static_cast<float*>(out.ptr);
      amax_cuda(p, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      out.download(&got);
      CAPTURE(D);
      CAPTURE(pad);
      CHECK(want == 40.f);
      CHECK(got == want);
    }
}

TEST_CASE("gpu: causal calls of 513 to 2048 rows (the Hopper forward's pair configuration at its widest)") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(1024);
  for (int32_t D : {64, 128}) {
    Problem p = random_problem(rng, DType::bf16, D, 2, 300);
    p.Sq = D == 64 ? 2000 : 1000;
    p.Skv = D == 64 ? 2048 : 1000;
    p.mask.causal = true;
    p.mask.q_pos0 = D == 64 ? 0 : 37;
    std::mt19937_64 data(rng());
    p.randomize(data, 0);
    CAPTURE(D);
    check_all(p);
  }
}

// Causal calls of more than 1024 rows (2048 at d64) leave the Hopper forward's pair configuration
// for the standard one, which the other cases reach with the full mask or short rows: segments of 9,
// 1 and 7 query tiles and an empty one, then a window whose first 300 rows see no key.
TEST_CASE("gpu: causal segments past the pair configuration's rows, a window whose first rows see no key") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(2048);
  for (int32_t D : {64, 128}) {
    Problem p = two_heads_problem(rng, DType::bf16, D, 2200, 2200);
    p.mask.causal = true;
    p.segments = {{0, 1100, 0, 1100, 0, 0}, {1100, 1100, 1100, 1100, 0, 0}, {1100, 1150, 1100, 1150, 0, 0},
                  {1150, 2000, 1150, 2000, 0, 0}};
    CAPTURE(D);
    check_all(p);
    p.segments.clear();
    p.mask.causal = false;
    p.mask.kv_pos0 = 300; // keys from position 300: the first 300 rows see none
    p.mask.window_left = 40;
    p.mask.window_right = 0;
    check_all(p);
  }
}

TEST_CASE("gpu: GQA ratios 1 to 8") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(7);
  for (int ratio = 1; ratio <= 8; ++ratio) {
    Problem p = random_problem(rng, DType::bf16, 64, ratio, 200);
    p.mask.causal = ratio % 2 == 1;
    CAPTURE(ratio);
    check_all(p);
  }
}

// The Hopper backward cuts a GQA group's query heads over several CTAs a key tile where a call has
// few CTAs and long walks (sm90 backward_head_splits); ATTNCORE_HEAD_SPLITS forces the cut on shapes
// the reference can afford, in each step size (64 rows; 128 at d64 from 4096 rows; 80 at d128 from
// 1024 full). The parts add dK and dV by atomics: into accumulators, and where the call writes fp32
// dK and dV (over NaN poison here) into the pair it has zeroed first. Not bit for bit the uncut
// call's: a key's gradients are several adds.
TEST_CASE("gpu: GQA groups cut over several CTAs a key tile add dK and dV (accumulated and written in fp32)") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(29);
  struct Shape {
    int32_t D;
    int64_t Sq, Skv;  // 0: random up to 400
    bool causal;
  };
  const Shape shapes[] = {{64, 0, 0, true}, {64, 0, 0, false}, {128, 0, 0, true}, {128, 0, 0, false},
                          {64, 4100, 200, false}, {128, 1100, 300, false}};
  for (const char* splits : {"2", "4"})
    for (const Shape& shape : shapes) {
      ScopedEnv forced("ATTNCORE_HEAD_SPLITS");  // for one case, as it was however it ends
      forced.set(splits);
      Problem p = random_problem(rng, DType::bf16, shape.D, 4, 400);
      if (shape.Sq > 0) {
        p.B = 1;
        p.Hkv = 1;
        p.Hq = 4;
        p.Sq = shape.Sq;
        p.Skv = shape.Skv;
        std::mt19937_64 data(rng());
        p.randomize(data);
      }
      p.mask.causal = shape.causal;
      CAPTURE(splits);
      CAPTURE(shape.D);
      CAPTURE(p.Sq);
      CAPTURE(shape.causal);
      const Outputs want = run_cpu(p, true);
      Outputs got = run_gpu(p, true, false, &want);
      check_backward(p, want, got);
      Tensor dq(DType::fp32, p.B, p.Sq, p.Hq, p.D);
      backward_gpu(p, want.lse, want.delta, dq, got.dk, got.dv, false, Dkdv::write_fp32);
      check_backward(p, want, got);
    }
}

TEST_CASE("gpu: rows with no key (keys after every query, and a window past the keys)") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(9);
  for (int32_t D : {64, 128}) {
    Problem p = random_problem(rng, DType::bf16, D, 2, 150);
    p.mask.causal = true;
    p.mask.kv_pos0 = 100; // rows at positions < 100 see nothing
    CAPTURE(D);
    check_all(p);
    p.mask.causal = false;
    p.mask.kv_pos0 = 0;
    p.mask.q_pos0 = 1000; // a window of 5 reaches no key
    p.mask.window_left = 5;
    check_all(p);
  }
}

TEST_CASE("gpu: segments (varlen), rows outside every segment untouched") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(11);
  for (int32_t D : {64, 96, 256})
    for (int causal = 0; causal < 2; ++causal) {
      Problem p = segments_problem(rng, D == 96 ? DType::fp16 : DType::bf16, D, causal == 1);
      p.segments = {{0, 130, 0, 130, 0, 0},   {130, 130, 130, 130, 0, 0}, {130, 400, 130, 400, 0, 0},
                    {410, 411, 410, 411, 0, 0}, {420, 700, 420, 700, 0, 0}};
      if (causal) p.segments.push_back({400, 410, 0, 300, 500, 0}); // queries after a long context
      CAPTURE(D);
      CAPTURE(causal);
      check_all(p);
    }
}

// Only the rows of a call's segments are its data: what lies between or after them may be anything,
// NaN included (the dilated plugin's gathered buffers leave unused slots unwritten). A tile that
// runs past a segment's end must not bring those rows into a product: 0 x NaN is NaN. (The Hopper
// kernels' copy engine zero-fills past the tensor's end only; this caught it.)
TEST_CASE("gpu: rows outside every segment hold NaN, tiles run past segment ends") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(43);
  for (int32_t D : {64, 80, 128})
    for (int causal = 0; causal < 2; ++causal) {
      Problem p = segments_problem(rng, DType::bf16, D, causal == 1);
      p.segments = {{0, 130, 0, 130, 0, 0}, {200, 400, 200, 400, 0, 0}, {500, 640, 500, 640, 0, 0}};
      for (int64_t i = 0; i < p.Sq; ++i) {
        if ((i >= 0 && i < 130) || (i >= 200 && i < 400) || (i >= 500 && i < 640)) continue;
        for (Tensor* t : {&p.q, &p.d_o})
          for (int64_t h = 0; h < p.Hq; ++h)
            for (int64_t d = 0; d < D; ++d) t->set(0, i, h, d, std::nan(""));
        for (Tensor* t : {&p.k, &p.v})
          for (int64_t h = 0; h < p.Hkv; ++h)
            for (int64_t d = 0; d < D; ++d) t->set(0, i, h, d, std::nan(""));
      }
      CAPTURE(D);
      CAPTURE(causal);
      check_all(p);
    }
}

TEST_CASE("gpu: block lists (64 and 128, shared and per head, random with masked edges)") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(13);
  for (int32_t D : {64, 128, 256})
    for (int bq : {64, 128})
      for (int bk : {64, 128}) {
        Problem p = random_problem(rng, DType::bf16, D, 2, 600);
        p.Sq = 300 + int64_t(rng() % 300);
        p.Skv = 300 + int64_t(rng() % 300);
        std::mt19937_64 data(rng());
        p.randomize(data);
        p.mask.causal = true;
        p.mask.q_pos0 = 200;
        const int32_t nq = int32_t((p.Sq + bq - 1) / bq), nk = int32_t((p.Skv + bk - 1) / bk);
        const int32_t heads = rng() % 2 ? p.Hq : 1;
        std::vector<BlockState> st(size_t(heads * nq * nk));
        for (auto& s : st) s = BlockState(rng() % 3);
        p.blocks = make_block_list(bq, bk, nq, nk, heads,
                                   [&](int32_t h, int32_t qb, int32_t kb) { return st[size_t((h * nq + qb) * nk + kb)]; });
        CAPTURE(D);
        CAPTURE(bq);
        CAPTURE(bk);
        CAPTURE(heads);
        check_all(p);
      }
}

// Long key columns cut in pieces (BlockList::pieces): a sink key block that every query block reads,
// and global query rows that read every key block, beside a causal band, so that the sink's group is
// split. The pieces add into accumulators (check_all), or add in the workspace's sums and are
// written (write_dkdv, in the dtype and in fp32), each checked against the reference.
TEST_CASE("gpu: block lists whose long key columns are cut in pieces, added and written") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(53);
  for (int32_t D : {64, 128, 256})
    for (int32_t bs : {64, 128})
      for (bool per_head : {false, true}) {
        const int64_t S = 2400 + int64_t(rng() % 200);
        Problem p = two_heads_problem(rng, DType::bf16, D, S, S);
        p.mask.causal = true;
        const int32_t n = int32_t((S + bs - 1) / bs), heads = per_head ? p.Hq : 1;
        p.blocks = make_block_list(bs, bs, n, n, heads, [&](int32_t h, int32_t qb, int32_t kb) {
          if (kb > qb) return BlockState::skip;
          if (kb == qb) return BlockState::masked;
          const bool global_row = qb < 1 + h; // per head: head 1 has two
          return kb == 0 || global_row || qb - kb <= 2 ? BlockState::full : BlockState::skip;
        });
        CAPTURE(D);
        CAPTURE(bs);
        CAPTURE(per_head);
        REQUIRE(p.blocks->num_split_groups > 0);
        check_all(p);
        const Outputs want = run_cpu(p, true);
        for (Dkdv out : {Dkdv::write, Dkdv::write_fp32}) {
          const DType t = out == Dkdv::write ? p.dtype : DType::fp32;
          Outputs got = run_gpu(p, true, false, &want);
          Tensor dq(DType::fp32, p.B, p.Sq, p.Hq, p.D);
          got.dk = Tensor(t, p.B, p.Skv, p.Hkv, p.D);
          got.dv = Tensor(t, p.B, p.Skv, p.Hkv, p.D);
          backward_gpu(p, want.lse, want.delta, dq, got.dk, got.dv, false, out);
          CAPTURE(name(t));
          check_backward(p, want, got);
        }
      }
}

TEST_CASE("gpu: long causal sequence (many tiles, the pipeline)") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(17);
  Problem p = two_heads_problem(rng, DType::bf16, 128, 2000, 2000);
  p.mask.causal = true;
  check_all(p);
}

// On Hopper, rows of at least 8192 keys (16384 causal) go to other forward configurations: at d96
// and d128 176-column key tiles (sm90 wide_serves), at d64 three consumers (three_serves); no shorter test
// reaches them. 130 rows, so the reference stays cheap; the causal rows sit at the end of the keys
// and see nearly all of them; the keys end inside a tile.
TEST_CASE("gpu: long rows of keys (the Hopper forward's wide tiles, three consumers), O in dtype and fp32") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(23);
  for (int32_t D : {64, 96, 128})
    for (DType dt : {DType::bf16, DType::fp16}) {
      Problem p = two_heads_problem(rng, dt, D, 130, 16384 + 77);
      CAPTURE(name(dt));
      CAPTURE(D);
      check_all(p); // full mask
      p.mask.causal = true;
      p.mask.q_pos0 = p.Skv - p.Sq - 3;
      check_all(p);
    }
}

// On Hopper the d64 backward takes 128-query steps in calls of at least 4096 query rows without a
// block list (sm90 launch_backward_sm90); no shorter test reaches them. Few keys keep the reference
// cheap: every step sees all of them (full mask), or the first steps are causal edges and a row of
// the last step lies past the end; and with segments, one of which ends inside a step whose other
// rows hold NaN.
TEST_CASE("gpu: the d64 backward's 128-query steps (4096 rows and more), causal, GQA, segments") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(47);
  for (DType dt : {DType::bf16, DType::fp16}) {
    Problem p = two_heads_problem(rng, dt, 64, 4096 + 77, 300);
    CAPTURE(name(dt));
    check_all(p); // full mask
    p.mask.causal = true;
    check_all(p); // rows 0 .. 299 see a causal edge, the rest every key
  }
  Problem p = two_heads_problem(rng, DType::bf16, 64, 4200, 4200);
  p.Hq = 4; // GQA 4:1
  std::mt19937_64 data(rng());
  p.randomize(data);
  p.mask.causal = true;
  // Rows 2300 .. 2349 of the last segment see no key (positions 1800 .. 1849 < 1850).
  p.segments = {{0, 2100, 0, 150, 2000, 0}, {2100, 2230, 2100, 2230, 0, 0}, {2300, 4200, 4000, 4200, 1800, 1850}};
  for (int64_t i = 2230; i < 2300; ++i) {
    for (int64_t h = 0; h < p.Hq; ++h)
      for (int64_t d = 0; d < p.D; ++d) {
        p.q.set(0, i, h, d, std::nan(""));
        p.d_o.set(0, i, h, d, std::nan(""));
      }
    for (int64_t d = 0; d < p.D; ++d) {
      p.k.set(0, i, 0, d, std::nan(""));
      p.v.set(0, i, 0, d, std::nan(""));
    }
  }
  check_all(p);
}

// On Hopper the d128 backward takes 80-query steps, dQ made transposed, in calls of at least 1024 query
// rows (4096 causal) without segments, a block list or a window (sm90 launch_backward_sm90). Rows:
// whole steps and a last one of 61 or 13; keys: two whole tiles and one of 44, so the last tile's
// products mask its missing keys; GQA 2:1. Causal: first with the rows' end 3 keys before the keys'
// (rows before 3876 see no key; the diagonal runs through steps 48 to 52, off their boundaries),
// then from position 0 (rows 0 .. 298 see a causal edge, the rest every key). Last, two batches of
// two kv heads with padded token rows.
TEST_CASE("gpu: the d128 backward's 80-query steps (1024 rows and more; causal, 4096)") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(80);
  for (DType dt : {DType::bf16, DType::fp16}) {
    CAPTURE(name(dt));
    Problem p = two_heads_problem(rng, dt, 128, 13 * 80 + 61, 300);
    check_all(p);
    p.mask.q_pos0 = 5000; // positions move, the mask stays full
    check_all(p);
    Problem c = two_heads_problem(rng, dt, 128, 52 * 80 + 13, 300);
    c.mask.causal = true;
    c.mask.q_pos0 = c.Skv - c.Sq - 3;
    check_all(c);
    c.mask.q_pos0 = 0;
    check_all(c);
    // Two batches of two kv heads (a step's dQ part lands in its own batch and head), token rows
    // padded by 8 elements.
    Problem g = two_heads_problem(rng, dt, 128, 12 * 80 + 77, 200);
    g.B = 2;
    g.Hq = 4;
    g.Hkv = 2;
    std::mt19937_64 data(rng());
    g.randomize(data, /*pad=*/8);
    check_all(g);
  }
}

// A forward call of p's rows against its keys [k0, k1), at their positions, O in fp32 into o and lse
// (host tensors of the device ones, for their layout).
static ForwardParams key_block_call(Problem& p, const DeviceProblem& dp, int64_t k0, int64_t k1, Tensor& o, Stats& lse,
                             const DeviceTensor& o_d, const DeviceStats& lse_d) {
  ForwardParams f = p.forward_params(o, lse, true);
  dp.point(p, f);
  const int64_t off = k0 * p.k.token_stride() * dtype_bytes(p.dtype);
  f.k.data = static_cast<uint8_t*>(f.k.data) + off;
  f.v.data = static_cast<uint8_t*>(f.v.data) + off;
  f.seqlen_kv = k1 - k0;
  f.mask.kv_pos0 = k0;
  f.o = o_d.ref;
  f.lse = lse_d.ref;
  return f;
}

// Rows against three key blocks of `block` keys, which the tests below attend one at a time: 190
// causal rows at positions 200.. (block 150), or 300 rows that see every key.
static Problem three_block_problem(std::mt19937_64& rng, int32_t D, bool causal = true, int64_t block = 150) {
  Problem p = random_problem(rng, DType::bf16, D, 2, 10);
  p.Sq = causal ? 190 : 300;
  p.Skv = 3 * block;
  std::mt19937_64 data(rng());
  p.randomize(data);
  p.mask.causal = causal;
  p.mask.q_pos0 = causal ? 200 : 0;
  return p;
}

// A merged forward's outputs downloaded and checked against the CPU's: O in the dtype (out_d) and
// in fp32 (acc_d) with their LSE (lse_d, lse32_d); the dtype O is the fp32 one rounded, bit for bit.
static void check_merged(const Problem& p, const Outputs& want, const DeviceTensor& out_d, const DeviceTensor& acc_d,
                         const DeviceStats& lse_d, const DeviceStats& lse32_d) {
  CUDA_OK(cudaDeviceSynchronize());
  Outputs got;
  got.o = Tensor(p.dtype, p.B, p.Sq, p.Hq, p.D);
  got.o32 = Tensor(DType::fp32, p.B, p.Sq, p.Hq, p.D);
  got.lse = got.lse32 = Stats(p.B, p.Hq, p.Sq);
  out_d.download(got.o);
  acc_d.download(got.o32);
  lse_d.download(got.lse);
  lse32_d.download(got.lse32);
  check_forward(p, want, got);
  long rounding_bad = 0;
  for (int64_t b = 0; b < p.B; ++b)
    for (int32_t h = 0; h < p.Hq; ++h)
      for (int64_t i = 0; i < p.Sq; ++i)
        for (int32_t d = 0; d < p.D; ++d)
          rounding_bad += got.o.get(b, i, h, d) != bf16_to_float(float_to_bf16(float(got.o32.get(b, i, h, d))));
  CHECK(rounding_bad == 0);
}

TEST_CASE("gpu: partial fp32 forward + merge + convert equals the CPU's") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(19);
  Problem p = three_block_problem(rng, 128);
  const Outputs want = run_cpu(p, false);
  DeviceProblem dp(p);
  Tensor acc(DType::fp32, p.B, p.Sq, p.Hq, p.D), part = acc;
  Stats lse_acc(p.B, p.Hq, p.Sq, -std::numeric_limits<float>::infinity()), lse_part(p.B, p.Hq, p.Sq);
  acc.fill(0);
  DeviceTensor acc_d(acc), part_d(part);
  DeviceStats lse_acc_d(lse_acc), lse_part_d(lse_part);
  const int64_t starts[] = {0, 150, 300, 450};
  for (int s = 0; s < 3; ++s) {
    forward_cuda(key_block_call(p, dp, starts[s], starts[s + 1], part, lse_part, part_d, lse_part_d), nullptr);
    MergeParams m;
    m.batch = p.B;
    m.heads = p.Hq;
    m.head_dim = p.D;
    m.seqlen = p.Sq;
    m.o_acc = acc_d.ref;
    m.lse_acc = lse_acc_d.ref;
    m.o_part = part_d.ref;
    m.lse_part = lse_part_d.ref;
    merge_partial_cuda(m, nullptr);
  }
  Tensor out(p.dtype, p.B, p.Sq, p.Hq, p.D);
  DeviceTensor out_d(out);
  out_d.buf->poison();
  ConvertParams cv;
  cv.dtype = p.dtype;
  cv.batch = p.B;
  cv.heads = p.Hq;
  cv.head_dim = p.D;
  cv.seqlen = p.Sq;
  cv.src = acc_d.ref;
  cv.dst = out_d.ref;
  convert_cuda(cv, nullptr);
  check_merged(p, want, out_d, acc_d, lse_acc_d, lse_acc_d);
}

// A ring's later calls on a row merge its partial in their epilogue (ForwardParams::o_prior): in
// place in fp32, the last straight into the output in the dtype. Three causal key blocks in two
// orders: the rows before block [300, 450) see none of it, so one order merges a prior into rows the
// call sees nothing of, the other gives rows no prior. Both kernel families; and full blocks of 1024
// keys, whose longer rows take the Hopper forward's other tile shapes, at head dims 64 to 256.
TEST_CASE("gpu: a forward merges a prior partial in its epilogue, in place and into the output") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(23);
  struct Case {
    const char* kernels;
    int32_t D;
    bool causal;
    int64_t block;
  };
  std::vector<Case> cases;
  for (const char* kernels : {"", "mma"})
    for (int32_t D : {64, 128}) cases.push_back({kernels, D, true, 150});
  for (int32_t D : {64, 128, 256}) cases.push_back({"", D, false, 1024});
  for (const Case& c : cases)
    for (const std::array<int, 3>& order : {std::array<int, 3>{0, 1, 2}, std::array<int, 3>{2, 0, 1}}) {
      if (*c.kernels) setenv("ATTNCORE_KERNELS", c.kernels, 1);
      else unsetenv("ATTNCORE_KERNELS");
      CAPTURE(c.kernels);
      CAPTURE(c.D);
      CAPTURE(c.causal);
      CAPTURE(order[0]);
      Problem p = three_block_problem(rng, c.D, c.causal, c.block);
      const Outputs want = run_cpu(p, false);
      DeviceProblem dp(p);
      Tensor acc(DType::fp32, p.B, p.Sq, p.Hq, p.D), out(p.dtype, p.B, p.Sq, p.Hq, p.D);
      Stats lse(p.B, p.Hq, p.Sq);
      const int64_t starts[] = {0, c.block, 2 * c.block, 3 * c.block};
      // The three calls, the last into fp32 (into_output false) or into the output in the dtype.
      const auto run = [&](DeviceTensor& acc_d, DeviceTensor& out_d, DeviceStats& lse_d, bool into_output) {
        for (int i = 0; i < 3; ++i) {
          const int blk = order[i];
          ForwardParams f = key_block_call(p, dp, starts[blk], starts[blk + 1], acc, lse, acc_d, lse_d);
          if (i > 0) {
            f.o_prior = acc_d.ref;
            f.lse_prior = lse_d.ref;
          }
          if (i == 2 && into_output) {
            f.o = out_d.ref;
            f.o_fp32 = false;
          }
          forward_cuda(f, nullptr);
        }
      };
      DeviceTensor acc_d(acc), out_d(out), acc2_d(acc), unused_d(out);
      DeviceStats lse_d(lse), lse2_d(lse);
      out_d.buf->poison();
      run(acc_d, unused_d, lse_d, false);
      run(acc2_d, out_d, lse2_d, true);
      check_merged(p, want, out_d, acc_d, lse2_d, lse_d);
    }
  unsetenv("ATTNCORE_KERNELS");
}

// The row kernels take a lane's 4 elements in one access where every row starts 4-element aligned,
// else one element at a time: padded rows (2 elements) take the second path. The last shape has
// rows past 2^17 (a grid of more than 4096 blocks).
TEST_CASE("gpu: delta, merge and convert on aligned and padded rows") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(61);
  const double inf = std::numeric_limits<double>::infinity();
  struct Shape {
    int64_t pad;
    int32_t D;
    int64_t B, S, H;
  };
  std::vector<Shape> shapes;
  for (int64_t pad : {0, 2})
    for (int32_t D : {64, 80, 96, 128, 256}) shapes.push_back({pad, D, 2, 37, 3});
  shapes.push_back({0, 64, 1, 10931, 12}); // 131172 rows
  for (const Shape& shape : shapes) {
    const int64_t pad = shape.pad, B = shape.B, S = shape.S, H = shape.H;
    const int32_t D = shape.D;
    CAPTURE(pad);
    CAPTURE(D);
    CAPTURE(S);
    Tensor o(DType::bf16, B, S, H, D, pad), o32(DType::fp32, B, S, H, D, pad), d_o(DType::bf16, B, S, H, D, pad);
    Tensor acc(DType::fp32, B, S, H, D, pad), part(DType::fp32, B, S, H, D, pad);
    for (Tensor* t : {&o, &o32, &d_o, &acc, &part}) t->fill_normal(rng, 1.0);
    Stats lse_acc(B, H, S), lse_part(B, H, S);
    std::uniform_real_distribution<float> u(-3.f, 3.f);
    for (size_t i = 0; i < lse_acc.v.size(); ++i) { // every fourth side empty, so some rows have neither
      lse_acc.v[i] = i % 4 == 1 ? -std::numeric_limits<float>::infinity() : u(rng);
      lse_part.v[i] = i % 3 == 1 ? -std::numeric_limits<float>::infinity() : u(rng);
    }
    DeviceTensor o_d(o), o32_d(o32), d_o_d(d_o), acc_d(acc), part_d(part);
    DeviceStats lse_acc_d(lse_acc), lse_part_d(lse_part);

    for (bool fp32 : {false, true}) {
      CAPTURE(fp32);
      Stats delta(B, H, S);
      DeviceStats delta_d(delta);
      delta_d.buf->poison();
      // A buffer cleared in the same pass (DeltaParams::zero): the size of an fp32 dQ accumulator
      // through the kernel's 16-byte stores; 4 bytes off both ways through the fallback.
      const size_t zero_bytes = size_t(B * S * H * D) * 4 - (fp32 ? 4 : 0);
      DeviceBuffer zero(zero_bytes + 8);
      zero.poison();
      char* zero_at = static_cast<char*>(zero.ptr) + (fp32 ? 4 : 0);
      compute_delta_cuda(DeltaParams{DType::bf16, int32_t(B), int32_t(H), D, S, fp32 ? o32_d.ref : o_d.ref, d_o_d.ref,
                                     fp32, delta_d.ref, zero_at, zero_bytes},
                         nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      delta_d.download(delta);
      std::vector<unsigned char> cleared(zero.bytes);
      CUDA_OK(cudaMemcpy(cleared.data(), zero.ptr, zero.bytes, cudaMemcpyDeviceToHost));
      const size_t first = fp32 ? 4 : 0, last = first + zero_bytes;
      long not_zero = 0, touched = 0;
      for (size_t i = 0; i < cleared.size(); ++i) {
        if (i >= first && i < last) not_zero += cleared[i] != 0;
        else touched += cleared[i] != 0xff;
      }
      CHECK(not_zero == 0);
      CHECK(touched == 0);
      long bad = 0;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < S; ++i) {
            double want = 0, mag = 0;
            for (int32_t d = 0; d < D; ++d) {
              const double x = (fp32 ? o32 : o).get(b, i, h, d) * d_o.get(b, i, h, d);
              want += x;
              mag += std::abs(x);
            }
            bad += !(std::abs(delta.at(b, h, i) - want) <= 1e-5 * mag + 1e-6);
          }
      CHECK(bad == 0);
    }

    MergeParams m{int32_t(B), int32_t(H), D, S, acc_d.ref, lse_acc_d.ref, part_d.ref, lse_part_d.ref};
    merge_partial_cuda(m, nullptr);
    Tensor merged = acc;
    Stats lse = lse_acc;
    CUDA_OK(cudaDeviceSynchronize());
    acc_d.download(merged);
    lse_acc_d.download(lse);
    long bad_o = 0, bad_lse = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < S; ++i) {
          const double la = lse_acc.at(b, h, i), lp = lse_part.at(b, h, i), hi = std::max(la, lp);
          const double l = hi == -inf ? -inf : hi + std::log(std::exp(la - hi) + std::exp(lp - hi));
          const double wa = la == -inf ? 0 : std::exp(la - l), wp = lp == -inf ? 0 : std::exp(lp - l);
          const double got_l = lse.at(b, h, i);
          bad_lse += l == -inf ? got_l != -inf : !(std::abs(got_l - l) <= 1e-5 * std::abs(l) + 1e-6);
          for (int32_t d = 0; d < D; ++d) {
            const double x = acc.get(b, i, h, d), y = part.get(b, i, h, d);
            const double err = std::abs(merged.get(b, i, h, d) - (wa * x + wp * y));
            bad_o += !(err <= 1e-5 * (std::abs(x) + std::abs(y)) + 1e-6);
          }
        }
    CHECK(bad_lse == 0);
    CHECK(bad_o == 0);
    // The last merge on its rows, rounded into the output as it goes (o_out): the same LSE, and O
    // the rounding of the fp32 merge.
    {
      DeviceTensor again_d(acc);
      DeviceStats lse_again_d(lse_acc);
      Tensor rounded(DType::bf16, B, S, H, D, pad);
      DeviceTensor rounded_d(rounded);
      rounded_d.buf->poison();
      MergeParams last{int32_t(B), int32_t(H), D, S, again_d.ref, lse_again_d.ref, part_d.ref, lse_part_d.ref};
      last.o_out = rounded_d.ref;
      last.out_dtype = DType::bf16;
      merge_partial_cuda(last, nullptr);
      Stats lse_again = lse_acc;
      CUDA_OK(cudaDeviceSynchronize());
      rounded_d.download(rounded);
      lse_again_d.download(lse_again);
      long bad_rounded = 0;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < S; ++i)
          for (int64_t h = 0; h < H; ++h)
            for (int32_t d = 0; d < D; ++d)
              bad_rounded += rounded.get(b, i, h, d) != double(bf16_to_float(float_to_bf16(float(merged.get(b, i, h, d)))));
      CHECK(bad_rounded == 0);
      CHECK(lse_again.v == lse.v);
    }

    // out's elements that are not merged + added (a [B, S, H, D] tensor or none) rounded to out's dtype
    const auto mismatches = [&](const Tensor& out, const Tensor* added) {
      long bad = 0;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < S; ++i)
          for (int64_t h = 0; h < H; ++h)
            for (int32_t d = 0; d < D; ++d) {
              const float x = float(merged.get(b, i, h, d)) + (added ? float(added->get(b, i, h, d)) : 0.f);
              bad += out.get(b, i, h, d) != (out.dtype == DType::bf16 ? double(bf16_to_float(float_to_bf16(x))) : double(x));
            }
      return bad;
    };
    for (DType dt : {DType::bf16, DType::fp32})
      for (bool add : {false, true}) {  // add: part summed in, in the same pass
        CAPTURE(add);
        Tensor out(dt, B, S, H, D, pad);
        DeviceTensor out_d(out);
        out_d.buf->poison();
        ConvertParams cv{dt, int32_t(B), int32_t(H), D, S, acc_d.ref, out_d.ref};
        if (add) cv.add = part_d.ref;
        convert_cuda(cv, nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        out_d.download(out);
        CHECK(mismatches(out, add ? &part : nullptr) == 0);
      }
    // fp32 in place, the added tensor laid out with another pitch (allgather's partials from a peer)
    Tensor sum = merged, other(DType::fp32, B, S, H, D, pad + 2);
    other.fill_normal(rng, 1.0);
    DeviceTensor sum_d(sum), other_d(other);
    ConvertParams in_place{DType::fp32, int32_t(B), int32_t(H), D, S, sum_d.ref, sum_d.ref};
    in_place.add = other_d.ref;
    convert_cuda(in_place, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    sum_d.download(sum);
    CHECK(mismatches(sum, &other) == 0);
    }
}

TEST_CASE("gpu: deterministic backward is bitwise reproducible") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(23);
  for (int32_t D : {64, 128}) {
    Problem p = random_problem(rng, DType::bf16, D, 4, 10);
    p.Sq = p.Skv = 777;
    std::mt19937_64 data(rng());
    p.randomize(data);
    p.mask.causal = true;
    const Outputs want = run_cpu(p, true);
    const Outputs a = run_gpu(p, true, true, &want);
    const Outputs b = run_gpu(p, true, true, &want);
    CAPTURE(D);
    CHECK(a.dq.bytes == b.dq.bytes);
    CHECK(a.dk.bytes == b.dk.bytes);
    CHECK(a.dv.bytes == b.dv.bytes);
    check_backward(p, want, a);
  }
}

TEST_CASE("gpu: unsupported calls throw attncore::Error with a one-line reason") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(29);
  Problem p = random_problem(rng, DType::bf16, 64, 1, 50);
  DeviceProblem dp(p);
  Tensor o(p.dtype, p.B, p.Sq, p.Hq, p.D);
  Stats lse(p.B, p.Hq, p.Sq);
  DeviceTensor o_d(o);
  DeviceStats lse_d(lse);
  ForwardParams f = p.forward_params(o, lse, false);
  dp.point(p, f);
  f.o = o_d.ref;
  f.lse = lse_d.ref;
  f.head_dim = 72;
  CHECK_THROWS_AS(forward_cuda(f, nullptr), Error);
  f.head_dim = 64;
  f.dtype = DType::fp32;
  CHECK_THROWS_AS(forward_cuda(f, nullptr), Error);
  f.dtype = DType::bf16;
  f.q.token_stride += 1;
  CHECK_THROWS_AS(forward_cuda(f, nullptr), Error);
}

TEST_CASE("gpu: dq_out holds the accumulator rounded, by the last CTA of a head and by the pass") {
  // Bit for bit what the accumulator holds after the call (which started from values of its own),
  // rounded: a head's rows rounded before its last adds were in would differ. In the kernel with
  // FP8 products (causal and full, 9 to 64 CTAs a head); by the pass after the call elsewhere (bf16
  // and fp16 at d128, d96 and d64, up to 64 CTAs a head, GQA, no workspace for the counters).
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(33);
  struct Case {
    DType dtype;
    int32_t D, Hq, Hkv;
    int64_t S;
    bool causal, workspace;
  };
  const Case cases[] = {{DType::bf16, 128, 2, 2, 700, true, true},       {DType::bf16, 128, 2, 2, 1100, false, true},
                        {DType::bf16, 128, 1, 1, 8192, false, true},     {DType::fp8_e4m3, 128, 2, 2, 1100, false, true},
                        {DType::fp8_e4m3, 128, 2, 2, 1500, true, true},  {DType::fp8_e4m3, 128, 1, 1, 8192, false, true},
                        {DType::fp16, 96, 2, 2, 500, false, true},
                        {DType::bf16, 64, 2, 2, 700, true, true},        {DType::bf16, 128, 4, 2, 700, false, true},
                        {DType::bf16, 128, 2, 2, 700, true, false}};
  for (const Case& c : cases) {
    std::mt19937_64 data(rng());
    Problem p = two_batches_problem(data, c.dtype, c.D, c.Hq, c.Hkv, c.S);
    p.mask.causal = c.causal;
    if (is_fp8(c.dtype) && std::string(native_kernels()) != "wgmma") continue; // (FP8 runs on Hopper)
    const int dtype = int(c.dtype);
    CAPTURE(dtype);
    CAPTURE(c.D);
    CAPTURE(c.Hq);
    CAPTURE(c.S);
    CAPTURE(c.causal);
    CAPTURE(c.workspace);
    const Outputs ref = run_gpu(p, false, false, nullptr);
    Stats delta(p.B, p.Hq, p.Sq);
    for (int64_t b = 0; b < p.B; ++b)  // (any delta serves: the check is the rounding, not the gradient)
      for (int64_t h = 0; h < p.Hq; ++h)
        for (int64_t i = 0; i < p.Sq; ++i) delta.at(b, h, i) = float(int64_t(data() % 2001) - 1000) / 1000.f;
    Tensor dq(DType::fp32, p.B, p.Sq, p.Hq, p.D), dk(DType::fp32, p.B, p.Skv, p.Hkv, p.D), dv = dk;
    dq.fill_normal(data, 1.0);
    Tensor dq_out(output_dtype(c.dtype), p.B, p.Sq, p.Hq, p.D);
    backward_gpu(p, ref.lse, delta, dq, dk, dv, false, Dkdv::add, c.workspace, {}, &dq_out);
    CHECK(differ_from_rounded(dq_out, dq) == 0);
  }
}

TEST_CASE("gpu: the last wave in parts: dK and dV summed over the parts, dQ rounded after the last part") {
  // The Hopper backward's tail tiles cut by rows (ATTNCORE_TAIL_SPLIT forces T tiles in P parts,
  // the tail spanning two (batch, head) lines where T passes a line's tiles), against the same call
  // whole: the sums differ only in the order of fp32 adds. Every way dK and dV go out, every head
  // dim's steps (64-, 80- and 128-query), GQA, the FP8 products with dQ rounded by the last CTA of
  // a head (which counts the parts); bf16 accumulators against the CPU too.
  REQUIRE(device_count() > 0);
  if (std::string(native_kernels()) != "wgmma") return;  // (the mma.sync kernels do not split)
  std::mt19937_64 rng(41);
  struct Case {
    DType dtype;
    int32_t D, Hq, Hkv;
    int64_t S;
    const char* split;
  };
  const Case cases[] = {{DType::bf16, 128, 3, 3, 700, "8,3"},  {DType::bf16, 64, 4, 2, 700, "8,2"},
                        {DType::fp16, 96, 2, 2, 500, "5,4"},   {DType::bf16, 256, 2, 2, 300, "6,2"},
                        {DType::bf16, 80, 2, 2, 400, "3,2"},   {DType::bf16, 128, 2, 2, 1100, "10,4"},
                        {DType::fp8_e4m3, 128, 2, 2, 1100, "10,3"}, {DType::bf16, 64, 1, 1, 4100, "40,5"}};
  const auto gap = [](const Tensor& a, const Tensor& b) {  // largest |a - b| over the largest |b|
    double most = 0, worst = 0;
    for (int64_t b0 = 0; b0 < b.B; ++b0)
      for (int64_t i = 0; i < b.S; ++i)
        for (int64_t h = 0; h < b.H; ++h)
          for (int64_t d = 0; d < b.D; ++d) {
            most = std::max(most, std::abs(b.get(b0, i, h, d)));
            const double x = std::abs(a.get(b0, i, h, d) - b.get(b0, i, h, d));
            worst = std::isfinite(x) ? std::max(worst, x) : INFINITY;
          }
    return most > 0 ? worst / most : worst;
  };
  for (const Case& c : cases) {
    std::mt19937_64 data(rng());
    Problem p = two_batches_problem(data, c.dtype, c.D, c.Hq, c.Hkv, c.S);
    const int dtype = int(c.dtype);
    CAPTURE(dtype);
    CAPTURE(c.D);
    CAPTURE(c.S);
    CAPTURE(c.split);
    const bool fp8 = is_fp8(c.dtype), cpu = !fp8 && c.S < 4096;
    const Outputs want = cpu ? run_cpu(p, true) : run_gpu(p, true, false, nullptr);
    for (const Dkdv out : {Dkdv::add, Dkdv::write, Dkdv::write_fp32}) {
      const int mode = int(out);
      CAPTURE(mode);
      const DType grads = out == Dkdv::write ? output_dtype(c.dtype) : DType::fp32;
      Tensor dk[2], dv[2], dq[2], dq_out[2];
      for (int split = 0; split < 2; ++split) {
        ScopedEnv forced("ATTNCORE_TAIL_SPLIT");
        forced.set(split ? c.split : "0");
        dq[split] = Tensor(DType::fp32, p.B, p.Sq, p.Hq, p.D);
        dk[split] = dv[split] = Tensor(grads, p.B, p.Skv, p.Hkv, p.D);
        dq_out[split] = Tensor(output_dtype(c.dtype), p.B, p.Sq, p.Hq, p.D);
        backward_gpu(p, want.lse, want.delta, dq[split], dk[split], dv[split], false, out, true, {}, &dq_out[split]);
        CHECK(differ_from_rounded(dq_out[split], dq[split]) == 0);
      }
      // A rounding's last bit, or the order of fp32 adds; with FP8 products a part scales P^T by the
      // largest P of its own rows (scale_p_rows), so dV differs at e4m3's rounding (8e-4 measured).
      const double tol = out == Dkdv::write ? 1e-2 : 1e-5;
      CHECK(gap(dk[1], dk[0]) < tol);
      CHECK(gap(dv[1], dv[0]) < (fp8 ? 1e-2 : tol));
      CHECK(gap(dq[1], dq[0]) < 1e-5);
      if (cpu && out == Dkdv::add) {
        Outputs got = want;
        got.dq = dq[1];
        got.dk = dk[1];
        got.dv = dv[1];
        check_backward(p, want, got);
      }
    }
  }
}

TEST_CASE("gpu: write_dkdv writes dK and dV in dtype, the accumulators rounded, zeros for unseen keys") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(41);
  for (const char* kernels : {"", "mma"}) {
    if (*kernels) setenv("ATTNCORE_KERNELS", kernels, 1);
    for (DType dt : {DType::bf16, DType::fp16})
      for (int32_t D : {64, 128, 256}) {
        // Causal with more keys than queries: the last keys are after every query.
        Problem p = random_problem(rng, dt, D, 2, 300);
        p.Skv = p.Sq + 50 + int64_t(rng() % 100);
        std::mt19937_64 data(rng());
        p.randomize(data);
        p.mask.causal = true;
        const Outputs want = run_cpu(p, true);
        const Outputs acc = run_gpu(p, true, false, &want);
        CAPTURE(kernels);
        CAPTURE(name(dt));
        CAPTURE(D);
        check_write_dkdv(p, want, acc);
        p.blocks = block_list_from_mask(p.mask, p.Sq, p.Skv, 128, 128);
        const Outputs acc_blocks = run_gpu(p, true, false, &want);
        check_write_dkdv(p, want, acc_blocks);
      }
    unsetenv("ATTNCORE_KERNELS");
  }
}

// dk_add and dv_add: a ring's owner of a block adds the shares the other ranks made of some of its
// keys in the call that writes them. On keys [begin, end) the written values must be the fp32 sum
// of the accumulator mode's dK or dV and the share, rounded once, bit for bit; elsewhere as without.
TEST_CASE("gpu: write_dkdv adds fp32 shares of a range of keys before it writes, rounded once") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(43);
  for (const char* kernels : {"", "mma"}) {
    if (*kernels) setenv("ATTNCORE_KERNELS", kernels, 1);
    for (DType dt : {DType::bf16, DType::fp16})
      for (int32_t D : {64, 128}) {
        Problem p = random_problem(rng, dt, D, 2, 300);
        std::mt19937_64 data(rng());
        p.randomize(data);
        p.mask.causal = true;
        const Outputs want = run_cpu(p, true);
        const Outputs acc = run_gpu(p, true, false, &want);
        Tensor share_k(DType::fp32, p.B, p.Skv, p.Hkv, p.D), share_v = share_k;
        fill_normal(share_k, data, 0.05f);
        fill_normal(share_v, data, 0.05f);
        const Shares shares{&share_k, &share_v, p.Skv / 3, p.Skv - 7};
        Tensor dq32(DType::fp32, p.B, p.Sq, p.Hq, p.D), dk(dt, p.B, p.Skv, p.Hkv, p.D), dv = dk;
        backward_gpu(p, want.lse, want.delta, dq32, dk, dv, false, Dkdv::write, true, shares);
        CAPTURE(kernels);
        CAPTURE(name(dt));
        CAPTURE(D);
        const int64_t differ = differ_from_shared(dk, dv, acc.dk, acc.dv, share_k, share_v, shares.begin, shares.end);
        CHECK(differ == 0);
      }
    unsetenv("ATTNCORE_KERNELS");
  }
}

// write_dkdv in fp32 with segments that share no keys (dilated's patterns). Each key of a segment
// gets one add into zero in accumulator mode, so the written values are the accumulators' bit for
// bit; keys in no segment keep what was there (the poison). The first segment ends inside a key tile
// whose other rows belong to the gap and the next segment: a tile must not write past its segment.
TEST_CASE("gpu: write_dkdv in fp32 with segments writes every key of a segment and no other") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(43);
  for (const char* kernels : {"", "mma"}) {
    if (*kernels) setenv("ATTNCORE_KERNELS", kernels, 1);
    for (int32_t D : {64, 128, 256}) {
      Problem p = random_problem(rng, DType::bf16, D, 1 + int(rng() % 2), 300);
      p.Sq = p.Skv = 700;
      std::mt19937_64 data(rng());
      p.randomize(data);
      p.mask.causal = true;
      constexpr int32_t a = 200, gap = 37, b = 450;  // keys [a, a + gap) are in no segment
      p.segments = {{0, a, 0, a, 0, 0}, {a, b, a + gap, b, a, a + gap}, {b, 700, b, 700, b, b}};
      const Outputs want = run_cpu(p, true);
      const Outputs acc = run_gpu(p, true, false, &want);
      Tensor dq(DType::fp32, p.B, p.Sq, p.Hq, p.D), dk(DType::fp32, p.B, p.Skv, p.Hkv, p.D), dv(DType::fp32, p.B, p.Skv, p.Hkv, p.D);
      backward_gpu(p, want.lse, want.delta, dq, dk, dv, false, Dkdv::write_fp32);
      CAPTURE(kernels);
      CAPTURE(D);
      int64_t differ = 0, gap_written = 0;
      for (int64_t bb = 0; bb < p.B; ++bb)
        for (int64_t j = 0; j < p.Skv; ++j)
          for (int32_t h = 0; h < p.Hkv; ++h)
            for (int32_t d = 0; d < p.D; ++d) {
              const double k = dk.get(bb, j, h, d), v = dv.get(bb, j, h, d);
              if (j >= a && j < a + gap) gap_written += !std::isnan(k) || !std::isnan(v);
              else differ += !(k == acc.dk.get(bb, j, h, d)) || !(v == acc.dv.get(bb, j, h, d));
            }
      CHECK(differ == 0);
      CHECK(gap_written == 0);
      check_backward(p, want, acc);  // and the accumulators are right
    }
    unsetenv("ATTNCORE_KERNELS");
  }
}

// The Hopper backward, and on sm_90a the mma.sync backward up to D = 128, hand dQ to the copy engine
// where the accumulator's rows are 16-byte aligned (every other test); rows 8 bytes apart from 16
// take atomics instead (the Hopper path's reducer warps; the mma.sync step's own, in its dV, dQ, dK
// order). dK and dV with such rows: float2 atomics, only 8-byte aligned.
TEST_CASE("gpu: accumulators the copy engine cannot address (token stride 2 floats past 16 bytes)") {
  REQUIRE(device_count() > 0);
  std::mt19937_64 rng(43);
  for (const char* kernels : {"", "mma"}) // the Hopper kernels, where the device has them, and mma.sync
    for (int padded = 0; padded < 2; ++padded) // 0: dQ, 1: dK and dV
      for (int32_t D : {64, 80, 96, 128, 256}) {
        if (*kernels) setenv("ATTNCORE_KERNELS", kernels, 1);
        else unsetenv("ATTNCORE_KERNELS");
        // Rows that see one key only (Sq = 1 causal) make dQ and dK zero up to rounding, where no
        // relative norm means anything: at least 64 rows, each seeing at least as many keys.
        Problem p = random_problem(rng, DType::bf16, D, 2, 300);
        p.Sq = 64 + int64_t(rng() % 237);
        p.Skv = p.Sq + int64_t(rng() % 64);
        std::mt19937_64 data(rng());
        p.randomize(data);
        p.mask.causal = true;
        Outputs want = run_cpu(p, true);
        Outputs got = want;
        got.dq = Tensor(DType::fp32, p.B, p.Sq, p.Hq, p.D, /*pad=*/padded == 0 ? 2 : 0);
        got.dk = Tensor(DType::fp32, p.B, p.Skv, p.Hkv, p.D, /*pad=*/padded == 1 ? 2 : 0);
        got.dv = Tensor(DType::fp32, p.B, p.Skv, p.Hkv, p.D, /*pad=*/padded == 1 ? 2 : 0);
        backward_gpu(p, want.lse, want.delta, got.dq, got.dk, got.dv, false, Dkdv::add);
        CAPTURE(kernels);
        CAPTURE(padded);
        CAPTURE(D);
        check_backward(p, want, got);
      }
  unsetenv("ATTNCORE_KERNELS");
}

// On a Hopper device the tests above run the wgmma kernels (sm90/: the forward, and the backward
// up to head dim 128 unless deterministic); this one keeps the portable mma.sync kernels covered
// there too. Elsewhere it repeats what the tests above check.
TEST_CASE("gpu: the mma.sync kernels where the Hopper path would run (ATTNCORE_KERNELS=mma)") {
  REQUIRE(device_count() > 0);
  setenv("ATTNCORE_KERNELS", "mma", 1);
  std::mt19937_64 rng(37);
  for (DType dt : {DType::bf16, DType::fp16})
    for (int32_t D : {64, 80, 96, 128, 256}) {
      Problem p = random_problem(rng, dt, D, 1 + int(rng() % 3), 300);
      p.mask.causal = true;
      p.mask.q_pos0 = int64_t(rng() % 64);
      CAPTURE(name(dt));
      CAPTURE(D);
      check_all(p);
    }
  Problem p = random_problem(rng, DType::bf16, 128, 2, 500);
  p.mask.causal = true;
  p.blocks = block_list_from_mask(p.mask, p.Sq, p.Skv, 64, 64);
  check_all(p);
  unsetenv("ATTNCORE_KERNELS");
}

// The mma.sync kernels take, per head dim, the first of their shapes whose shared memory the device
// allows (forward.cuh, backward.cuh); ATTNCORE_MAX_SMEM lowers that figure, so that this device runs
// what smaller ones would:
//  - an sm_80's 163 KB: one-stage dK/dV at D = 128 and 256, the 4-warp D = 256 forward;
//  - the 99 KB of an sm_86, sm_89 or sm_120: 32-key forward tiles at D = 128, 64-key dK/dV CTAs at
//    D = 80-128 (two stages at D = 80 and 96, one at 128), 64-row dQ CTAs at D = 128. There D = 256's
//    backward is refused in one line before any launch, its gradients left as they were.
TEST_CASE("gpu: the mma.sync kernels in an sm_80's and an sm_86's shared memory (ATTNCORE_MAX_SMEM)") {
  REQUIRE(device_count() > 0);
  setenv("ATTNCORE_KERNELS", "mma", 1);
  std::mt19937_64 rng(47);
  for (const char* cap : {"166912", "101376"}) {
    setenv("ATTNCORE_MAX_SMEM", cap, 1);
    const bool small = std::string(cap) == "101376";
    for (int32_t D : {64, 80, 96, 128, 256}) {
      CAPTURE(cap);
      CAPTURE(D);
      const bool grads = !(small && D == 256);
      Problem p = random_problem(rng, D % 32 ? DType::fp16 : DType::bf16, D, 1 + int(rng() % 3), 400);
      p.mask.causal = true;
      p.mask.q_pos0 = int64_t(rng() % 64);
      check_all(p, grads);
      p.blocks = block_list_from_mask(p.mask, p.Sq, p.Skv, 64, 128);
      check_all(p, grads);
      Problem s = segments_problem(rng, DType::bf16, D, true);
      s.segments = {{0, 130, 0, 130, 0, 0}, {130, 400, 130, 400, 0, 0}, {400, 410, 0, 300, 500, 0}};
      check_all(s, grads);
      if (grads) continue;
      const Outputs want = run_cpu(p, true);
      Tensor dq(DType::fp32, p.B, p.Sq, p.Hq, p.D), dk(DType::fp32, p.B, p.Skv, p.Hkv, p.D),
          dv(DType::fp32, p.B, p.Skv, p.Hkv, p.D);
      for (bool deterministic : {false, true}) {
        try {
          backward_gpu(p, want.lse, want.delta, dq, dk, dv, deterministic, Dkdv::add);
          FAIL("the D = 256 backward ran in 99 KB");
        } catch (const Error& e) {
          const std::string what = e.what();
          CHECK(what.find("head dim 256") != std::string::npos);
          CHECK(what.find("101376") != std::string::npos);
          CHECK(what.find('\n') == std::string::npos);
        }
      }
      int64_t touched = 0; // the accumulators started at zero
      for (const Tensor* t : {&dq, &dk, &dv})
        for (uint8_t x : t->bytes) touched += x != 0;
      CHECK(touched == 0);
    }
  }
  unsetenv("ATTNCORE_MAX_SMEM");
  unsetenv("ATTNCORE_KERNELS");
}
