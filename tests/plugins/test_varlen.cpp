// varlen through the host's runtime: packed sequences of any lengths at world sizes 1 to 4 on the
// CPU against the float64 reference (and on GPUs, label gpu), errors that do not grow with the
// world size, exact pair counts, balanced ranks, padding that never shows in a result.
#include "harness.h"

#include "suite/varlen.h"

#include "schedule.h"

#include <numeric>

using attnhost::DeviceKind;
using test::run_on;

namespace {

struct Shape {
  int32_t heads = 4, kv_heads = 2, head_dim = 32;
  bool causal = true;
  int64_t window_left = -1, window_right = -1;
  std::string dtype = "bf16";
};

attnhost::suite::Case varlen_case(std::vector<int64_t> lengths, std::vector<int> world_sizes, const Shape& s = {}) {
  attnhost::suite::Case c = test::dense_case("varlen", std::move(world_sizes), 1, s.heads, s.kv_heads, s.head_dim,
                                             s.causal, s.dtype);
  attnhost::suite::SeqlenSpec spec;
  spec.lengths = std::move(lengths);
  attnhost::suite::detail::apply_varlen(c.problem, spec);
  c.problem.window_left = s.window_left;
  c.problem.window_right = s.window_right;
  return c;
}

// The documents mix of the suites, drawn small: many short sequences and a few long ones.
std::vector<int64_t> documents(int64_t total_tokens, int64_t max_length, uint64_t seed) {
  attnhost::suite::SeqlenSpec spec;
  spec.distribution = "documents";
  spec.total_tokens = total_tokens;
  spec.max_length = max_length;
  spec.seed = seed;
  return attnhost::suite::detail::draw_lengths(spec);
}

// Visible pairs of every sequence, per head, by brute force over its (query, key) pairs.
int64_t brute_force_pairs(const std::vector<int64_t>& lengths, const Shape& s) {
  int64_t n = 0;
  for (int64_t L : lengths)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < L; ++j)
        n += (!s.causal || j <= i) && (s.window_left < 0 || j >= i - s.window_left) &&
             (s.window_right < 0 || j <= i + s.window_right);
  return n;
}



void pairs_are_exact(const attnhost::CaseResult& r, const std::vector<int64_t>& lengths, const Shape& s) {
  const int64_t pairs = brute_force_pairs(lengths, s) * s.heads;
  for (const auto& run : r.runs) {
    INFO(r.spec.id, " at world size ", run.world_size);
    CHECK(run.total_pairs == pairs);
    CHECK(run.max_rank_pairs * run.world_size >= pairs);  // some rank computes at least its share
  }
}


// Passes at world sizes 1..4, the error does not grow, and the pairs are the brute-force count.
void check_case(const std::vector<int64_t>& lengths, const Shape& s) {
  attnhost::CaseResult r = run_on(DeviceKind::cpu, varlen_case(lengths, {1, 2, 3, 4}, s));
  test::all_pass(r);
  test::error_does_not_grow(r);
  pairs_are_exact(r, lengths, s);
}
}  // namespace

TEST_CASE("varlen: a problem of one token") {
  // Ranks 1..3 hold nothing but padding. A key that is its query's only key has dK = 0 exactly
  // (dS = P (dO.V - dO.O) with O = V), and so does this plugin's; the host's reference, whose row
  // LSE and delta are kept in fp32, makes it about 1e-7, which no relative error of a zero tensor
  // can pass: dK alone is held to an absolute bound here.
  for (bool causal : {true, false}) {
    Shape s;
    s.causal = causal;
    attnhost::CaseResult r = run_on(DeviceKind::cpu, varlen_case({1}, {1, 2, 3, 4}, s));
    pairs_are_exact(r, {1}, s);
    for (const auto& run : r.runs) {
      INFO("causal ", causal, " at world size ", run.world_size, ": ", run.error);
      REQUIRE(run.check.tensors.size() == 5);
      for (const auto& t : run.check.tensors) {
        CAPTURE(t.tensor);
        if (t.tensor == "dK") CHECK(t.max_abs_err < 1e-6);
        else CHECK(t.ok);
      }
    }
  }
}

