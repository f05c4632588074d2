#include "harness.h"

#include "suite/varlen.h"

#include <map>

using attnhost::DeviceKind;
using test::dense_case;
using test::run_on;

TEST_CASE("ring: causal, full, GQA, a window and lengths that do not divide, at world sizes 1 to 4") {
  for (bool causal : {true, false}) {
    attnhost::CaseResult r = run_on(DeviceKind::cpu, dense_case("ring", {1, 2, 3, 4}, 250, 4, 2, 32, causal));
    test::all_pass(r);
    test::error_does_not_grow(r);
  }
  auto window = dense_case("ring", {1, 2, 4}, 256, 4, 1, 16, true);
  window.problem.window_left = 40;
  window.problem.window_right = 0;
  test::all_pass(run_on(DeviceKind::cpu, window));
  auto both_sides = dense_case("ring", {1, 3}, 240, 2, 2, 16, false);
  both_sides.problem.window_left = 10;
  both_sides.problem.window_right = 70;
  test::all_pass(run_on(DeviceKind::cpu, both_sides));
  test::all_pass(run_on(DeviceKind::cpu, dense_case("ring", {1, 2}, 128, 2, 2, 24, true, "fp16")));
  auto fp32 = run_on(DeviceKind::cpu, dense_case("ring", {1, 2}, 128, 2, 2, 24, true, "fp32"));
  test::all_pass(fp32);
  CHECK(test::error_of(fp32.runs[1], "O") < 1e-5);
}

TEST_CASE("ring: a causal ring is imbalanced, a window skips blocks outside it") {
  attnhost::CaseResult r = run_on(DeviceKind::cpu, dense_case("ring", {4}, 256, 2, 2, 16, true));
  test::all_pass(r);
  // Rank 3 attends 4 blocks (one diagonal), rank 0 one diagonal: 3.5 / (16 / 4 / 2 + ...) ~ 1.75x the mean.
  const auto& run = r.runs[0];
  CHECK(static_cast<double>(run.max_rank_pairs) * 4 / run.total_pairs == doctest::Approx(1.75).epsilon(0.02));
  auto narrow = dense_case("ring", {4}, 256, 2, 2, 16, true);
  narrow.problem.window_left = 16;
  attnhost::CaseResult w = run_on(DeviceKind::cpu, narrow);
  test::all_pass(w);
  CHECK(w.runs[0].max_rank_pairs < run.max_rank_pairs / 3);
}

TEST_CASE("zigzag: causal at world sizes 1 to 4, balanced, errors that do not grow") {
  attnhost::CaseResult r = run_on(DeviceKind::cpu, dense_case("zigzag", {1, 2, 3, 4}, 240, 4, 2, 32, true));
  test::all_pass(r);
  test::error_does_not_grow(r);
  for (const auto& run : r.runs)  // every rank attends the same number of pairs, up to the diagonals
    CHECK(static_cast<double>(run.max_rank_pairs) * run.world_size / run.total_pairs < 1.02);
  test::all_pass(run_on(DeviceKind::cpu, dense_case("zigzag", {1, 2}, 128, 8, 1, 16, true, "fp16")));
}

TEST_CASE("zigzag takes a causal window: narrower and wider than a chunk, at world sizes 1 to 4") {
  for (int64_t left : {20, 70}) {  // chunks of 30 tokens at world size 4
    auto window = dense_case("zigzag", {1, 2, 3, 4}, 240, 4, 2, 32, true);
    window.problem.window_left = left;
    attnhost::CaseResult r = run_on(DeviceKind::cpu, window);
    test::all_pass(r);
    test::error_does_not_grow(r);
  }
  auto fp16 = dense_case("zigzag", {2}, 128, 8, 1, 16, true, "fp16");
  fp16.problem.window_left = 0;  // each query sees itself alone
  test::all_pass(run_on(DeviceKind::cpu, fp16));
  // Gradients home from two steps: at world size 4 rank 1's block (chunks 1 and 6) is reached at
  // step 1 (chunk 2) and step 3 (chunk 7), 38 of its 60 columns in all.
  auto two_steps = dense_case("zigzag", {4}, 240, 4, 2, 16, true, "fp32");
  two_steps.problem.window_left = 8;
  test::all_pass(run_on(DeviceKind::cpu, two_steps));
}

