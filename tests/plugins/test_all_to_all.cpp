// ulysses, usp and allgather: the float64 check at world sizes 1 to 4, errors that do not grow,
// the messages that refuse a problem, and the bytes each strategy moves.
#include "harness.h"

#include <map>

#include "suite/varlen.h"

using attnhost::DeviceKind;
using test::dense_case;
using test::run_on;

TEST_CASE("ulysses: causal, full, a window, GQA and lengths that do not divide, at world sizes 1, 2 and 4") {
  for (bool causal : {true, false}) {
    attnhost::CaseResult r = run_on(DeviceKind::cpu, dense_case("ulysses", {1, 2, 4}, 250, 8, 4, 32, causal));
    test::all_pass(r);
    test::error_does_not_grow(r);
  }
  auto window = dense_case("ulysses", {1, 3}, 255, 6, 3, 16, true);
  window.problem.window_left = 40;
  window.problem.window_right = 0;
  test::all_pass(run_on(DeviceKind::cpu, window));
  test::all_pass(run_on(DeviceKind::cpu, dense_case("ulysses", {1, 2}, 128, 4, 4, 24, true, "fp16")));
  auto one_group = dense_case("ulysses", {2, 4}, 128, 8, 8, 16, true);  // the pipeline of one group, and of four
  one_group.params["head_groups"] = int64_t{1};
  test::all_pass(run_on(DeviceKind::cpu, one_group));
  auto serial = dense_case("ulysses", {2}, 128, 8, 8, 16, true);
  serial.params["overlap"] = false;
  test::all_pass(run_on(DeviceKind::cpu, serial));
}

TEST_CASE("ulysses and usp: a tapered pipeline (first and last batch entry alone) computes what whole groups do") {
  struct Shape {
    const char* plugin;
    int64_t batch, head_groups, ulysses_degree;
    int32_t kv_heads;
  };
  for (const Shape& s : {Shape{"ulysses", 4, 2, 0, 4}, Shape{"ulysses", 3, 1, 0, 4}, Shape{"ulysses", 2, 2, 0, 4},
                         Shape{"ulysses", 3, 1, 0, 1}, Shape{"usp", 3, 1, 2, 4}}) {
    std::vector<attnhost::CaseResult> runs;
    for (const char* taper : {"on", "off"}) {
      auto c = dense_case(s.plugin, {2, 4}, 96, 8, s.kv_heads, 16, true);
      c.problem.batch = s.batch;
      c.params["head_groups"] = s.head_groups;
      if (s.ulysses_degree > 0) c.params["ulysses_degree"] = s.ulysses_degree;
      c.params["taper"] = std::string(taper);
      runs.push_back(run_on(DeviceKind::cpu, c));
      test::all_pass(runs.back());
    }
    // Every entry's calls are the same, only their order moves; but the entries of the backward's
    // last step add dQ over runs of columns, so dQ agrees to rounding.
    for (size_t w = 0; w < runs[0].runs.size(); ++w)
      for (const char* tensor : {"O", "LSE", "dQ", "dK", "dV"}) {
        INFO(std::string(s.plugin), " batch ", s.batch, " at world size ", runs[0].runs[w].world_size, ": ",
             std::string(tensor));
        const double a = test::error_of(runs[0].runs[w], tensor), b = test::error_of(runs[1].runs[w], tensor);
        if (std::string(tensor) == "dQ") CHECK(a == doctest::Approx(b).epsilon(1e-3));
        else CHECK(a == b);
      }
  }
}