TEST_CASE("varlen: one sequence of length 1 among others, sequences shorter than the world size, one that fills everything") {
  for (bool causal : {true, false}) {
    Shape s;
    s.causal = causal;
    CAPTURE(causal);
    check_case({1, 40}, s);                    // ranks 1..3 hold nothing of the first but padding
    check_case({1, 2, 3, 1, 2}, s);            // every sequence shorter than 2P
    check_case({250}, s);                      // one sequence filling everything, padded at most world sizes
    check_case({1, 3, 50, 17, 100, 2, 64}, s);
  }
}

TEST_CASE("varlen: a documents mix, causal and full, GQA, fp16") {
  const std::vector<int64_t> mix = documents(400, 160, 7);
  REQUIRE(mix.size() > 5);
  for (bool causal : {true, false}) {
    Shape s;
    s.causal = causal;
    CAPTURE(causal);
    check_case(mix, s);
  }
  Shape mqa;
  mqa.heads = 8;
  mqa.kv_heads = 1;
  check_case({37, 5, 90, 1, 64}, mqa);
  Shape fp16;
  fp16.dtype = "fp16";
  fp16.head_dim = 24;
  check_case({37, 5, 90, 1, 64}, fp16);
}

TEST_CASE("varlen: sliding windows, causal and on both sides, deterministic") {
  Shape causal_window;
  causal_window.kv_heads = 1;
  causal_window.window_left = 9;
  causal_window.window_right = 0;
  check_case({1, 3, 50, 17, 100, 2, 64}, causal_window);
  Shape both_sides;
  both_sides.causal = false;
  both_sides.window_left = 7;
  both_sides.window_right = 12;
  check_case({1, 3, 50, 17, 100, 2, 64}, both_sides);
  Shape wide = causal_window;  // a window past every sequence's length: the causal result
  wide.window_left = 1000;
  check_case({3, 50, 100}, wide);
  // Deterministic: no two segments of a call share keys (each chunk pair in a call of its own).
  auto det = varlen_case({1, 3, 50, 17, 100, 2, 64}, {1, 2, 4}, causal_window);
  det.problem.deterministic = true;
  test::all_pass(run_on(DeviceKind::cpu, det));
}

TEST_CASE("varlen: padding never changes a result") {
  // fp32: the error is rounding alone, so a padding slot that leaked into any real row (as a key
  // of zeros, a query, or a gradient) would stand out by orders of magnitude. Every length below
  // leaves padding at world sizes 2 to 4, and two sequences are shorter than the world size.
  for (bool causal : {true, false}) {
    Shape s;
    s.causal = causal;
    s.dtype = "fp32";
    attnhost::CaseResult r = run_on(DeviceKind::cpu, varlen_case({1, 2, 9, 47, 121}, {1, 2, 3, 4}, s));
    test::all_pass(r);
    for (const auto& run : r.runs)
      for (const char* tensor : {"O", "dQ", "dK", "dV"}) {
        INFO("causal ", causal, " ", tensor, " at world size ", run.world_size);
        CHECK(test::error_of(run, tensor) < 1e-5);
      }
  }
}

