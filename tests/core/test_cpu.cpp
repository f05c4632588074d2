// attncore CPU reference against naive float64 attention, feature by feature and combined.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <string>
#include <thread>
#include <vector>

#include "attncore/cpu.h"
#include "attncore/cudnn.h"
#include "problem.h"

using namespace coretest;

namespace {

constexpr float kPoison = 777.f; // written into outputs first: rows a call must not touch keep it
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <class Acc> Outputs run(Problem& p, bool grads) { return cpu_outputs<Acc>(p, grads, DeltaFrom::o_fp32, kPoison); }

double output_tolerance(DType t, bool acc_double) {
  switch (t) {
  case DType::bf16: return 6e-3; // one rounding to 8 significant bits
  case DType::fp16: return 1.5e-3;
  default: return acc_double ? 1e-6 : 3e-5;
  }
}

// Everything the CPU computes for `p`, against the naive float64 attention.
template <class Acc> void check_against_naive(Problem& p, bool grads) {
  constexpr bool kDouble = std::is_same_v<Acc, double>;
  INFO("Acc=", std::string(kDouble ? "double" : "float"));
  const Naive n = naive_attention(p, grads);
  const Outputs r = run<Acc>(p, grads);
  const double tol32 = kDouble ? 1e-6 : 3e-5, tol_lse = kDouble ? 1e-6 : 1e-5;
  const double tol_grad = kDouble ? 2e-5 : 2e-4;
  ErrorStat eo, eo32, edq, edk, edv, edelta;
  int lse_bad = 0, untouched_bad = 0, empty_rows = 0;
  for (int64_t b = 0; b < p.B; ++b)
    for (int32_t h = 0; h < p.Hq; ++h)
      for (int64_t i = 0; i < p.Sq; ++i) {
        if (!p.row_covered(i)) { // rows outside every segment stay as they were
          untouched_bad += r.lse.at(b, h, i) != kPoison || r.lse32.at(b, h, i) != kPoison ||
                           r.o32.get(b, i, h, 0) != kPoison;
          continue;
        }
        const double L = n.L(b, h, i);
        if (std::isinf(L)) {
          ++empty_rows;
          lse_bad += r.lse.at(b, h, i) != kNegInf || r.lse32.at(b, h, i) != kNegInf;
        } else {
          lse_bad += std::abs(r.lse.at(b, h, i) - L) > tol_lse * (1 + std::abs(L));
          lse_bad += std::abs(r.lse32.at(b, h, i) - L) > tol_lse * (1 + std::abs(L));
        }
        for (int32_t d = 0; d < p.D; ++d) {
          eo.add(r.o.get(b, i, h, d), n.O(b, i, h, d));
          eo32.add(r.o32.get(b, i, h, d), n.O(b, i, h, d));
          if (grads) edq.add(r.dq.get(b, i, h, d), n.dQ(b, i, h, d));
        }
        if (grads) edelta.add(r.delta.at(b, h, i), n.Dl(b, h, i));
      }
  if (grads)
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t j = 0; j < p.Skv; ++j)
        for (int32_t h = 0; h < p.Hkv; ++h)
          for (int32_t d = 0; d < p.D; ++d) {
            edk.add(r.dk.get(b, j, h, d), n.dK(b, j, h, d));
            edv.add(r.dv.get(b, j, h, d), n.dV(b, j, h, d));
          }
  INFO("empty rows: ", empty_rows);
  CHECK(lse_bad == 0);
  CHECK(untouched_bad == 0);
  CHECK(eo.finite);
  CHECK(eo32.finite);
  CHECK(eo.rel() < output_tolerance(output_dtype(p.dtype), kDouble));
  CHECK(eo32.rel() < tol32);
  if (grads) {
    CHECK(edq.finite);
    CHECK(edk.finite);
    CHECK(edv.finite);
    CHECK(edelta.rel() < tol32 * 10);
    CHECK(edq.rel(1e-2) < tol_grad);
    CHECK(edk.rel(1e-2) < tol_grad);
    CHECK(edv.rel(1e-2) < tol_grad);
  }
}

void check_both(Problem& p, bool grads = true) {
  check_against_naive<float>(p, grads);
  check_against_naive<double>(p, grads);
}

struct Case {
  const char* name;
  DType dtype;
  int32_t B, Hq, Hkv, D;
  int64_t Sq, Skv;
  bool causal;
  int64_t wl, wr, q_pos0, kv_pos0;
};

Problem make(const Case& c, uint64_t seed, int64_t pad = 0) {
  Problem p;
  p.dtype = c.dtype;
  p.B = c.B;
  p.Hq = c.Hq;
  p.Hkv = c.Hkv;
  p.D = c.D;
  p.Sq = c.Sq;
  p.Skv = c.Skv;
  p.mask.causal = c.causal;
  p.mask.window_left = c.wl;
  p.mask.window_right = c.wr;
  p.mask.q_pos0 = c.q_pos0;
  p.mask.kv_pos0 = c.kv_pos0;
  std::mt19937_64 rng(seed);
  p.randomize(rng, pad);
  return p;
}

// Each case a subcase, checked both ways, the seeds counted up from `seed`.
template <size_t N> void check_cases(const Case (&cases)[N], uint64_t seed) {
  for (const Case& c : cases) {
    SUBCASE(c.name) {
      Problem p = make(c, seed);
      check_both(p);
    }
    ++seed;
  }
}

} // namespace