// The CPU's communicator moves blocks as they lie, as the copy engines do: each (tensor, peer) or
// (range, peer) one block, no message packed. The values must be the packed messages' to the bit,
// but for dQ of ulysses's and usp's last backward step, which as blocks lie runs over columns.
// Allgather's forward then also runs over fewer, larger groups of heads than its backward (auto
// groups), which must not change a value either; its backward is cut by rows on both (packed
// messages take no other).
TEST_CASE("ulysses, usp and allgather: blocks moved as they lie compute what packed messages do") {
  struct Shape {
    const char* plugin;
    int32_t kv_heads;
    const char* dtype;
    int64_t ulysses_degree;
    bool causal = true;
    int64_t head_groups = 0;  // allgather's (0: auto)
  };
  for (const Shape& s : {Shape{"ulysses", 4, "bf16", 0}, Shape{"ulysses", 1, "bf16", 0}, Shape{"ulysses", 2, "fp8_e4m3", 0},
                         Shape{"usp", 4, "bf16", 2}, Shape{"allgather", 4, "bf16", 0, true, 2},
                         Shape{"allgather", 8, "fp8_e4m3", 0}, Shape{"allgather", 8, "bf16", 0, false}}) {
    std::vector<attnhost::CaseResult> runs;
    const bool allgather = std::string(s.plugin) == "allgather";
    for (const char* exchange : {"auto", "packed"}) {
      auto c = dense_case(s.plugin, allgather ? std::vector<int>{2, 3} : std::vector<int>{2, 4}, 96, 8, s.kv_heads, 16,
                          s.causal, s.dtype);
      c.problem.batch = 3;
      if (allgather && s.head_groups > 0) c.params["head_groups"] = s.head_groups;  // (causal: zigzag's two ranges a rank)
      if (allgather) c.params["backward"] = std::string("rows");
      if (!allgather) c.params["taper"] = std::string("on");  // steps that start past the first entry
      c.params["exchange"] = std::string(exchange);
      if (s.ulysses_degree > 0) c.params["ulysses_degree"] = s.ulysses_degree;
      runs.push_back(run_on(DeviceKind::cpu, c));
      test::all_pass(runs.back());
    }
    for (size_t w = 0; w < runs[0].runs.size(); ++w) {
      for (size_t rank = 0; rank < runs[0].runs[w].sent_bytes_fwd.size(); ++rank)  // no padding between blocks
        CHECK(runs[0].runs[w].sent_bytes_fwd[rank] <= runs[1].runs[w].sent_bytes_fwd[rank]);
      for (const char* tensor : {"O", "LSE", "dQ", "dK", "dV"}) {
        INFO(std::string(s.plugin), " kv heads ", s.kv_heads, " ", std::string(s.dtype), " at world size ",
             runs[0].runs[w].world_size, ": ", std::string(tensor));
        const double a = test::error_of(runs[0].runs[w], tensor), b = test::error_of(runs[1].runs[w], tensor);
        if (std::string(tensor) == "dQ" && !allgather) CHECK(a == doctest::Approx(b).epsilon(1e-3));
        else CHECK(a == b);
      }
    }
  }
}

TEST_CASE("ulysses, usp and allgather in FP8 on the CPU: inputs cross in FP8, outputs in bf16, amax reported") {
  for (const char* dtype : {"fp8_e4m3", "fp8_e5m2"})
    for (const char* plugin : {"ulysses", "usp", "allgather"}) {
      INFO(std::string(plugin), " ", std::string(dtype));
      auto c = dense_case(plugin, {1, 2, 4}, 256, 8, 4, 32, true, dtype);
      c.problem.batch = 3;
      if (std::string(plugin) != "allgather") c.params["taper"] = std::string("on");
      if (std::string(plugin) == "usp") c.params["ulysses_degree"] = int64_t{2};
      attnhost::CaseResult r = run_on(DeviceKind::cpu, c);
      test::all_pass(r);
      test::error_does_not_grow(r);
      for (const auto& run : r.runs) {
        CHECK(test::error_of(run, "O") < 4e-3);
        CHECK(run.check.amax.find("(reported, exact)") != std::string::npos);
      }
    }
  // One kv head replicated on every rank: its fp32 sums rounded to bf16 once, home.
  attnhost::CaseResult mqa = run_on(DeviceKind::cpu, dense_case("ulysses", {1, 2, 4}, 128, 8, 1, 16, true, "fp8_e4m3"));
  test::all_pass(mqa);
  test::error_does_not_grow(mqa);
  // Q, K, V and dO cross in one byte an element, O, dQ, dK and dV in two (world size 2, 96 tokens).
  const uint64_t B = 2, n = 48, D = 16;
  auto u = dense_case("ulysses", {2}, 96, 4, 2, 16, true, "fp8_e4m3");
  attnhost::CaseResult bytes = run_on(DeviceKind::cpu, u);
  test::all_pass(bytes);
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(bytes.runs[0].sent_bytes_fwd[rank] == B * n * D * (2 + 1 + 1 + 2 * 2) + B * 2 * n * 4);
    CHECK(bytes.runs[0].sent_bytes_bwd[rank] == B * n * D * (2 + (2 + 1 + 1) * 2));
  }
}