TEST_CASE("varlen: every rank attends the same pairs, counted exactly") {
  // Every sequence split, lengths divisible by 2P: the zigzag gives each rank exactly 1/P of the
  // causal pairs, and each rank counts exactly what it computes (the rank counts sum to the
  // brute-force total). Balanced dispatch: within its slack of that.
  for (int P : {2, 3, 4})
    for (const char* dispatch : {"split", "balanced"}) {
      const std::vector<int64_t> lengths = {48, 24 * 8, 24};
      for (bool causal : {true, false}) {
        Shape s;
        s.causal = causal;
        CAPTURE(P);
        CAPTURE(causal);
        CAPTURE(dispatch);
        attnhost::suite::Case c = varlen_case(lengths, {P}, s);
        c.params["dispatch"] = std::string(dispatch);
        attnhost::CaseResult r = run_on(DeviceKind::cpu, c);
        test::all_pass(r);
        const auto& run = r.runs[0];
        CHECK(run.total_pairs == brute_force_pairs(lengths, s) * s.heads);
        if (std::string(dispatch) == "split") CHECK(run.max_rank_pairs * P == run.total_pairs);
        else CHECK(static_cast<double>(run.max_rank_pairs) * P / run.total_pairs <= 1 + varlen::kPlacementSlack);
      }
    }
  // A documents mix, padded: still within a few percent of perfect balance.
  const std::vector<int64_t> mix = documents(2000, 800, 3);
  attnhost::CaseResult r = run_on(DeviceKind::cpu, varlen_case(mix, {4}, Shape{2, 2, 8, true}));
  test::all_pass(r);
  CHECK(static_cast<double>(r.runs[0].max_rank_pairs) * 4 / r.runs[0].total_pairs < 1.03);
}

TEST_CASE("varlen: short sequences are placed whole, the longest split only as the balance needs") {
  const auto placed = [](std::vector<int64_t> lengths, int P) {
    std::vector<int64_t> cu = {0};
    for (int64_t L : lengths) cu.push_back(cu.back() + L);
    return varlen::place_sequences(cu, {true, -1, -1}, P);
  };
  // Eight equal sequences on two ranks: four whole on each, none split.
  CHECK(placed(std::vector<int64_t>(8, 16), 2) == std::vector<int>{0, 1, 0, 1, 0, 1, 0, 1});
  // One long sequence among short ones: it alone is split (no rank could take it whole and stay
  // within the slack), the short ones placed around it.
  const std::vector<int> owner = placed({16, 256, 16, 16, 16, 16, 16, 16, 16}, 2);
  CHECK(owner[1] == -1);
  CHECK(std::count(owner.begin(), owner.end(), 0) == 4);
  CHECK(std::count(owner.begin(), owner.end(), 1) == 4);
  // One sequence, as a batch of one is: split. On one rank: placed.
  CHECK(placed({1000}, 4) == std::vector<int>{-1});
  CHECK(placed({1000, 3}, 1) == std::vector<int>{0, 0});
}

TEST_CASE("varlen: what goes round the ring is each rank's split sequences, once a step") {
  // Every sequence split: P - 1 forward steps send K and V of the local slots (tokens and padding);
  // the backward sends them again and the fp32 dK, dV after every one of its P steps.
  const std::vector<int64_t> lengths = {1, 2, 9, 47, 121};
  Shape s;
  attnhost::suite::Case split = varlen_case(lengths, {1, 2, 3, 4}, s);
  split.params["dispatch"] = std::string("split");
  attnhost::CaseResult r = run_on(DeviceKind::cpu, split);
  test::all_pass(r);
  for (const auto& run : r.runs) {
    const int P = run.world_size;
    int64_t slots = 0;
    for (int64_t L : lengths) slots += 2 * ((L + 2 * P - 1) / (2 * P));
    const uint64_t kv = static_cast<uint64_t>(slots) * s.kv_heads * s.head_dim;
    for (int rank = 0; rank < P; ++rank) {
      CAPTURE(P);
      CAPTURE(rank);
      CHECK(run.sent_bytes_fwd[rank] == (P - 1) * 2 * kv * 2);
      // K/V, then dK/dV: P - 1 hops in fp32 and the last one home in bf16
      CHECK(run.sent_bytes_bwd[rank] == (P > 1 ? (P - 1) * 2 * kv * 2 + (P - 1) * 2 * kv * 4 + 2 * kv * 2 : 0));
    }
  }
  // Balanced: the one long sequence is split (2 x 64 slots a rank), the short ones stay home, and
  // only the split slots travel, K and V a hop.
  attnhost::CaseResult b = run_on(DeviceKind::cpu, varlen_case({16, 256, 16, 16, 16, 16, 16, 16, 16}, {2}, s));
  test::all_pass(b);
  const uint64_t split_kv = uint64_t{128} * s.kv_heads * s.head_dim;
  for (int rank = 0; rank < 2; ++rank) CHECK(b.runs[0].sent_bytes_fwd[rank] == 2 * split_kv * 2);
  // Nothing split: nothing travels.
  attnhost::CaseResult none = run_on(DeviceKind::cpu, varlen_case(std::vector<int64_t>(8, 16), {2}, s));
  test::all_pass(none);
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(none.runs[0].sent_bytes_fwd[rank] == 0);
    CHECK(none.runs[0].sent_bytes_bwd[rank] == 0);
  }
}