TEST_CASE("bf16 and fp16 conversions round to nearest even") {
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(float_to_bf16(1.00390625f) == 0x3f80); // 1 + 2^-8: a tie, to the even 1.0
  CHECK(float_to_bf16(1.01171875f) == 0x3f82); // 1 + 3 * 2^-8: a tie, to the even 1 + 2^-6
  CHECK(float_to_bf16(-2.0f) == 0xc000);
  CHECK(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(float_to_fp16(1.0f) == 0x3c00);
  CHECK(float_to_fp16(65504.f) == 0x7bff);
  CHECK(float_to_fp16(65519.f) == 0x7bff);
  CHECK(float_to_fp16(65520.f) == 0x7c00); // a tie between the largest half and 2^16: to inf
  CHECK(float_to_fp16(std::ldexp(1.f, -24)) == 0x0001);
  CHECK(float_to_fp16(std::ldexp(1.f, -25)) == 0x0000);
  CHECK(float_to_fp16(std::ldexp(1.5f, -25)) == 0x0001);
  CHECK(float_to_fp16(std::ldexp(1.f, -14)) == 0x0400);
  CHECK(float_to_fp16(1.f + std::ldexp(1.f, -11)) == 0x3c00);
  CHECK(float_to_fp16(1.f + 3 * std::ldexp(1.f, -11)) == 0x3c02);
  CHECK(float_to_fp16(-2.f) == 0xc000);
  CHECK(std::isnan(fp16_to_float(float_to_fp16(std::numeric_limits<float>::quiet_NaN()))));
  int bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f16 = fp16_to_float(uint16_t(h)), b16 = bf16_to_float(uint16_t(h));
    if (!std::isnan(f16)) bad += float_to_fp16(f16) != h;
    if (!std::isnan(b16)) bad += float_to_bf16(b16) != h;
  }
  CHECK(bad == 0);
}

TEST_CASE("cpu forward and backward match naive float64 attention") {
  using D = DType;
  const Case cases[] = {
      {"plain", D::bf16, 2, 2, 2, 32, 37, 45, false, -1, -1, 0, 0},
      {"plain fp16", D::fp16, 1, 3, 3, 64, 20, 81, false, -1, -1, 0, 0},
      {"plain fp32, odd head dim", D::fp32, 1, 2, 2, 19, 33, 29, false, -1, -1, 0, 0},
      {"causal square", D::bf16, 1, 2, 1, 40, 70, 70, true, -1, -1, 0, 0},
      {"causal, queries after keys (a remote block: all visible)", D::bf16, 1, 2, 2, 16, 30, 40, true, -1, -1, 100, 0},
      {"causal, keys after queries (a skipped block: all empty)", D::fp16, 1, 1, 1, 16, 20, 30, true, -1, -1, 0, 100},
      {"causal, diagonal inside the block", D::bf16, 2, 1, 1, 16, 50, 90, true, -1, -1, 40, 0},
      {"causal, first rows see nothing", D::bf16, 1, 2, 2, 32, 40, 40, true, -1, -1, 0, 10},
      {"window left", D::bf16, 1, 2, 2, 32, 90, 90, false, 10, -1, 0, 0},
      {"window left and right", D::fp16, 1, 2, 2, 32, 90, 100, false, 7, 5, 0, 0},
      {"window right only", D::bf16, 1, 1, 1, 32, 70, 70, false, -1, 3, 0, 0},
      {"causal and window", D::bf16, 1, 2, 2, 32, 150, 150, true, 20, -1, 0, 0},
      {"window zero (self only)", D::bf16, 1, 1, 1, 16, 40, 40, true, 0, 0, 0, 0},
      {"window with offsets, some rows empty", D::fp16, 1, 2, 1, 48, 60, 50, false, 5, 5, 0, 30},
  };
  check_cases(cases, 1);
}

TEST_CASE("cpu: FP8 inputs are read times their tensors' descales, outputs written in bf16") {
  using D = DType;
  const Case cases[] = {
      {"e4m3 causal, GQA", D::fp8_e4m3, 1, 4, 2, 32, 45, 45, true, -1, -1, 0, 0},
      {"e5m2 full", D::fp8_e5m2, 2, 2, 2, 64, 30, 50, false, -1, -1, 0, 0},
      {"e4m3 window", D::fp8_e4m3, 1, 2, 1, 16, 80, 80, false, 9, 3, 0, 0},
  };
  check_cases(cases, 700);
  CHECK(check_supported_cpu(DType::fp8_e4m3, 64).empty());
  for (int d : {64, 128, 256}) CHECK(check_supported(DType::fp8_e4m3, d).empty());
  CHECK(check_supported_forward(DType::fp8_e4m3, 64).empty());
  CHECK(check_supported(DType::fp8_e4m3, 80) ==
        "attncore: head_dim 80 is not supported by the FP8 kernels; supported: 64, 128, 256");
  CHECK(check_supported_forward(DType::fp8_e5m2, 128) ==
        "attncore: FP8 on CUDA takes e4m3 (e5m2 runs on the CPU path)");
  CHECK(check_supported_forward(DType::bf16, 80).empty());
}

TEST_CASE("cpu: the hybrid FP8 recipe reads dO in e5m2 beside e4m3 Q, K and V") {
  for (bool causal : {true, false}) {
    CAPTURE(causal);
    Problem p = make({"hybrid", DType::fp8_e4m3, 2, 4, 2, 32, 45, 45, causal, -1, -1, 0, 0}, 731);
    p.dtype_do = DType::fp8_e5m2;
    std::mt19937_64 rng(732);
    p.randomize(rng);
    REQUIRE(p.d_o.dtype == DType::fp8_e5m2);
    check_both(p);  // the naive reference reads dO as e5m2: a reading as e4m3 would be far off
  }
  CHECK(check_supported_do(DType::fp8_e4m3, DType::fp8_e5m2).empty());
  CHECK(check_supported_do(DType::bf16, DType::invalid).empty());
  CHECK(check_supported_do(DType::fp8_e5m2, DType::fp8_e5m2).empty());
  CHECK(check_supported_do(DType::bf16, DType::fp8_e5m2) ==
        "attncore: dO in another type than Q, K and V is taken only as fp8_e5m2 beside fp8_e4m3 inputs");
  Problem bad = make({"bf16 with e5m2 dO", DType::bf16, 1, 1, 1, 16, 8, 8, false, -1, -1, 0, 0}, 733);
  Stats lse(1, 1, 8), delta(1, 1, 8);
  Tensor dq(DType::fp32, 1, 8, 1, 16), dk(DType::fp32, 1, 8, 1, 16), dv(DType::fp32, 1, 8, 1, 16);
  BackwardParams g = bad.backward_params(lse, delta, dq, dk, dv);
  g.dtype_do = DType::fp8_e5m2;
  CHECK_THROWS_WITH(cpu::backward<float>(g),
                    "attncore: dO in another type than Q, K and V is taken only as fp8_e5m2 beside fp8_e4m3 inputs");
}