TEST_CASE("zigzag refuses what it cannot balance, before any allocation") {
  auto odd = run_on(DeviceKind::cpu, dense_case("zigzag", {3}, 250, 2, 2, 16, true));
  CHECK(odd.runs[0].status == "UNSUPPORTED");
  CHECK(odd.runs[0].error ==
        "plugin 'zigzag' refused the problem: sequence length 250 is not divisible by 2 x world size (6)");
  auto full = run_on(DeviceKind::cpu, dense_case("zigzag", {1}, 256, 2, 2, 16, false));
  CHECK(full.runs[0].error == "plugin 'zigzag' supports causal attention only");
  CHECK(run_on(DeviceKind::cpu, dense_case("ring", {2}, 256, 2, 2, 16, true)).runs[0].peak_bytes.size() == 2);
}

TEST_CASE("ring and zigzag under a window hold the keys it reaches, not whole blocks: no batch slices needed") {
  // Peak memory of a rank at world size 2, with batch_slices auto (0) and forced to one slice.
  const auto peaks = [](const std::string& plugin, int64_t window) {
    auto c = dense_case(plugin, {2}, 512, 4, 4, 32, true);
    c.problem.batch = 4;
    c.problem.window_left = window;
    std::vector<uint64_t> out;
    for (int64_t slices : {0, 1}) {
      c.params["batch_slices"] = slices;
      attnhost::CaseResult r = run_on(DeviceKind::cpu, c);
      test::all_pass(r);
      out.push_back(r.runs[0].peak_bytes[0]);
    }
    return out;
  };
  for (const std::string plugin : {"ring", "zigzag"}) {
    INFO(plugin);
    // 16 keys: 16-key receive buffers and gradients; one slice fits the memory rule.
    const std::vector<uint64_t> narrow = peaks(plugin, 16);
    CHECK(narrow[0] == narrow[1]);
    // 400 keys reach most of the other block: whole blocks travel with their fp32 gradients, and the
    // rule takes slices of the batch.
    const std::vector<uint64_t> wide = peaks(plugin, 400);
    CHECK(wide[0] < wide[1]);
    CHECK(narrow[1] < wide[1]);
  }
}

TEST_CASE("ring and zigzag without overlap give the same answers") {
  auto c = dense_case("zigzag", {2}, 128, 2, 2, 16, true);
  c.params["overlap"] = false;
  test::all_pass(run_on(DeviceKind::cpu, c));
  auto r = dense_case("ring", {3}, 129, 2, 2, 16, false);
  r.params["overlap"] = false;
  test::all_pass(run_on(DeviceKind::cpu, r));
}