TEST_CASE("ulysses: fewer kv heads than ranks are replicated, their gradients summed") {
  attnhost::CaseResult mqa = run_on(DeviceKind::cpu, dense_case("ulysses", {1, 2, 4}, 128, 8, 1, 16, true));
  test::all_pass(mqa);
  test::error_does_not_grow(mqa);
  test::all_pass(run_on(DeviceKind::cpu, dense_case("ulysses", {4}, 128, 8, 2, 16, false)));
}

TEST_CASE("ulysses: packed documents, one call with a segment a document, causal, full and a window") {
  for (const auto& [causal, left] : {std::pair{true, int64_t{-1}}, std::pair{false, int64_t{-1}}, std::pair{true, int64_t{9}}}) {
    auto c = dense_case("ulysses", {1, 2, 4}, 1, 8, 4, 32, causal);
    attnhost::suite::SeqlenSpec lengths;
    lengths.lengths = {37, 1, 0, 90, 5, 64};  // an empty document, one of one token, lengths no world size divides
    attnhost::suite::detail::apply_varlen(c.problem, lengths);
    c.problem.window_left = left;
    attnhost::CaseResult r = run_on(DeviceKind::cpu, c);
    test::all_pass(r);
    test::error_does_not_grow(r);
  }
  auto usp = dense_case("usp", {4}, 1, 8, 4, 32, true);
  attnhost::suite::SeqlenSpec lengths;
  lengths.lengths = {100, 28};
  attnhost::suite::detail::apply_varlen(usp.problem, lengths);
  usp.params["ulysses_degree"] = int64_t{2};
  CHECK(run_on(DeviceKind::cpu, usp).runs[0].error ==
        "plugin 'usp' refused the problem: packed documents take one Ulysses group of every rank (ulysses_degree 2 "
        "leaves a ring of 2 groups)");
}

TEST_CASE("ulysses and usp refuse heads that do not cut, in one line naming the numbers") {
  auto heads = run_on(DeviceKind::cpu, dense_case("ulysses", {3}, 96, 8, 8, 16, true));
  CHECK(heads.runs[0].status == "UNSUPPORTED");
  CHECK(heads.runs[0].error == "plugin 'ulysses' refused the problem: 8 query heads do not divide among 3 ranks of a "
                               "Ulysses group (heads_q must be a multiple of the group size)");
  auto kv = run_on(DeviceKind::cpu, dense_case("ulysses", {4}, 96, 12, 6, 16, true));
  CHECK(kv.runs[0].error == "plugin 'ulysses' refused the problem: 6 kv heads cannot be cut among 4 ranks of a Ulysses "
                            "group, nor replicated evenly (one must divide the other)");
  auto degree = dense_case("usp", {4}, 96, 8, 8, 16, true);
  degree.params["ulysses_degree"] = int64_t{3};
  CHECK(run_on(DeviceKind::cpu, degree).runs[0].error ==
        "plugin 'usp' refused the problem: a Ulysses group of 3 ranks does not divide world size 4");
}

TEST_CASE("usp: a Ulysses group inside a zigzag ring (2 x 2), a ring of groups, and a group of one") {
  for (int64_t u : {1, 2, 4}) {
    auto c = dense_case("usp", {1, 2, 4}, 256, 8, 4, 32, true);
    c.params["ulysses_degree"] = u;
    attnhost::CaseResult r = run_on(DeviceKind::cpu, c);
    test::all_pass(r);
    test::error_does_not_grow(r);
  }
  auto full = dense_case("usp", {1, 4}, 250, 4, 2, 16, false);  // a contiguous ring of groups, padding
  full.params["ulysses_degree"] = int64_t{2};
  attnhost::CaseResult r = run_on(DeviceKind::cpu, full);
  test::all_pass(r);
  test::error_does_not_grow(r);
  auto window = dense_case("usp", {4}, 256, 4, 4, 16, true);
  window.problem.window_left = 30;
  window.params["ulysses_degree"] = int64_t{2};
  test::all_pass(run_on(DeviceKind::cpu, window));
}