TEST_CASE("cpu: strided tensors (token stride larger than heads x dim)") {
  Problem p = make({"strided", DType::bf16, 2, 4, 2, 32, 41, 41, true, -1, -1, 0, 0}, 7, /*pad=*/24);
  check_both(p);
}

TEST_CASE("cpu: GQA ratios 1 to 8") {
  for (int ratio = 1; ratio <= 8; ++ratio) {
    CAPTURE(ratio);
    Problem p = make({"gqa", DType::bf16, 1, 2 * ratio, 2, 16, 33, 47, ratio % 2 == 0, -1, -1, 14, 0},
                     100 + uint64_t(ratio));
    check_both(p);
  }
}

TEST_CASE("cpu: segments (packed variable length)") {
  for (int causal = 0; causal < 2; ++causal) {
    CAPTURE(causal);
    Problem p = make({"varlen", DType::bf16, 1, 2, 1, 32, 100, 100, causal == 1, -1, -1, 0, 0}, 200);
    p.segments = {
        {0, 30, 0, 30, 0, 0},
        {30, 30, 30, 30, 0, 0},  // an empty sequence
        {30, 71, 30, 71, 0, 0},
        {75, 100, 75, 100, 0, 0}, // rows 71..74 belong to no segment and stay untouched
    };
    check_both(p);
    SUBCASE("queries attend another range of keys at other positions, with a window") {
      p.mask.window_left = 9;
      p.segments = {{0, 20, 50, 90, 100, 60}, {20, 60, 0, 50, 0, 0}};
      check_both(p);
    }
  }
}

TEST_CASE("cpu: block lists (64 and 128, shared and per head, with masked edges)") {
  for (int bq : {64, 128})
    for (int bk : {64, 128})
      for (int per_head = 0; per_head < 2; ++per_head) {
        CAPTURE(bq);
        CAPTURE(bk);
        CAPTURE(per_head);
        Problem p = make({"blocks", DType::bf16, 1, 2, 1, 16, 200, 260, true, 150, -1, 60, 0},
                         uint64_t(300 + bq + bk + per_head));
        const int32_t nq = int32_t((p.Sq + bq - 1) / bq), nk = int32_t((p.Skv + bk - 1) / bk);
        std::mt19937_64 rng(uint64_t(bq * 7 + bk + per_head));
        std::vector<BlockState> st(size_t(2 * nq * nk));
        for (auto& s : st) s = BlockState(rng() % 3);
        p.blocks = make_block_list(bq, bk, nq, nk, per_head ? p.Hq : 1,
                                   [&](int32_t h, int32_t qb, int32_t kb) { return st[size_t((h * nq + qb) * nk + kb)]; });
        check_both(p);
      }
}

// How make_block_list shares out key columns for the CUDA backward (BlockList::pieces): every key
// group's query blocks cut into consecutive ranges; a group far above the mean (a sink every query
// block reads) in several pieces sharing one slot, the others whole with slot -1; a causal triangle,
// whose longest column is twice the mean, left whole.
TEST_CASE("cpu: block lists cut long key columns in pieces, and only those") {
  for (int32_t bs : {64, 128}) {
    const int32_t n = 4096 / bs, cols = 128 / bs;
    const BlockListData sink = make_block_list(bs, bs, n, n, 1, [](int32_t, int32_t qb, int32_t kb) {
      return kb == 0 || (kb <= qb && qb - kb <= 2) ? BlockState::full : BlockState::skip;
    });
    CAPTURE(bs);
    REQUIRE(sink.pieces.size() % 4 == 0);
    const int32_t groups = n / cols;
    int32_t split_pieces = 0, expect_group = 0, expect_begin = 0;
    for (size_t i = 0; i < sink.pieces.size(); i += 4) {
      const int32_t g = sink.pieces[i], begin = sink.pieces[i + 1], end = sink.pieces[i + 2], slot = sink.pieces[i + 3];
      if (begin == 0) { // a group's first piece: groups in order
        CHECK(expect_begin == 0);
        CHECK(g == expect_group++);
      }
      CHECK(g == expect_group - 1);
      CHECK(begin == expect_begin);
      CHECK(end > begin);
      expect_begin = end == n ? 0 : end;
      CHECK(slot == (g == 0 ? 0 : -1)); // only the sink's group is split
      split_pieces += slot == 0;
    }
    CHECK(expect_group == groups);
    CHECK(sink.num_split_groups == 1);
    // About the mean a piece: the sink's n entries (plus its band) in n / 8 or more pieces.
    CHECK(split_pieces >= n / (8 * cols));
    CHECK(sink.view().num_pieces == int32_t(sink.pieces.size() / 4));
    // The pieces' own CSC holds every entry once, each column's inside its piece's query blocks.
    const int32_t np = int32_t(sink.pieces.size() / 4);
    REQUIRE(sink.piece_col_ptr.size() == size_t(np * cols + 1));
    CHECK(sink.piece_q_block.size() == sink.q_block.size());
    int64_t outside = 0;
    for (int32_t i = 0; i < np; ++i)
      for (int32_t c = 0; c < cols; ++c)
        for (int32_t e = sink.piece_col_ptr[size_t(i * cols + c)]; e < sink.piece_col_ptr[size_t(i * cols + c + 1)]; ++e)
          outside += sink.piece_q_block[size_t(e)] < sink.pieces[4 * size_t(i) + 1] ||
                     sink.piece_q_block[size_t(e)] >= sink.pieces[4 * size_t(i) + 2];
    CHECK(outside == 0);

    Mask causal;
    causal.causal = true;
    const BlockListData triangle = block_list_from_mask(causal, 4096, 4096, bs, bs);
    CHECK(triangle.num_split_groups == 0);
    CHECK(triangle.pieces.size() == size_t(4 * groups));
  }
}