TEST_CASE("ring and zigzag in batch slices: the same answers, and a rank's memory within 1.3x of its working set") {
  // Unsliced, at world size 2 a rank held 1.84x its working set (Q, K, V, O, dO, dQ, dK, dV and two
  // K/V blocks), since the ring's fp32 dQ and two travelling fp32 dK/dV pairs covered the batch.
  for (const std::string plugin : {"ring", "zigzag"}) {
    auto c = dense_case(plugin, {2}, 256, 4, 4, 32, true);
    c.problem.batch = 5;  // slices of 3 and 2 for two slices, of 2, 2 and 1 for three
    c.params["head_slices"] = int64_t{1};
    if (plugin == "zigzag") c.params["join"] = false;  // (a joined forward's later slices sum otherwise)
    const double q_bytes = 5.0 * 128 * 4 * 32 * 2;   // per rank: B x local tokens x heads x D x bf16
    const double working_set = 4 * q_bytes + 8 * q_bytes;  // Q O dO dQ, K V dK dV, two K/V blocks
    std::map<int64_t, attnhost::RunResult> runs = test::runs_by(c, "batch_slices", {1, 2, 3, 5, 0});
    for (int64_t slices : {2, 3, 5, 0})
      for (const char* tensor : {"O", "LSE", "dQ", "dK", "dV"}) {
        INFO(plugin, " ", std::string(tensor), " in ", slices, " slices");
        CHECK(test::error_of(runs[slices], tensor) == test::error_of(runs[1], tensor));  // the same values
      }
    for (int rank = 0; rank < 2; ++rank) {
      INFO(plugin, " rank ", rank);
      CHECK(runs[1].peak_bytes[rank] > 1.6 * working_set);
      CHECK(runs[0].peak_bytes[rank] <= 1.3 * working_set);  // batch_slices = 0: the fewest that fit
      CHECK(runs[3].peak_bytes[rank] < runs[2].peak_bytes[rank]);
    }
  }
  // At world size 1 nothing travels: one fp32 dK/dV pair, not two (it held both: 18 x Q's bytes).
  auto single = dense_case("ring", {1}, 256, 4, 4, 32, true);
  single.problem.batch = 5;
  const double q_bytes = 5.0 * 256 * 4 * 32 * 2;  // Q, K, V, O, dO, dQ, dK, dV; fp32 dQ, dK, dV
  CHECK(run_on(DeviceKind::cpu, single).runs[0].peak_bytes[0] <= 14.2 * q_bytes);  // (and LSE, delta)
  auto bad = dense_case("ring", {2}, 128, 2, 2, 16, true);
  bad.params["batch_slices"] = int64_t{-1};
  CHECK(run_on(DeviceKind::cpu, bad).runs[0].error ==
        "plugin 'ring' refused the problem: batch_slices must be 0 (auto) or more");
}

TEST_CASE("zigzag's forward joined at two ranks: the ring's bytes, errors alike, memory within 1.3x") {
  // From the second batch slice on, a rank gathers the keys its rows reach in sequence order and makes
  // one call a run of rows (the first slice runs the ring's two steps): the same pairs and messages,
  // no fp32 merge, so other roundings.
  auto c = dense_case("zigzag", {2}, 256, 4, 4, 32, true);
  c.problem.batch = 5;
  c.params["head_slices"] = int64_t{1};
  c.params["batch_slices"] = int64_t{3};
  std::map<bool, attnhost::RunResult> runs;
  for (bool join : {false, true}) {
    c.params["join"] = join;
    attnhost::CaseResult r = run_on(DeviceKind::cpu, c);
    test::all_pass(r);
    runs[join] = r.runs[0];
  }
  for (int rank = 0; rank < 2; ++rank) CHECK(runs[true].sent_bytes_fwd[rank] == runs[false].sent_bytes_fwd[rank]);
  CHECK(test::error_of(runs[true], "LSE") != test::error_of(runs[false], "LSE"));  // the joined calls ran
  for (const char* tensor : {"O", "LSE"}) {
    INFO(std::string(tensor));
    CHECK(test::error_of(runs[true], tensor) <= 1.1 * test::error_of(runs[false], tensor) + 1e-7);
  }
  // Its two key buffers counted, the slices the memory rule picks keep a rank within 1.3x.
  c.params["batch_slices"] = int64_t{0};
  c.params["join"] = true;
  attnhost::CaseResult r = run_on(DeviceKind::cpu, c);
  test::all_pass(r);
  const double q_bytes = 5.0 * 128 * 4 * 32 * 2, working_set = 4 * q_bytes + 8 * q_bytes;
  for (int rank = 0; rank < 2; ++rank) CHECK(r.runs[0].peak_bytes[rank] <= 1.3 * working_set);
}