TEST_CASE("allgather: causal (zigzag chunks), full, a window, GQA, groups of heads, at world sizes 1 to 4") {
  // The backward cut by keys (each rank's keys against the gathered rows that reach them) and by
  // rows (each rank's rows against the gathered keys); auto takes keys where the heads are MHA.
  for (const char* backward : {"keys", "rows"}) {
    INFO("backward by ", std::string(backward));
    const auto allgather = [&](std::vector<int> sizes, int64_t seqlen, int32_t heads, int32_t kv_heads, int32_t dim,
                               bool causal, const char* dtype = "bf16") {
      auto c = dense_case("allgather", sizes, seqlen, heads, kv_heads, dim, causal, dtype);
      c.params["backward"] = std::string(backward);
      return c;
    };
    for (bool causal : {true, false}) {
      attnhost::CaseResult r = run_on(DeviceKind::cpu, allgather({1, 2, 3, 4}, 240, 8, 4, 32, causal));
      test::all_pass(r);
      test::error_does_not_grow(r);
      for (const auto& run : r.runs)  // zigzag chunks balance the causal work, as contiguous ones the full
        CHECK(static_cast<double>(run.max_rank_pairs) * run.world_size / run.total_pairs < 1.02);
    }
    test::all_pass(run_on(DeviceKind::cpu, allgather({1, 2, 3, 4}, 240, 8, 8, 32, true)));  // MHA
    auto window = allgather({1, 2, 3}, 250, 4, 2, 16, true);
    window.problem.window_left = 33;
    test::all_pass(run_on(DeviceKind::cpu, window));
    auto groups = allgather({2, 4}, 128, 8, 4, 16, true);
    groups.params["head_groups"] = int64_t{4};  // (by keys, tapered: groups of 1, 2, 2, 2 and 1 kv heads)
    test::all_pass(run_on(DeviceKind::cpu, groups));
    groups.params["taper"] = std::string("off");
    test::all_pass(run_on(DeviceKind::cpu, groups));
    // Slots reused by later groups, whose gradients are written, not added into (by rows), and
    // whose dQ is zeroed again (by keys): full (one range a rank), and a window (two ranges whose
    // reaches overlap without one holding the other).
    auto full_groups = allgather({2, 3}, 120, 8, 4, 16, false);
    full_groups.params["head_groups"] = int64_t{4};
    test::all_pass(run_on(DeviceKind::cpu, full_groups));
    auto window_groups = allgather({2, 3}, 180, 8, 8, 16, true);
    window_groups.problem.window_left = 29;
    window_groups.params["head_groups"] = int64_t{4};
    test::all_pass(run_on(DeviceKind::cpu, window_groups));
    auto deterministic = allgather({2, 3}, 128, 8, 4, 16, true);  // every call on one stream
    deterministic.problem.deterministic = 1;
    deterministic.params["head_groups"] = int64_t{2};
    test::all_pass(run_on(DeviceKind::cpu, deterministic));
    test::all_pass(run_on(DeviceKind::cpu, allgather({1, 2}, 128, 4, 4, 24, true, "fp16")));
  }
  // Packed messages carry no rows: a backward by keys with them is refused in one line.
  auto packed = dense_case("allgather", {2}, 128, 4, 4, 24, true);
  packed.params["exchange"] = std::string("packed");
  packed.params["backward"] = std::string("keys");
  const attnhost::CaseResult refused = run_on(DeviceKind::cpu, packed);
  REQUIRE(!refused.runs.empty());
  CHECK(refused.runs[0].error.find("backward=keys") != std::string::npos);
}