TEST_CASE("cpu: a block list made from the mask computes what the mask computes") {
  Problem p = make({"mask blocks", DType::bf16, 1, 2, 2, 32, 300, 300, true, 100, -1, 0, 0}, 400);
  Outputs plain = run<double>(p, true);
  p.blocks = block_list_from_mask(p.mask, p.Sq, p.Skv, 64, 128);
  Outputs blocked = run<double>(p, true);
  ErrorStat eo, edq, edk;
  for (int64_t i = 0; i < p.Sq; ++i)
    for (int32_t h = 0; h < p.Hq; ++h)
      for (int32_t d = 0; d < p.D; ++d) {
        eo.add(blocked.o32.get(0, i, h, d), plain.o32.get(0, i, h, d));
        edq.add(blocked.dq.get(0, i, h, d), plain.dq.get(0, i, h, d));
        edk.add(blocked.dk.get(0, i, h, d), plain.dk.get(0, i, h, d));
      }
  CHECK(eo.rel() < 1e-6);
  CHECK(edq.rel() < 1e-6);
  CHECK(edk.rel() < 1e-6);
  check_both(p);
}

// A ring's merged output against the one-shot forward `one`: the fp32 sums (acc) and the LSE close
// to its fp32 ones, the output in the dtype (out) within one bf16 step of its and exactly acc rounded.
static void check_merged(const Problem& p, const Outputs& one, const Tensor& acc, const Tensor& out, const Stats& lse) {
  ErrorStat e32, e16;
  int bad = 0;
  for (int64_t b = 0; b < p.B; ++b)
    for (int32_t h = 0; h < p.Hq; ++h)
      for (int64_t i = 0; i < p.Sq; ++i) {
        bad += std::abs(lse.at(b, h, i) - one.lse32.at(b, h, i)) > 1e-5;
        for (int32_t d = 0; d < p.D; ++d) {
          e32.add(acc.get(b, i, h, d), one.o32.get(b, i, h, d));
          e16.add(out.get(b, i, h, d), one.o.get(b, i, h, d));
          bad += out.get(b, i, h, d) != bf16_to_float(float_to_bf16(float(acc.get(b, i, h, d))));
        }
      }
  CHECK(bad == 0);
  CHECK(e32.rel() < 2e-6);
  CHECK(e16.rel() < 8e-3); // at most one bf16 step apart where the two roundings differ
}

// A ring in miniature: keys in three blocks at their global positions, each attended as an fp32
// partial, merged by LSE, converted once; then the backward of each block with the final LSE.
TEST_CASE("cpu: partial forward + merge equals one shot, per-block backward sums to one shot") {
  for (int causal = 0; causal < 2; ++causal) {
    CAPTURE(causal);
    Problem p = make({"ring", DType::bf16, 2, 4, 2, 32, 60, 150, causal == 1, -1, -1, 60, 0}, 500);
    Outputs one = run<float>(p, true);

    Tensor acc(DType::fp32, p.B, p.Sq, p.Hq, p.D), part(DType::fp32, p.B, p.Sq, p.Hq, p.D);
    Stats lse_acc(p.B, p.Hq, p.Sq, kNegInf), lse_part(p.B, p.Hq, p.Sq);
    acc.fill(0);
    const int64_t starts[] = {0, 50, 100, 150};
    const auto slice = [&](Tensor& t, int64_t j0) {
      TensorRef r = t.ref();
      r.data = static_cast<uint8_t*>(r.data) + j0 * t.token_stride() * dtype_bytes(t.dtype);
      return r;
    };
    for (int s = 0; s < 3; ++s) {
      ForwardParams f = p.forward_params(part, lse_part, true);
      f.seqlen_kv = starts[s + 1] - starts[s];
      f.mask.kv_pos0 = starts[s];
      f.k = slice(p.k, starts[s]);
      f.v = slice(p.v, starts[s]);
      cpu::forward<float>(f);
      MergeParams m;
      m.batch = p.B;
      m.heads = p.Hq;
      m.head_dim = p.D;
      m.seqlen = p.Sq;
      m.o_acc = acc.ref();
      m.lse_acc = lse_acc.ref();
      m.o_part = part.ref();
      m.lse_part = lse_part.ref();
      cpu::merge_partial(m);
    }
    Tensor out(p.dtype, p.B, p.Sq, p.Hq, p.D);
    ConvertParams cv;
    cv.dtype = p.dtype;
    cv.batch = p.B;
    cv.heads = p.Hq;
    cv.head_dim = p.D;
    cv.seqlen = p.Sq;
    cv.src = acc.ref();
    cv.dst = out.ref();
    cpu::convert(cv);
    check_merged(p, one, acc, out, lse_acc);  // convert is exactly the rounding of the merged fp32 value

    Tensor dq(DType::fp32, p.B, p.Sq, p.Hq, p.D), dk(DType::fp32, p.B, p.Skv, p.Hkv, p.D),
        dv(DType::fp32, p.B, p.Skv, p.Hkv, p.D);
    for (int s = 0; s < 3; ++s) {
      BackwardParams g = p.backward_params(one.lse32, one.delta, dq, dk, dv);
      g.seqlen_kv = starts[s + 1] - starts[s];
      g.mask.kv_pos0 = starts[s];
      g.k = slice(p.k, starts[s]);
      g.v = slice(p.v, starts[s]);
      g.dk = slice(dk, starts[s]);
      g.dv = slice(dv, starts[s]);
      cpu::backward<float>(g);
    }
    ErrorStat edq, edk, edv;
    for (size_t x = 0; x < dq.bytes.size() / 4; ++x)
      edq.add(reinterpret_cast<const float*>(dq.bytes.data())[x], reinterpret_cast<const float*>(one.dq.bytes.data())[x]);
    for (size_t x = 0; x < dk.bytes.size() / 4; ++x) {
      edk.add(reinterpret_cast<const float*>(dk.bytes.data())[x], reinterpret_cast<const float*>(one.dk.bytes.data())[x]);
      edv.add(reinterpret_cast<const float*>(dv.bytes.data())[x], reinterpret_cast<const float*>(one.dv.bytes.data())[x]);
    }
    CHECK(edq.rel() < 1e-5);
    CHECK(edk.rel() < 1e-5);
    CHECK(edv.rel() < 1e-5);
  }
}