TEST_CASE("ring and zigzag in head slices (a batch of one): the same answers, memory within 1.3x") {
  // Batch slices cannot help a batch of one, long-context training's usual case: the ring also runs
  // over slices of the key/value heads, each packed into buffers of its own and unpacked after.
  for (const std::string plugin : {"ring", "zigzag"}) {
    auto c = dense_case(plugin, {2}, 256, 10, 5, 32, true);  // GQA; two slices hold 3 and 2 K/V heads
    c.problem.batch = 1;
    const double q_bytes = 1.0 * 128 * 10 * 32 * 2, kv_bytes = q_bytes / 2;
    const double working_set = 4 * q_bytes + 8 * kv_bytes;
    std::map<int64_t, attnhost::RunResult> runs = test::runs_by(c, "head_slices", {1, 2, 0});
    for (int64_t slices : {2, 0})
      for (const char* tensor : {"O", "LSE", "dQ", "dK", "dV"}) {
        INFO(plugin, " ", std::string(tensor), " in ", slices, " head slices");
        CHECK(test::error_of(runs[slices], tensor) == test::error_of(runs[1], tensor));
      }
    for (int rank = 0; rank < 2; ++rank) {
      INFO(plugin, " rank ", rank);
      CHECK(runs[1].peak_bytes[rank] > 1.5 * working_set);
      CHECK(runs[0].peak_bytes[rank] <= 1.3 * working_set);
    }
  }
  // Both at once, and at world size 1 (nothing travels; the packing alone).
  auto both = dense_case("ring", {1, 3}, 192, 4, 4, 16, false);
  both.params["batch_slices"] = int64_t{2};
  both.params["head_slices"] = int64_t{3};
  test::all_pass(run_on(DeviceKind::cpu, both));
}

#if ATTNHOST_HAVE_CUDA
TEST_CASE("gpu: ring and zigzag on the GPUs against the float64 reference" * doctest::test_suite("gpu")) {
  const int gpus = attnhost::cuda_device_count();
  REQUIRE_MESSAGE(gpus > 0, "no GPU visible");
  std::vector<int> sizes = {1};
  if (gpus > 1) sizes.push_back(2);
  for (bool causal : {true, false}) {
    auto r = run_on(DeviceKind::cuda, dense_case("ring", sizes, 1000, 8, 2, 128, causal));
    test::all_pass(r);
    test::error_does_not_grow(r);
  }
  for (int d : {64, 80, 96, 256}) test::all_pass(run_on(DeviceKind::cuda, dense_case("ring", sizes, 512, 4, 4, d, true, "fp16")));
  for (const char* plugin : {"ring", "zigzag"})
    for (int64_t left : {100, 300}) {  // gradients home (100) or travelling (300, at 512 keys a rank)
      auto window = dense_case(plugin, sizes, 1024, 4, 4, 128, true);
      window.problem.window_left = left;
      test::all_pass(run_on(DeviceKind::cuda, window));
    }
  auto z = run_on(DeviceKind::cuda, dense_case("zigzag", sizes, 1024, 8, 2, 128, true));
  test::all_pass(z);
  test::error_does_not_grow(z);
  for (const char* plugin : {"ring", "zigzag"}) {  // slices: offsets into every tensor, packing, streams across slices
    auto sliced = dense_case(plugin, sizes, 1024, 8, 4, 128, true);
    sliced.problem.batch = 3;
    sliced.params["batch_slices"] = int64_t{2};
    sliced.params["head_slices"] = int64_t{3};
    test::all_pass(run_on(DeviceKind::cuda, sliced));
  }
}
#endif