TEST_CASE("varlen in FP8 on the CPU: documents placed and split, at world sizes 1 to 4") {
  for (const char* dtype : {"fp8_e4m3", "fp8_e5m2"}) {
    Shape s;
    s.dtype = dtype;
    attnhost::CaseResult r = run_on(DeviceKind::cpu, varlen_case(documents(900, 400, 5), {1, 2, 3, 4}, s));
    test::all_pass(r);
    test::error_does_not_grow(r);
  }
}

TEST_CASE("varlen: one unpacked sequence, no overlap, and what it refuses") {
  auto one = test::dense_case("varlen", {1, 3}, 130, 4, 2, 16, true);
  one.problem.batch = 1;
  test::all_pass(run_on(DeviceKind::cpu, one));
  auto serial = varlen_case({1, 3, 50, 17}, {2, 3});
  serial.params["overlap"] = false;
  test::all_pass(run_on(DeviceKind::cpu, serial));
  auto batch = test::dense_case("varlen", {1}, 64, 2, 2, 16, true);
  auto refused = run_on(DeviceKind::cpu, batch);
  CHECK(refused.runs[0].status == "UNSUPPORTED");
  CHECK(refused.runs[0].error ==
        "plugin 'varlen' refused the problem: varlen takes packed sequences (a [varlen] table) or one sequence, "
        "not a batch of 2");
}

#if ATTNHOST_HAVE_CUDA
TEST_CASE("gpu: varlen on the GPUs against the float64 reference" * doctest::test_suite("gpu")) {
  const int gpus = attnhost::cuda_device_count();
  REQUIRE_MESSAGE(gpus > 0, "no GPU visible");
  std::vector<int> sizes = {1};
  if (gpus > 1) sizes.push_back(2);
  // A documents mix with sequences from 1 token to a few thousand, lengths that leave padding.
  const std::vector<int64_t> mix = documents(12000, 4096, 1);
  for (bool causal : {true, false}) {
    Shape s{8, 2, 128, causal};
    auto r = run_on(DeviceKind::cuda, varlen_case(mix, sizes, s));
    test::all_pass(r);
    test::error_does_not_grow(r);
  }
  Shape window{4, 4, 128, true, 300, 0};
  test::all_pass(run_on(DeviceKind::cuda, varlen_case({1, 700, 3, 2049, 17}, sizes, window)));
  for (int d : {64, 80, 96, 256}) {
    Shape fp16{4, 1, d, true, -1, -1, "fp16"};
    test::all_pass(run_on(DeviceKind::cuda, varlen_case({1, 2, 513, 1000, 7}, sizes, fp16)));
  }
  auto fp8 = run_on(DeviceKind::cuda, varlen_case({5, 900}, {1}, Shape{2, 2, 128, true, -1, -1, "fp8_e4m3"}));
  CHECK(fp8.runs[0].status == "UNSUPPORTED");
  auto det = varlen_case({5, 900, 1, 333}, sizes, Shape{4, 2, 128, false, 100, 100});
  det.problem.deterministic = true;
  test::all_pass(run_on(DeviceKind::cuda, det));
}
#endif