// The same ring with each later call merging the rows' partial in itself (ForwardParams::o_prior):
// in place in fp32, the last into the output in the dtype. Rows before 40 see none of block
// [100, 150): one order merges a prior into rows the call sees nothing of, the other has no prior.
TEST_CASE("cpu: a forward merges a prior partial in, in place and into the output") {
  for (const std::array<int, 3>& order : {std::array<int, 3>{0, 1, 2}, std::array<int, 3>{2, 0, 1}}) {
    CAPTURE(order[0]);
    Problem p = make({"ring", DType::bf16, 2, 4, 2, 32, 60, 150, true, -1, -1, 60, 0}, 510);
    const Outputs one = run<float>(p, false);
    const int64_t starts[] = {0, 50, 100, 150};
    Tensor acc(DType::fp32, p.B, p.Sq, p.Hq, p.D), out(p.dtype, p.B, p.Sq, p.Hq, p.D);
    Stats lse(p.B, p.Hq, p.Sq);
    const auto run_calls = [&](bool into_output) {
      for (int i = 0; i < 3; ++i) {
        const int blk = order[i];
        ForwardParams f = p.forward_params(acc, lse, true);
        f.seqlen_kv = starts[blk + 1] - starts[blk];
        f.mask.kv_pos0 = starts[blk];
        for (auto [t, from] : {std::pair{&f.k, &p.k}, std::pair{&f.v, &p.v}}) {
          *t = from->ref();
          t->data = static_cast<uint8_t*>(t->data) + starts[blk] * from->token_stride() * dtype_bytes(from->dtype);
        }
        if (i > 0) {
          f.o_prior = acc.ref();
          f.lse_prior = lse.ref();
        }
        if (i == 2 && into_output) {
          f.o = out.ref();
          f.o_fp32 = false;
        }
        cpu::forward<float>(f);
      }
    };
    run_calls(false);
    const Tensor merged32 = acc;
    const Stats lse32 = lse;
    run_calls(true);
    check_merged(p, one, merged32, out, lse);
    CHECK(lse.v == lse32.v);  // the same LSE whichever way the last call writes O
  }
  // The prior is read as fp32: an output in the dtype over it, or no LSE with it, is refused.
  Problem p = make({"ring", DType::bf16, 1, 2, 1, 32, 20, 20, true, -1, -1, 0, 0}, 511);
  Tensor acc(DType::fp32, p.B, p.Sq, p.Hq, p.D);
  Stats lse(p.B, p.Hq, p.Sq);
  ForwardParams f = p.forward_params(acc, lse, true);
  f.o_prior = acc.ref();
  f.lse_prior = lse.ref();
  f.o_fp32 = false;
  CHECK_THROWS_AS(cpu::forward<float>(f), Error);
  f.o_fp32 = true;
  f.lse_prior = {};
  CHECK_THROWS_AS(cpu::forward<float>(f), Error);
}

TEST_CASE("cpu: rows with no key give O = 0, LSE = -inf, zero gradients, no NaN") {
  // Causal with the keys after every query: nothing is visible at all.
  Problem p = make({"empty", DType::bf16, 1, 2, 1, 32, 20, 20, true, -1, -1, 0, 1000}, 600);
  Outputs r = run<float>(p, true);
  int bad = 0;
  for (int32_t h = 0; h < p.Hq; ++h)
    for (int64_t i = 0; i < p.Sq; ++i) {
      bad += r.lse.at(0, h, i) != kNegInf;
      for (int32_t d = 0; d < p.D; ++d) bad += r.o.get(0, i, h, d) != 0.0 || r.dq.get(0, i, h, d) != 0.0;
    }
  for (int64_t j = 0; j < p.Skv; ++j)
    for (int32_t d = 0; d < p.D; ++d) bad += r.dk.get(0, j, 0, d) != 0.0 || r.dv.get(0, j, 0, d) != 0.0;
  CHECK(bad == 0);
}