TEST_CASE("bytes sent: a forward sends each K/V block on (P - 1 hops), a backward also its dK/dV (fp32, dtype home)") {
  // Measured per pass; fwd_bwd must not overwrite the forward's figure (it once did).
  auto c = dense_case("ring", {3}, 96, 4, 2, 16, false);
  c.timing.passes = {"fwd", "bwd", "fwd_bwd"};
  attnhost::CaseResult r = run_on(DeviceKind::cpu, c);
  test::all_pass(r);
  const uint64_t kv_block = 2ull * 32 * 2 * 16 * 2;  // B x local tokens x Hkv x D x bf16
  const uint64_t grads = 2 * kv_block * 2 * 2 + 2 * kv_block;  // dK, dV: two hops in fp32, the last (home) in bf16
  for (int rank = 0; rank < 3; ++rank) {
    CHECK(r.runs[0].sent_bytes_fwd[rank] == 2 * kv_block * 2);  // K and V, two hops
    CHECK(r.runs[0].sent_bytes_bwd[rank] == 2 * kv_block * 2 + grads);
  }
  // Causal: a block travels only as far as the last rank that attends it. Rank 0's goes to ranks 1
  // and 2, rank 1's to rank 2, rank 2's nowhere; the gradients still go round.
  c.problem.causal = true;
  attnhost::CaseResult causal = run_on(DeviceKind::cpu, c);
  test::all_pass(causal);
  const uint64_t blocks[] = {1, 2, 0};  // hops each rank makes: 0 -> 1; 1 -> 2 twice (its block, then rank 0's)
  for (int rank = 0; rank < 3; ++rank) {
    INFO("rank ", rank);
    CHECK(causal.runs[0].sent_bytes_fwd[rank] == 2 * kv_block * blocks[rank]);
    CHECK(causal.runs[0].sent_bytes_bwd[rank] == 2 * kv_block * blocks[rank] + grads);
  }
}

TEST_CASE("ring and zigzag in FP8 on the CPU: K/V travel in FP8, gradients home in bf16, at world sizes 1 to 4") {
  for (const char* dtype : {"fp8_e4m3", "fp8_e5m2"})
    for (const char* plugin : {"ring", "zigzag"}) {
      INFO(std::string(plugin), " ", std::string(dtype));
      attnhost::CaseResult r = run_on(DeviceKind::cpu, dense_case(plugin, {1, 2, 3, 4}, 240, 4, 2, 32, true, dtype));
      test::all_pass(r);
      test::error_does_not_grow(r);
      // The same FP8 values in fp32 arithmetic: what is left is the bf16 outputs' rounding. The
      // outputs' amax reported on every rank, equal to the outputs'.
      for (const auto& run : r.runs) {
        CHECK(test::error_of(run, "O") < 4e-3);
        CHECK(run.check.amax.find("(reported, exact)") != std::string::npos);
      }
    }
  // Head slices (a batch of one), windows whose gradients go home, and a full ring: their buffers
  // hold bf16 outputs beside FP8 inputs.
  auto sliced = dense_case("ring", {2, 3}, 96, 8, 4, 16, true, "fp8_e4m3");
  sliced.problem.batch = 1;
  sliced.params["head_slices"] = int64_t{2};
  test::all_pass(run_on(DeviceKind::cpu, sliced));
  auto window = dense_case("zigzag", {2, 4}, 256, 4, 2, 16, true, "fp8_e4m3");
  window.problem.window_left = 12;
  test::all_pass(run_on(DeviceKind::cpu, window));
  test::all_pass(run_on(DeviceKind::cpu, dense_case("ring", {3}, 96, 4, 2, 16, false, "fp8_e5m2")));
  // K/V hops carry one byte an element: half of bf16's (the bf16 test above), dK/dV unchanged.
  auto c = dense_case("ring", {3}, 96, 4, 2, 16, false, "fp8_e4m3");
  attnhost::CaseResult b = run_on(DeviceKind::cpu, c);
  test::all_pass(b);
  const uint64_t kv_block = 2ull * 32 * 2 * 16;  // B x local tokens x Hkv x D x 1 byte
  const uint64_t grads = 2 * (2 * kv_block) * 2 * 2 + 2 * (2 * kv_block);  // two hops in fp32, home in bf16
  for (int rank = 0; rank < 3; ++rank) {
    CHECK(b.runs[0].sent_bytes_fwd[rank] == 2 * kv_block * 2);
    CHECK(b.runs[0].sent_bytes_bwd[rank] == 2 * kv_block * 2 + grads);
  }
}