TEST_CASE("allgather: auto groups keep a rank's memory within 1.5x its working set plus one gathered group") {
  // B=2, S=512, 24 heads of 32 at world size 2. A rank's working set is Q, K, V, O, dO, dQ, dK, dV
  // and LSE; by rows, groups of 3 kv heads (8 groups) fit the rule. While a rank also counted a
  // message from itself it never had, auto took 12 groups of 2, below the memory of explicit 8.
  auto c = dense_case("allgather", {2}, 512, 24, 24, 32, true);
  c.params["backward"] = std::string("rows");
  std::map<int64_t, attnhost::RunResult> runs = test::runs_by(c, "head_groups", {0, 8, 12});
  const double tensor = 2.0 * 256 * 24 * 32 * 2, lse = 2.0 * 24 * 256 * 4;  // a rank's: B x tokens x heads x D x bf16
  const double working_set = 8 * tensor + lse, gathered = 2 * (2.0 * 512 * 3 * 32 * 2);  // K and V of a group of 3
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank ", rank);
    CHECK(runs[0].peak_bytes[rank] <= 1.5 * working_set + gathered);
    CHECK(runs[0].peak_bytes[rank] >= runs[8].peak_bytes[rank]);  // the backward's slots hold 3 kv heads
    CHECK(runs[8].peak_bytes[rank] > runs[12].peak_bytes[rank]);
  }
  // By keys a slot holds Q and dO of a group's query heads and their fp32 dQ, no fp32 dK and dV:
  // groups of 6 heads (4 groups) fit, against one gathered group's Q and dO.
  c.params["backward"] = std::string("keys");
  runs = test::runs_by(c, "head_groups", {0, 4, 6});
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank ", rank, ", by keys");
    CHECK(runs[0].peak_bytes[rank] <= 1.5 * working_set + 2 * gathered);
    CHECK(runs[0].peak_bytes[rank] == runs[4].peak_bytes[rank]);
    CHECK(runs[4].peak_bytes[rank] > runs[6].peak_bytes[rank]);
  }
}

TEST_CASE("bytes sent: ulysses moves Q, K, V and O once each way, allgather the K/V each rank reaches") {
  const uint64_t el = 2, B = 2, n = 48, D = 16;  // world size 2, 96 tokens, bf16
  auto u = dense_case("ulysses", {2}, 96, 4, 2, 16, true);
  u.timing.passes = {"fwd", "bwd"};
  attnhost::CaseResult r = run_on(DeviceKind::cpu, u);
  test::all_pass(r);
  for (int rank = 0; rank < 2; ++rank) {
    // forward: half of Q (2 of 4 heads), K, V (1 of 2) out; half of O and LSE back
    CHECK(r.runs[0].sent_bytes_fwd[rank] == B * n * D * el * (2 + 1 + 1 + 2) + B * 2 * n * 4);
    // backward (on the forward's tensors): dO in, dQ, dK, dV back
    CHECK(r.runs[0].sent_bytes_bwd[rank] == B * n * D * el * (2 + 2 + 1 + 1));
  }
  auto a = dense_case("allgather", {2}, 96, 4, 2, 16, true);
  a.timing.passes = {"fwd", "bwd"};
  attnhost::CaseResult g = run_on(DeviceKind::cpu, a);
  test::all_pass(g);
  // Causal, zigzag chunks [0, 24) [72, 96) on rank 0 and [24, 48) [48, 72) on rank 1: rank 1's rows
  // reach rank 0's first chunk alone, rank 0's last chunk every key. So rank 0 sends half its K and
  // V and the fp32 partials of all rank 1's keys; rank 1 all its K and V and the partials of rank
  // 0's first chunk.
  const uint64_t kv = 2 * B * n * 2 * D * el, partials = 2 * B * n * 2 * D * 4;  // K and V of 2 kv heads
  CHECK(g.runs[0].sent_bytes_fwd[0] == kv / 2);
  CHECK(g.runs[0].sent_bytes_bwd[0] == kv / 2 + partials);
  CHECK(g.runs[0].sent_bytes_fwd[1] == kv);
  CHECK(g.runs[0].sent_bytes_bwd[1] == kv + partials / 2);
  // A window of 8 keys back: rank 1's first chunk reaches keys [16, 24) of rank 0's, rank 0's last
  // chunk keys [64, 72) of rank 1's; nothing else crosses.
  a.problem.window_left = 8;
  g = run_on(DeviceKind::cpu, a);
  test::all_pass(g);
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank ", rank);
    CHECK(g.runs[0].sent_bytes_fwd[rank] == kv * 8 / n);
    CHECK(g.runs[0].sent_bytes_bwd[rank] == (kv + partials) * 8 / n);
  }
  // By keys the backward gathers the rows that reach a rank's keys (Q and dO of 4 query heads, and
  // their LSE and delta) and sends home their fp32 dQ: rank 0's last chunk alone reaches rank 1's
  // keys, every row of rank 1's reaches rank 0's first chunk.
  a.problem.window_left = -1;
  a.params["backward"] = std::string("keys");
  g = run_on(DeviceKind::cpu, a);
  test::all_pass(g);
  const uint64_t rows = B * n * 4 * (2 * D * el + 2 * 4), dq = B * n * 4 * D * 4;  // n rows of 4 heads
  CHECK(g.runs[0].sent_bytes_bwd[0] == rows / 2 + dq);
  CHECK(g.runs[0].sent_bytes_bwd[1] == rows + dq / 2);
}