// write_dkdv (one call that makes every key's gradients): dK and dV in the input dtype, bit for bit
// the fp32 accumulators (started at zero) rounded once; keys no query sees get zeros, not what was
// there; dQ still adds.
TEST_CASE("cpu: write_dkdv writes dK and dV in dtype, the accumulators rounded once") {
  for (DType dt : {DType::bf16, DType::fp16}) {
    // Causal with more keys than queries: the last 30 keys are after every query.
    Problem p = make({"write", dt, 2, 4, 2, 64, 70, 100, true, -1, -1, 0, 0}, 650);
    Outputs want = run<float>(p, true);
    Tensor dq(DType::fp32, p.B, p.Sq, p.Hq, p.D), dk(dt, p.B, p.Skv, p.Hkv, p.D), dv(dt, p.B, p.Skv, p.Hkv, p.D);
    dk.fill(kPoison);
    dv.fill(kPoison);
    BackwardParams g = p.backward_params(want.lse32, want.delta, dq, dk, dv);
    g.write_dkdv = true;
    cpu::backward<float>(g);
    CAPTURE(int(dt));
    int64_t differ = 0, unseen_nonzero = 0;
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t j = 0; j < p.Skv; ++j)
        for (int32_t h = 0; h < p.Hkv; ++h)
          for (int32_t d = 0; d < p.D; ++d) {
            Tensor one(dt, 1, 1, 1, 2);
            one.set(0, 0, 0, 0, want.dk.get(b, j, h, d));
            one.set(0, 0, 0, 1, want.dv.get(b, j, h, d));
            differ += dk.get(b, j, h, d) != one.get(0, 0, 0, 0) || dv.get(b, j, h, d) != one.get(0, 0, 0, 1);
            if (j >= p.Sq) unseen_nonzero += dk.get(b, j, h, d) != 0.0 || dv.get(b, j, h, d) != 0.0;
          }
    CHECK(differ == 0);
    CHECK(unseen_nonzero == 0);
    CHECK(dq.bytes == want.dq.bytes);
  }
}

// dq_out: after the call's adds (into an accumulator that held values of its own), the accumulator
// rounded, bit for bit; with no keys, what it held. FP8 calls write bf16.
TEST_CASE("cpu: dq_out holds the accumulator rounded after the call's adds") {
  for (DType dt : {DType::bf16, DType::fp16, DType::fp8_e4m3})
    for (int64_t skv : {int64_t{90}, int64_t{0}}) {
      Problem p = make({"dq_out", dt, 2, 4, 2, 64, 70, skv, true, -1, -1, 0, 0}, 651);
      Outputs want = run<float>(p, true);
      std::mt19937_64 rng(7);
      Tensor dq(DType::fp32, p.B, p.Sq, p.Hq, p.D), dk(DType::fp32, p.B, p.Skv, p.Hkv, p.D), dv = dk;
      dq.fill_normal(rng, 1.0);
      Tensor out(output_dtype(dt), p.B, p.Sq, p.Hq, p.D);
      out.fill(kPoison);
      BackwardParams g = p.backward_params(want.lse32, want.delta, dq, dk, dv);
      g.dq_out = out.ref();
      cpu::backward<float>(g);
      CAPTURE(int(dt));
      CAPTURE(skv);
      CHECK(differ_from_rounded(out, dq) == 0);
    }
}

// dk_add and dv_add (a ring's owner adding the other ranks' shares of its keys in the call that
// writes them): on keys [begin, end) the fp32 sum of the accumulators and the share, rounded once;
// elsewhere as without. Without write_dkdv, or past the call's keys, one line says why.
TEST_CASE("cpu: write_dkdv adds fp32 shares of a range of keys before it writes, rounded once") {
  Problem p = make({"shares", DType::bf16, 2, 4, 2, 64, 70, 100, true, -1, -1, 0, 0}, 651);
  Outputs want = run<float>(p, true);
  Tensor share_k(DType::fp32, p.B, p.Skv, p.Hkv, p.D), share_v = share_k;
  std::mt19937_64 rng(652);
  fill_normal(share_k, rng, 0.05f);
  fill_normal(share_v, rng, 0.05f);
  Tensor dq(DType::fp32, p.B, p.Sq, p.Hq, p.D), dk(p.dtype, p.B, p.Skv, p.Hkv, p.D), dv = dk;
  dk.fill(kPoison);
  dv.fill(kPoison);
  BackwardParams g = p.backward_params(want.lse32, want.delta, dq, dk, dv);
  g.write_dkdv = true;
  g.dk_add = share_k.ref();
  g.dv_add = share_v.ref();
  g.add_begin = 20;
  g.add_end = 90;
  cpu::backward<float>(g);
  CHECK(differ_from_shared(dk, dv, want.dk, want.dv, share_k, share_v, g.add_begin, g.add_end) == 0);
  g.add_end = p.Skv + 1;
  CHECK_THROWS_WITH(cpu::backward<float>(g), "attncore: backward: the added keys [20, 101) are not within the call's 100");
  g.add_end = 90;
  g.write_dkdv = false;
  CHECK_THROWS_WITH(cpu::backward<float>(g),
                    "attncore: backward: dk_add and dv_add go with write_dkdv (they are added before dK and dV are written)");
}

// write_dkdv in fp32 with segments that share no keys (dilated's patterns): every key of a segment
// is its accumulator's value (one add into zero), keys in no segment keep what was there.
TEST_CASE("cpu: write_dkdv in fp32 with segments writes every key of a segment and no other") {
  Problem p = make({"write fp32", DType::bf16, 2, 4, 2, 32, 120, 120, true, -1, -1, 0, 0}, 651);
  p.segments = {{0, 50, 0, 50, 0, 0}, {50, 120, 61, 120, 50, 61}};  // keys 50..60 in no segment
  Outputs want = run<float>(p, true);
  Tensor dq(DType::fp32, p.B, p.Sq, p.Hq, p.D), dk(DType::fp32, p.B, p.Skv, p.Hkv, p.D),
      dv(DType::fp32, p.B, p.Skv, p.Hkv, p.D);
  dk.fill(kPoison);
  dv.fill(kPoison);
  BackwardParams g = p.backward_params(want.lse32, want.delta, dq, dk, dv);
  g.write_dkdv = true;
  g.write_dkdv_fp32 = true;
  cpu::backward<float>(g);
  int64_t differ = 0, gap_written = 0;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t j = 0; j < p.Skv; ++j)
      for (int32_t h = 0; h < p.Hkv; ++h)
        for (int32_t d = 0; d < p.D; ++d) {
          const double k = dk.get(b, j, h, d), v = dv.get(b, j, h, d);
          if (j >= 50 && j < 61) gap_written += !(k == kPoison) || !(v == kPoison);
          else differ += k != want.dk.get(b, j, h, d) || v != want.dv.get(b, j, h, d);
        }
  CHECK(differ == 0);
  CHECK(gap_written == 0);
  CHECK(dq.bytes == want.dq.bytes);
  g.write_dkdv = false;  // fp32 writing is a way of write_dkdv, not a mode of its own
  CHECK_THROWS_AS(cpu::backward<float>(g), Error);
}