TEST_CASE("ring and zigzag take the hybrid FP8 recipe (dO in e5m2 beside e4m3 inputs), other plugins refuse it") {
  for (const char* plugin : {"ring", "zigzag"}) {
    INFO(std::string(plugin));
    auto hybrid = dense_case(plugin, {1, 2, 3}, 240, 4, 2, 32, true, "fp8_e4m3");
    hybrid.problem.grad_dtype = "fp8_e5m2";
    attnhost::CaseResult h = run_on(DeviceKind::cpu, hybrid);
    test::all_pass(h);
    test::error_does_not_grow(h);
    // dO alone changes format: the forward is the e4m3 problem's, value for value.
    attnhost::CaseResult e4m3 = run_on(DeviceKind::cpu, dense_case(plugin, {1}, 240, 4, 2, 32, true, "fp8_e4m3"));
    CHECK(test::error_of(h.runs[0], "O") == test::error_of(e4m3.runs[0], "O"));
    for (const auto& run : h.runs) CHECK(run.check.amax.find("(reported, exact)") != std::string::npos);
  }
  auto varlen = dense_case("varlen", {2}, 1, 4, 2, 32, true, "fp8_e4m3");  // FP8 inputs, not the hybrid
  attnhost::suite::SeqlenSpec lengths;
  lengths.lengths = {100, 60};
  attnhost::suite::detail::apply_varlen(varlen.problem, lengths);
  varlen.problem.grad_dtype = "fp8_e5m2";
  attnhost::CaseResult v = run_on(DeviceKind::cpu, varlen);
  CHECK(v.runs[0].status == "UNSUPPORTED");
  CHECK(v.runs[0].error == "plugin 'varlen' does not take dO in fp8_e5m2 beside fp8_e4m3 inputs (grad_dtype)");
}

TEST_CASE("bytes sent: a window sends only the keys it reaches, and their gradients go straight home") {
  // 256 tokens on two ranks, a window of 16: rank 1's first queries reach rank 0's last 16 keys.
  const uint64_t columns = 2ull * 16 * 2 * 16;  // B x 16 tokens x Hkv x D, per tensor
  auto ring = dense_case("ring", {2}, 256, 4, 2, 16, true);
  ring.problem.window_left = 16;
  ring.timing.passes = {"fwd", "bwd"};
  attnhost::CaseResult r = run_on(DeviceKind::cpu, ring);
  test::all_pass(r);
  CHECK(r.runs[0].sent_bytes_fwd[0] == 2 * columns * 2);  // K and V in bf16
  CHECK(r.runs[0].sent_bytes_fwd[1] == 0);
  CHECK(r.runs[0].sent_bytes_bwd[0] == 2 * columns * 2);
  CHECK(r.runs[0].sent_bytes_bwd[1] == 2 * columns * 4);  // dK and dV of those keys in fp32, home
  // Zigzag (chunks of 64): rank 0's late chunk reaches the last 16 keys of chunk 2 (rank 1's), rank
  // 1's first chunk the last 16 of chunk 0 (rank 0's): 16 keys each way, in both passes.
  auto zigzag = dense_case("zigzag", {2}, 256, 4, 2, 16, true);
  zigzag.problem.window_left = 16;
  zigzag.timing.passes = {"fwd", "bwd"};
  attnhost::CaseResult z = run_on(DeviceKind::cpu, zigzag);
  test::all_pass(z);
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(z.runs[0].sent_bytes_fwd[rank] == 2 * columns * 2);
    CHECK(z.runs[0].sent_bytes_bwd[rank] == 2 * columns * 2 + 2 * columns * 4);
  }
}