#if ATTNHOST_HAVE_CUDA
// Worlds of 2 and 4 ranks on whatever GPUs there are (one is enough): the many-rank paths on the
// GPU, the exchanges as copies. Ulysses and usp tapered (their first and last entries alone); the
// example's all-gather and reduce-scatter through the host.
TEST_CASE("gpu: ranks that share a GPU run every schedule's many-rank paths" * doctest::test_suite("gpu")) {
  REQUIRE_MESSAGE(attnhost::cuda_device_count() > 0, "no GPU visible");
  for (const char* plugin : {"ring", "zigzag", "ulysses", "usp", "allgather"}) {
    INFO(std::string(plugin));
    auto c = dense_case(plugin, {1, 2, 4}, 1024, 8, 4, 128, true);
    c.problem.batch = 3;
    if (std::string(plugin) == "ulysses" || std::string(plugin) == "usp") c.params["taper"] = std::string("on");
    if (std::string(plugin) == "usp") c.params["ulysses_degree"] = int64_t{2};
    attnhost::CaseResult r = test::run_shared(c, 4);
    test::all_pass(r);
    test::error_does_not_grow(r);
    REQUIRE(r.runs.size() == 3);
    CHECK(r.runs[2].world_size == 4);
  }
  auto hybrid = dense_case("ring", {2}, 1024, 4, 2, 128, true, "fp8_e4m3");
  hybrid.problem.grad_dtype = "fp8_e5m2";
  test::all_pass(test::run_shared(hybrid, 2));
  for (const char* plugin : {"ulysses", "usp", "allgather"}) {  // FP8 (usp: 2 x 2 at four ranks)
    auto fp8 = dense_case(plugin, {1, 2, 4}, 1024, 8, 4, 128, true, "fp8_e4m3");
    fp8.problem.batch = 2;
    if (std::string(plugin) != "allgather") fp8.params["taper"] = std::string("on");
    if (std::string(plugin) == "usp") fp8.params["ulysses_degree"] = int64_t{2};
    attnhost::CaseResult r = test::run_shared(fp8, 4);
    test::all_pass(r);
    test::error_does_not_grow(r);
    for (const auto& run : r.runs) CHECK(run.check.amax.find("(reported, exact)") != std::string::npos);
  }
  attnhost::CaseResult naive = test::run_shared(dense_case("naive_attention", {1, 2}, 256, 4, 2, 64, true), 2);
  for (const auto& run : naive.runs) CHECK_MESSAGE(run.status == "PASSED", run.error);
}