TEST_CASE("cpu: merge of two empty sides stays (0, -inf), one empty side passes the other") {
  Tensor acc(DType::fp32, 1, 2, 1, 4), part(DType::fp32, 1, 2, 1, 4);
  Stats la(1, 1, 2, kNegInf), lp(1, 1, 2, kNegInf);
  acc.fill(0);
  part.fill(3);
  lp.at(0, 0, 1) = 0.5f;
  MergeParams m;
  m.batch = 1;
  m.heads = 1;
  m.head_dim = 4;
  m.seqlen = 2;
  m.o_acc = acc.ref();
  m.lse_acc = la.ref();
  m.o_part = part.ref();
  m.lse_part = lp.ref();
  cpu::merge_partial(m);
  CHECK(la.at(0, 0, 0) == kNegInf);
  CHECK(acc.get(0, 0, 0, 0) == 0.0);
  CHECK(la.at(0, 0, 1) == 0.5f);
  CHECK(acc.get(0, 1, 0, 3) == doctest::Approx(3.0));
}

// A ring's last merge on its rows writes the output in its dtype: the same bits as merging in fp32
// and converting after (OutputAccumulator drops the conversion pass over those rows).
TEST_CASE("cpu: the last merge rounds into the output, bit for bit as merge then convert") {
  std::mt19937_64 rng(17);
  for (DType dt : {DType::bf16, DType::fp16}) {
    CAPTURE(int(dt));
    const int64_t B = 2, S = 5, H = 3, D = 8;
    Tensor acc(DType::fp32, B, S, H, D, 2), part(DType::fp32, B, S, H, D);
    acc.fill_normal(rng, 1.0);
    part.fill_normal(rng, 1.0);
    Stats la(B, H, S), lp(B, H, S);
    std::uniform_real_distribution<float> u(-3.f, 3.f);
    for (size_t i = 0; i < la.v.size(); ++i) {  // some sides empty, and one row with neither
      la.v[i] = i % 4 == 1 ? kNegInf : u(rng);
      lp.v[i] = i % 3 == 1 ? kNegInf : u(rng);
    }
    Tensor acc_twice = acc;
    Stats la_twice = la;
    const auto params = [&](Tensor& a, Stats& l) {
      MergeParams m;
      m.batch = int32_t(B);
      m.heads = int32_t(H);
      m.head_dim = int32_t(D);
      m.seqlen = S;
      m.o_acc = a.ref();
      m.lse_acc = l.ref();
      m.o_part = part.ref();
      m.lse_part = lp.ref();
      return m;
    };
    cpu::merge_partial(params(acc_twice, la_twice));
    Tensor want(dt, B, S, H, D, 1);
    ConvertParams cv{dt, int32_t(B), int32_t(H), int32_t(D), S, acc_twice.ref(), want.ref()};
    cpu::convert(cv);
    Tensor got(dt, B, S, H, D, 1);
    MergeParams once = params(acc, la);
    once.o_out = got.ref();
    once.out_dtype = dt;
    cpu::merge_partial(once);
    CHECK(got.bytes == want.bytes);
    CHECK(la.v == la_twice.v);
  }
  Tensor acc(DType::fp32, 1, 1, 1, 4), out(DType::fp32, 1, 1, 1, 4);
  Stats l(1, 1, 1);
  MergeParams fp32_out{1, 1, 4, 1, acc.ref(), l.ref(), acc.ref(), l.ref()};
  fp32_out.o_out = out.ref();
  fp32_out.out_dtype = DType::fp32;
  CHECK_THROWS_AS(cpu::merge_partial(fp32_out), Error);
}

TEST_CASE("cpu: amax is the largest |x|, skipping NaN rows, 0 for no rows") {
  Tensor x(DType::bf16, 2, 3, 2, 8);
  x.fill(0.25f);
  x.set(1, 2, 1, 7, -3.5);
  x.set(0, 1, 0, 0, std::numeric_limits<double>::quiet_NaN());  // a row no one wrote
  float amax = -1.f;
  AmaxParams p{DType::bf16, 2, 2, 8, 3, x.ref(), &amax};
  cpu::amax(p);
  CHECK(amax == 3.5f);
  p.seqlen = 0;
  cpu::amax(p);
  CHECK(amax == 0.f);
  p.dtype = DType::fp8_e4m3;
  CHECK_THROWS_AS(cpu::amax(p), Error);
}