TEST_CASE("bytes sent: a window's backward after its forward on two ranks sends no K/V, the forward's hop kept") {
  // As above in one batch slice: the forward's hop (rank 0's last 16 keys to rank 1) is the
  // backward's, in the same receive buffer, so the backward moves only the gradients home. In two
  // slices the backward's first slice is not the block the forward received last: it is sent again.
  const uint64_t columns = 2ull * 16 * 2 * 16;  // B x 16 tokens x Hkv x D, per tensor
  auto ring = dense_case("ring", {2}, 256, 4, 2, 16, true);
  ring.problem.window_left = 16;
  ring.params["head_slices"] = int64_t{1};
  std::map<int64_t, attnhost::RunResult> runs = test::runs_by(ring, "batch_slices", {1, 2});
  for (int64_t slices : {1, 2}) {
    INFO("batch slices ", slices);
    const attnhost::RunResult& r = runs[slices];
    CHECK(r.sent_bytes_fwd[0] == 2 * columns * 2);
    CHECK(r.sent_bytes_bwd[0] == (slices == 1 ? 0 : 2 * columns * 2));
    CHECK(r.sent_bytes_bwd[1] == 2 * columns * 4);
  }
  for (const char* tensor : {"dQ", "dK", "dV"}) {
    INFO(std::string(tensor));
    CHECK(test::error_of(runs[1], tensor) == test::error_of(runs[2], tensor));
  }
}

TEST_CASE("bytes sent: two ranks over batch slices take their own block last, so only shares go home, in fp32") {
  // Zigzag, 128 tokens (chunks of 32), B=2, 2 kv heads, D=16. In one slice the gradients travel:
  // each rank's own block's go out in fp32 and come back summed in bf16. In two, a rank sends what it
  // computed of the other's block home (fp32, the keys it reaches), and its own block's call adds
  // what came home of it: rank 0 reaches both of rank 1's chunks, rank 1 only rank 0's first. And
  // the forward sends the backward's first slice's block (one entry) at its end, so a backward after
  // its forward sends only the second's.
  const uint64_t chunk = 2ull * 32 * 2 * 16;  // B x 32 tokens x Hkv x D, per tensor
  auto c = dense_case("zigzag", {2}, 128, 4, 2, 16, true);
  c.params["head_slices"] = int64_t{1};
  c.params["join"] = false;  // (the same forward at both slicings: the backward's sums compared)
  std::map<int64_t, attnhost::RunResult> runs = test::runs_by(c, "batch_slices", {1, 2});
  const uint64_t kv_sent[] = {2 * chunk * 2, 2 * 2 * chunk * 2};  // K and V in bf16: rank 0 one chunk, rank 1 two
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank ", rank);
    CHECK(runs[1].sent_bytes_bwd[rank] == kv_sent[rank] + 2 * 2 * chunk * 4 + 2 * 2 * chunk * 2);
    CHECK(runs[2].sent_bytes_bwd[rank] == kv_sent[rank] / 2 + 2 * (rank == 0 ? 2 : 1) * chunk * 4);
    CHECK(runs[1].sent_bytes_fwd[rank] == kv_sent[rank]);
    CHECK(runs[2].sent_bytes_fwd[rank] == kv_sent[rank] + kv_sent[rank] / 2);
  }
  for (const char* tensor : {"dQ", "dK", "dV"}) {
    INFO(std::string(tensor));
    CHECK(test::error_of(runs[2], tensor) == test::error_of(runs[1], tensor));  // the same sums, added in fp32
  }
}