TEST_CASE("gpu: ulysses and usp and allgather on the GPUs against the float64 reference" * doctest::test_suite("gpu")) {
  const int gpus = attnhost::cuda_device_count();
  REQUIRE_MESSAGE(gpus > 0, "no GPU visible");
  std::vector<int> sizes = {1};
  if (gpus > 1) sizes.push_back(2);
  for (const char* plugin : {"ulysses", "usp", "allgather"})
    for (bool causal : {true, false}) {
      auto r = run_on(DeviceKind::cuda, dense_case(plugin, sizes, 1000, 8, 2, 128, causal));
      test::all_pass(r);
      test::error_does_not_grow(r);
    }
  for (int d : {64, 80, 96, 256})
    for (const char* plugin : {"ulysses", "allgather"})
      test::all_pass(run_on(DeviceKind::cuda, dense_case(plugin, sizes, 512, 4, 4, d, true, "fp16")));
  for (const char* plugin : {"ulysses", "allgather"}) {
    auto window = dense_case(plugin, sizes, 1024, 4, 4, 128, true);
    window.problem.window_left = 300;
    test::all_pass(run_on(DeviceKind::cuda, window));
  }
  test::all_pass(run_on(DeviceKind::cuda, dense_case("ulysses", sizes, 1024, 8, 1, 128, true)));  // replicated kv
  // The native kernels add dQ by atomics, so the backward's last step runs its columns side by side;
  // two head groups and three entries, tapered or not, make steps before it.
  for (const char* plugin : {"ulysses", "usp"})
    for (const char* taper : {"on", "off"})
      for (bool causal : {true, false}) {
        auto beside = dense_case(plugin, sizes, 1024, 8, 8, 128, causal);
        beside.problem.batch = 3;
        beside.params["engine"] = std::string("native");
        beside.params["taper"] = std::string(taper);
        auto r = run_on(DeviceKind::cuda, beside);
        test::all_pass(r);
        test::error_does_not_grow(r);
      }
  {  // partials in the dtype, which at head dim 80 the native kernels serve, query ranges side by side
    auto dtype_partials = dense_case("allgather", sizes, 1000, 8, 2, 80, true);
    dtype_partials.params["partials"] = std::string("dtype");
    test::all_pass(run_on(DeviceKind::cuda, dtype_partials));
    // At d128, 8192 tokens: a range's call over 4096 or 6144 keys runs native, but the last group's
    // calls cut by the keys' owner reach 2048, which cuDNN serves, adding by a pass: not side by side.
    auto cut = dense_case("allgather", sizes, 8192, 4, 2, 128, true);
    cut.params["partials"] = std::string("dtype");
    test::all_pass(run_on(DeviceKind::cuda, cut));
  }
  for (const char* backward : {"keys", "rows"})  // allgather's backward cut both ways, in two head groups
    for (bool causal : {true, false}) {
      INFO("allgather backward by ", std::string(backward), causal ? ", causal" : ", full");
      auto cut = dense_case("allgather", sizes, 8192, 4, 4, 128, causal);
      cut.params["backward"] = std::string(backward);
      cut.params["head_groups"] = int64_t{2};
      auto r = run_on(DeviceKind::cuda, cut);
      test::all_pass(r);
      test::error_does_not_grow(r);
    }
  for (const char* plugin : {"ulysses", "usp", "allgather"}) {  // packed messages, on the transport that moves blocks
    auto packed_messages = dense_case(plugin, sizes, 1000, 8, 2, 128, true);
    packed_messages.params["exchange"] = std::string("packed");
    packed_messages.problem.batch = 3;
    if (std::string(plugin) != "allgather") packed_messages.params["taper"] = std::string("on");
    auto r = run_on(DeviceKind::cuda, packed_messages);
    test::all_pass(r);
    test::error_does_not_grow(r);
  }
  auto packed = dense_case("ulysses", sizes, 1, 8, 2, 128, true);  // documents: segments on the device
  attnhost::suite::SeqlenSpec lengths;
  lengths.lengths = {700, 1, 0, 300, 1000, 47};
  attnhost::suite::detail::apply_varlen(packed.problem, lengths);
  test::all_pass(run_on(DeviceKind::cuda, packed));
}
#endif