TEST_CASE("cpu: compute_delta clears its zero buffer in the same call, and only it") {
  Tensor o(DType::bf16, 1, 3, 2, 8), d_o(DType::bf16, 1, 3, 2, 8);
  o.fill(0.5f);
  d_o.fill(2.f);
  Stats delta(1, 2, 3, kNegInf);
  std::vector<float> dq(1 * 3 * 2 * 8 + 2, 7.f);
  DeltaParams p{DType::bf16, 1, 2, 8, 3, o.ref(), d_o.ref(), false, delta.ref(), dq.data() + 1, (dq.size() - 2) * 4};
  cpu::compute_delta<double>(p);
  CHECK(delta.at(0, 1, 2) == doctest::Approx(8.0));
  CHECK(dq.front() == 7.f);
  CHECK(dq.back() == 7.f);
  CHECK(std::count(dq.begin() + 1, dq.end() - 1, 0.f) == long(dq.size() - 2));
  p.seqlen = 0;  // no rows: still cleared
  std::fill(dq.begin(), dq.end(), 7.f);
  cpu::compute_delta<double>(p);
  CHECK(std::count(dq.begin(), dq.end(), 0.f) == long(dq.size() - 2));
}

TEST_CASE("cpu: malformed calls throw attncore::Error") {
  Problem p = make({"err", DType::bf16, 1, 3, 2, 16, 8, 8, false, -1, -1, 0, 0}, 700);
  Tensor o(p.dtype, 1, 8, 3, 16);
  Stats lse(1, 3, 8);
  CHECK_THROWS_AS(cpu::forward<float>(p.forward_params(o, lse, false)), Error); // 3 % 2 != 0
  p.Hkv = 3;
  std::mt19937_64 rng(1);
  p.randomize(rng);
  p.segments = {{0, 8, 0, 8, 0, 0}};
  p.blocks = block_list_from_mask(p.mask, p.Sq, p.Skv, 64, 64);
  CHECK_THROWS_AS(cpu::forward<float>(p.forward_params(o, lse, false)), Error); // blocks + segments
  p.segments.clear();
  p.blocks->kv_block = {3};
  CHECK_THROWS_AS(cpu::forward<float>(p.forward_params(o, lse, false)), Error); // block out of range
  p.blocks.reset();
  p.segments = {{0, 6, 0, 8, 0, 0}, {5, 8, 0, 8, 0, 0}};
  CHECK_THROWS_AS(cpu::forward<float>(p.forward_params(o, lse, false)), Error); // overlapping rows
  CHECK(check_supported_cpu(DType::fp64, 64) != "");
  CHECK(check_supported(DType::bf16, 72).find("64, 80, 96, 128, 256") != std::string::npos);
  CHECK(check_supported(DType::fp16, 128).empty());
}

TEST_CASE("cpu: concurrent calls on disjoint outputs give the sequential result") {
  Problem p = make({"threads", DType::bf16, 1, 4, 2, 32, 90, 90, true, -1, -1, 0, 0}, 800);
  Tensor ref_o(p.dtype, 1, 90, 4, 32);
  Stats ref_lse(1, 4, 90);
  cpu::forward<float>(p.forward_params(ref_o, ref_lse, false));
  std::vector<Tensor> outs(4, Tensor(p.dtype, 1, 90, 4, 32));
  std::vector<Stats> lses(4, Stats(1, 4, 90));
  std::vector<ForwardParams> params;
  for (int t = 0; t < 4; ++t) params.push_back(p.forward_params(outs[size_t(t)], lses[size_t(t)], false));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&, t] { cpu::forward<float>(params[size_t(t)]); });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) {
    CHECK(outs[size_t(t)].bytes == ref_o.bytes);
    CHECK(lses[size_t(t)].v == ref_lse.v);
  }
}

// The cuDNN engine's mask mapping is pure logic: a mapped mask must hide exactly the pairs the core's
// mask hides, and every block whose visible pairs form a pattern cuDNN has (all, or j <= i + s with
// s >= 0) must be mapped.
TEST_CASE("cudnn mask mapping: exact where mapped, and every expressible block mapped") {
  std::mt19937_64 rng(5);
  int mapped = 0, refused = 0;
  for (int t = 0; t < 4000; ++t) {
    const int64_t sq = 1 + int64_t(rng() % 12), skv = 1 + int64_t(rng() % 12);
    Mask m;
    m.causal = rng() % 2 == 0;
    m.q_pos0 = int64_t(rng() % 20);
    m.kv_pos0 = int64_t(rng() % 20);
    if (rng() % 3 == 0) m.window_left = int64_t(rng() % 15);
    if (rng() % 3 == 0) m.window_right = int64_t(rng() % 15);
    const auto core = [&](int64_t i, int64_t j) {
      const int64_t qp = m.q_pos0 + i, kp = m.kv_pos0 + j;
      return (!m.causal || kp <= qp) && (m.window_left < 0 || kp >= qp - m.window_left) &&
             (m.window_right < 0 || kp <= qp + m.window_right);
    };
    const auto same = [&](auto&& visible) {
      for (int64_t i = 0; i < sq; ++i)
        for (int64_t j = 0; j < skv; ++j)
          if (core(i, j) != visible(i, j)) return false;
      return true;
    };
    bool expressible = same([](int64_t, int64_t) { return true; });
    for (int64_t sh = 0; sh < skv && !expressible; ++sh) expressible = same([&](int64_t i, int64_t j) { return j <= i + sh; });
    CudnnMask c;
    const std::string why = cudnn_mask(m, sq, skv, &c);
    CAPTURE(sq);
    CAPTURE(skv);
    CAPTURE(m.causal);
    CAPTURE(m.q_pos0);
    CAPTURE(m.kv_pos0);
    CAPTURE(m.window_left);
    CAPTURE(m.window_right);
    if (why.empty()) {
      ++mapped;
      CHECK(c.shift >= 0);
      CHECK(same([&](int64_t i, int64_t j) { return !c.causal || j <= i + c.shift; }));
    } else {
      ++refused;
      CHECK(!expressible);
      CHECK(why.find('\n') == std::string::npos);
    }
  }
  CHECK(mapped > 1000);
  CHECK(refused > 100);
}