#if ATTNHOST_HAVE_CUDA
// FP8 e4m3 on a Hopper GPU: the core's e4m3 forward, its backward on widened inputs; K/V travel in
// FP8. Every FP8 head dim, a window, GQA, and a full ring.
TEST_CASE("gpu: ring and zigzag in FP8 e4m3 on Hopper GPUs against the float64 reference" * doctest::test_suite("gpu")) {
  const int gpus = attnhost::cuda_device_count();
  REQUIRE_MESSAGE(gpus > 0, "no GPU visible");
  std::vector<int> sizes = {1};
  if (gpus > 1) sizes.push_back(2);
  // World size 2 rounds P to e4m3 against other running maxima than world size 1 (each call starts
  // its own), so the two errors are alike, not equal: sampled over the default 8 key columns, dK's
  // differed by 14% at d256 (zigzag). 64 columns and rows measure the tensors, not the sample.
  const auto fp8_case = [&](const char* plugin, int64_t seqlen, int32_t heads, int32_t kv_heads, int32_t d,
                            bool causal) {
    auto c = dense_case(plugin, sizes, seqlen, heads, kv_heads, d, causal, "fp8_e4m3");
    c.check.key_columns = c.check.query_rows = 64;
    return c;
  };
  for (const char* plugin : {"ring", "zigzag"})
    for (int d : {64, 128, 256}) {
      INFO(std::string(plugin), " head dim ", d);
      auto r = run_on(DeviceKind::cuda, fp8_case(plugin, 1000, 4, 2, d, true));
      test::all_pass(r);
      test::error_does_not_grow(r);
      for (const auto& run : r.runs) CHECK(run.check.amax.find("(reported, exact)") != std::string::npos);
    }
  auto window = dense_case("zigzag", sizes, 1024, 4, 4, 128, true, "fp8_e4m3");
  window.problem.window_left = 100;
  test::all_pass(run_on(DeviceKind::cuda, window));
  test::all_pass(run_on(DeviceKind::cuda, dense_case("ring", sizes, 768, 8, 1, 128, false, "fp8_e4m3")));
  auto e5m2 = run_on(DeviceKind::cuda, dense_case("ring", {1}, 256, 2, 2, 128, true, "fp8_e5m2"));
  CHECK(e5m2.runs[0].status == "UNSUPPORTED");
  for (const char* plugin : {"ring", "zigzag"}) {  // the hybrid recipe: dO widened from e5m2
    auto hybrid = fp8_case(plugin, 1000, 4, 2, 128, true);
    hybrid.problem.grad_dtype = "fp8_e5m2";
    auto r = run_on(DeviceKind::cuda, hybrid);
    test::all_pass(r);
    test::error_does_not_grow(r);
  }
}

// A slice's last gradients go home from the communication stream while the next slice's first step
// computes: that step must not write a pair the stream still reads (the pair sent at the step
// before the last; at an odd world size the last step's own), nor the FP8 staging. Four slices of
// one entry at world sizes 2 and 3 (ranks sharing the GPUs where there are fewer), long enough that
// a hop overlaps the next slice's first step (B=4 S=16384 H=32 showed it on two H200s).
TEST_CASE("gpu: ring and zigzag over batch slices send every slice's gradients home intact" *
          doctest::test_suite("gpu")) {
  const int gpus = attnhost::cuda_device_count();
  REQUIRE_MESSAGE(gpus > 0, "no GPU visible");
  for (const char* dtype : {"bf16", "fp8_e4m3"})
    for (const char* plugin : {"ring", "zigzag"}) {
      INFO(std::string(plugin), " ", std::string(dtype));
      auto c = dense_case(plugin, {1, 2, 3}, 12288, 32, 32, 128, true, dtype);
      c.problem.batch = 4;
      c.params["batch_slices"] = int64_t{4};
      c.timing.timing_runs = 3;
      auto r = test::run_shared(c, (3 + gpus - 1) / gpus);
      test::all_pass(r);
      test::error_does_not_grow(r);
    }
}

TEST_CASE("gpu: the profiler timing method lists the pass's kernels from CUPTI" * doctest::test_suite("gpu")) {
  REQUIRE_MESSAGE(attnhost::cuda_device_count() > 0, "no GPU visible");
  auto c = dense_case("ring", {1}, 8192, 16, 16, 128, true);  // long enough for the kernels to dominate
  c.timing.method = "profiler";
  c.timing.timing_runs = 2;
  attnhost::CaseResult r = run_on(DeviceKind::cuda, c);
  test::all_pass(r);
  for (const auto& p : r.runs[0].passes) {
    INFO(p.pass);
    REQUIRE_FALSE(p.kernels.empty());
    double share = 0;
    for (const auto& k : p.kernels) {
      CHECK(k.launches > 0);
      CHECK(k.total_ms > 0);
      share += k.share;
      MESSAGE(p.pass, ": ", k.name, " x", k.launches, " ", k.total_ms, " ms, share ", k.share);
    }
    // Within the pass (one stream at world size 1). How much of it they fill is a time, not a
    // property: it was asserted above 0.5 until a host stall in a launch left 0.19.
    CHECK(share > 0);
    CHECK(share < 1.05);
  }
}
#endif
