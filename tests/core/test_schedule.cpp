// What every schedule is made with (attncore/plugin/schedule.h) and the one allocation it carves
// its buffers from (attncore/plugin/workspace.h). Pure logic: runs everywhere.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <utility>

#include "attncore/plugin/ring.h"
#include "attncore/plugin/ring_plugin.h"
#include "attncore/plugin/schedule.h"
#include "attncore/plugin/ulysses.h"
#include "attncore/plugin/workspace.h"

#include <cstdint>
#include <vector>

using namespace attncore::plugin;

namespace {

attnhost_param_value param(const char* name, int32_t type, int64_t int_value, const char* string_value = nullptr) {
  attnhost_param_value v{};
  v.struct_size = sizeof(v);
  v.name = name;
  v.type = type;
  v.int_value = int_value;
  v.string_value = string_value;
  return v;
}

attnhost::Problem problem(const std::vector<attnhost_param_value>& params, int32_t device) {
  attnhost_problem p{};
  p.struct_size = sizeof(p);
  p.rank = 1;
  p.world_size = 4;
  p.device_type = device;
  p.params = params.data();
  p.num_params = static_cast<int32_t>(params.size());
  return attnhost::Problem(p);
}

}  // namespace

TEST_CASE("schedule options come from the problem, and a parameter a plugin does not take keeps its default") {
  const std::vector<attnhost_param_value> all = {
      param("overlap", ATTNHOST_PARAM_BOOL, 0), param("cpu_accumulate", ATTNHOST_PARAM_STRING, 0, "fp64"),
      param("engine", ATTNHOST_PARAM_STRING, 0, "cudnn"), param("partials", ATTNHOST_PARAM_STRING, 0, "dtype")};
  const ScheduleOptions o = schedule_options(problem(all, ATTNHOST_DEVICE_CUDA), attnhost::Host{});
  CHECK(o.rank == 1);
  CHECK(o.world_size == 4);
  CHECK(o.cuda);
  CHECK_FALSE(o.overlap);
  CHECK(o.cpu_fp64);
  CHECK(o.engine.choice == EngineChoice::cudnn);
  CHECK(o.engine.dtype_partials);

  const ScheduleOptions none = schedule_options(problem({}, ATTNHOST_DEVICE_CPU), attnhost::Host{});
  CHECK_FALSE(none.cuda);
  CHECK(none.overlap);
  CHECK_FALSE(none.cpu_fp64);
  CHECK(none.engine.choice == EngineChoice::native);
  CHECK_FALSE(none.engine.dtype_partials);
}

namespace {

// A schedule's buffers: one both passes take first, then one of the forward's or two of the backward's.
struct Buffers {
  char* shared = nullptr;
  float* forward = nullptr;
  float *backward_a = nullptr, *backward_b = nullptr;
};

Buffers layout(Carver& c, Pass pass) {
  Buffers b;
  b.shared = c.take(100);
  if (pass == Pass::forward) b.forward = c.take<float>(1000);
  else {
    b.backward_a = c.take<float>(300);
    b.backward_b = c.take<float>(257);
  }
  return b;
}

}  // namespace

TEST_CASE("a workspace is as large as its larger pass, its buffers start on 256 bytes, a shared one at one address") {
  CHECK(Workspace<Buffers>::bytes(layout) == 256 + 1024);  // forward: 256 + 1024; backward: 256 + 512 + 512
  std::vector<char> memory(Workspace<Buffers>::bytes(layout) + 256);
  char* base = memory.data() + (256 - reinterpret_cast<uintptr_t>(memory.data()) % 256) % 256;
  Carver f(base), b(base);
  const Buffers forward = layout(f, Pass::forward), backward = layout(b, Pass::backward);
  CHECK(forward.shared == base);
  CHECK(backward.shared == base);
  CHECK(reinterpret_cast<char*>(forward.forward) == base + 256);
  CHECK(reinterpret_cast<char*>(backward.backward_a) == base + 256);
  CHECK(reinterpret_cast<char*>(backward.backward_b) == base + 256 + 512);
  CHECK(b.used() == 256 + 512 + 512);
  Carver counting;
  CHECK(layout(counting, Pass::forward).shared == nullptr);
  CHECK(counting.used() == 256 + 1024);
}

namespace {

// GQA 16:1 at d64, a rank's half of B=2 S=16384 with 32 query heads on 2 kv heads, causal.
RingShape gqa_16_to_1_half() {
  RingShape s;
  s.batch = 2;
  s.heads_q = 32;
  s.heads_kv = 2;
  s.head_dim = 64;
  s.local_q = s.local_kv = 8192;
  s.mask.seqlen = 16384;
  s.mask.causal = true;
  return s;
}

}  // namespace

// GQA 16:1 at d64 on two ranks: the fp32 dQ is most of the workspace, and the memory rule alone cut
// the batch and then the kv heads to one of each, 64 backward CTAs a call; the grid's floor keeps it
// whole (unsliced it ran in half the time on two H200s). At medium the floor leaves the memory
// rule's four slices (768 CTAs a slice, next case).
TEST_CASE("a ring's auto slices never starve the backward's grid") {
  RingShape s = gqa_16_to_1_half();
  s.batch_slices = s.head_slices = 0;
  RingShape cpu = s;  // no floor (the CPU's choice): one entry and one kv head a slice
  choose_slices(cpu, 2, 0);
  CHECK(cpu.batch_slices == 2);
  CHECK(cpu.head_slices == 2);
  RingShape asked = s;  // the batch's slices asked for, the heads' left to the rule: it still cuts them
  asked.batch_slices = 1;
  choose_slices(asked, 2, 0);
  CHECK(asked.batch_slices == 1);
  CHECK(asked.head_slices == 2);
  choose_slices(s, 2, kMinBackwardCtas);
  CHECK(s.batch_slices == 1);
  CHECK(s.head_slices == 1);
  // With sixteen entries the grid is large and the memory rule has its way: a quarter of the batch a
  // slice, which at two entries was one entry and one of the two kv heads.
  RingShape many = s;
  many.batch = 16;
  many.batch_slices = many.head_slices = 0;
  choose_slices(many, 2, kMinBackwardCtas);
  CHECK(many.batch_slices == 4);
  CHECK(many.head_slices == 1);
}

// Two row sets let a slice's delta and dQ be made and rounded under its neighbours' steps; a packed
// head slice makes them between its pack and its call, in the one set.
TEST_CASE("a ring's backward keeps two row sets over batch slices, one over head slices or none") {
  const RingShape s = gqa_16_to_1_half();
  RingShape batch = s;
  batch.batch_slices = 2;
  batch.head_slices = 1;
  choose_slices(batch, 2, 0);
  CHECK(batch.double_rows);
  RingShape heads = s;
  heads.batch_slices = 2;
  heads.head_slices = 2;
  choose_slices(heads, 2, 0);
  CHECK_FALSE(heads.double_rows);
  RingShape whole = s;
  whole.batch_slices = whole.head_slices = 1;
  choose_slices(whole, 2, 0);
  CHECK_FALSE(whole.double_rows);
  // The second set is counted (the workspace is the larger pass's, here past the forward's).
  RingShape single = batch;
  single.double_rows = false;
  CHECK(RingAttention::workspace_bytes(batch, 2) > RingAttention::workspace_bytes(single, 2));
}

namespace {

// A rank's half of B x S x H (kv heads: H unless given) at D=128, bf16, causal, on two ranks; its
// slices left to the rule.
RingShape causal_half(int32_t batch, int32_t heads, int64_t seqlen, int32_t kv_heads = 0) {
  RingShape s;
  s.batch = batch;
  s.heads_q = heads;
  s.heads_kv = kv_heads > 0 ? kv_heads : heads;
  s.local_q = s.local_kv = seqlen / 2;
  s.mask.seqlen = seqlen;
  s.mask.causal = true;
  s.batch_slices = s.head_slices = 0;  // auto
  return s;
}

}  // namespace

// B=4 S=8192 H=24 D=128 bf16 causal on two ranks (the medium preset): the memory rule cuts the
// backward into four slices of one entry; the forward, without fp32 gradients, fits two of two in
// the same bytes.
TEST_CASE("a ring's forward runs over the fewest batch slices that fit in its backward's buffers") {
  RingShape s = causal_half(4, 24, 8192);
  choose_slices(s, 2, kMinBackwardCtas);
  CHECK(s.batch_slices == 4);
  const RingShape f = RingAttention::forward_shape(s, 2);
  CHECK(f.batch_slices == 2);
  CHECK(f.head_slices == s.head_slices);
  CHECK(RingAttention::forward_shape(s, 1).batch_slices == 4);  // one rank: no hops, nothing to gain
  s.batch_slices = 1;
  CHECK(RingAttention::forward_shape(s, 2).batch_slices == 1);
  s.batch_slices = 4;  // asked for (the batch_slices parameter): both passes
  s.head_slices = 0;
  choose_slices(s, 2, 0);
  CHECK(RingAttention::forward_shape(s, 2).batch_slices == 4);
}

// B=8 S=32768 H=32 D=128 bf16 causal on two ranks (the xlarge preset): the travelling backward fits
// in three slices (3, 3 and 2 entries), own block last, its third row set counted, in four. Keeping
// own_last only at the travelling backward's count ran the travelling one, slower on two H200s and
// 2 GiB a rank larger (docs/KERNELS.md, "Shares home, own block last").
TEST_CASE("a ring's own block last takes the slices the memory rule gives it") {
  RingShape s = causal_half(8, 32, 32768);
  RingShape travelling = s;
  choose_slices(travelling, 2, kMinBackwardCtas);
  CHECK(travelling.batch_slices == 3);
  CHECK_FALSE(travelling.own_last);
  s.own_last = true;  // as set_own_last leaves a zigzag of two members
  choose_slices(s, 2, kMinBackwardCtas);
  CHECK(s.own_last);
  CHECK(s.batch_slices == 4);
  CHECK(s.head_slices == 1);
  // Never head slices for it (it needs the batch's), nor more than one batch slice more: with GQA
  // its row sets outgrow the K/V the rule weighs them against, and those counts are untimed. Here it
  // would take a head slice (B=3, 32:8) or twice the batch slices (B=8, 32:2; B=7, 32:8): the
  // travelling backward runs.
  for (auto [batch, kv_heads] : {std::pair{3, 8}, std::pair{8, 2}, std::pair{7, 8}}) {
    CAPTURE(batch);
    CAPTURE(kv_heads);
    RingShape g = causal_half(batch, 32, 16384, kv_heads);
    RingShape travelling_g = g;
    choose_slices(travelling_g, 2, kMinBackwardCtas);
    g.own_last = true;
    choose_slices(g, 2, kMinBackwardCtas);
    CHECK_FALSE(g.own_last);
    CHECK(g.batch_slices == travelling_g.batch_slices);
    CHECK(g.head_slices == travelling_g.head_slices);
  }
}

TEST_CASE("ulysses: auto takes two head groups only where a group's call of one entry is long") {
  const int64_t causal_8k = 8192 * 8193 / 2, causal_16k = int64_t{16384} * 16385 / 2, window_16k = 16384 * 513 - 512 * 513 / 2;
  CHECK(ulysses_head_groups(0, 12, 12, 2, causal_8k) == 1);   // medium at two ranks: 6 heads a group
  CHECK(ulysses_head_groups(0, 16, 16, 2, causal_16k) == 2);  // large
  CHECK(ulysses_head_groups(0, 16, 16, 2, window_16k) == 1);  // large under a 512-key window
  CHECK(ulysses_head_groups(0, 16, 1, 2, causal_16k) == 1);   // one kv head a rank
  CHECK(ulysses_head_groups(4, 16, 16, 2, causal_8k) == 4);   // asked
  CHECK(ulysses_head_groups(3, 16, 16, 2, causal_8k) == 1);   // asked, but it does not cut the kv heads
  CHECK(ulysses_head_groups(0, 16, 16, 1, causal_16k) == 1);  // nothing is exchanged
}

TEST_CASE("ulysses's last backward step runs each member's columns so that what a run finishes leaves first") {
  const auto order = [](DenseMask mask, int u, int member) {
    mask.seqlen = 64 * u;
    return column_run_order(mask, 64, u, member, 8, 2);
  };
  using Rows = std::vector<std::vector<int>>;
  SUBCASE("two members, causal: the other's columns first, and its dQ at the end where its rows read every key") {
    const ColumnRunOrder first = order({0, true}, 2, 0), second = order({0, true}, 2, 1);
    CHECK(first.members == std::vector<int>{1, 0});
    CHECK(first.final_rows == Rows{{}, {0, 1}});
    CHECK(second.members == std::vector<int>{0, 1});  // member 0's gradients all finish in the first run
    CHECK(second.final_rows == Rows{{0}, {1}});
  }
  SUBCASE("without a mask every dQ row waits for the last run, and the peers' columns go first") {
    CHECK(order({0, false}, 2, 0).members == std::vector<int>{1, 0});
    CHECK(order({0, false}, 2, 1).members == std::vector<int>{0, 1});
    CHECK(order({0, false}, 3, 1).final_rows == Rows{{}, {}, {0, 1, 2}});
  }
  SUBCASE("four members, causal or a window: every column runs once, every member's rows finish once") {
    for (const bool window : {false, true})
      for (int member = 0; member < 4; ++member) {
        const ColumnRunOrder o = order(window ? DenseMask{0, true, 40, 0} : DenseMask{0, true}, 4, member);
        std::vector<int> runs = o.members, rows;
        std::sort(runs.begin(), runs.end());
        for (const std::vector<int>& r : o.final_rows) rows.insert(rows.end(), r.begin(), r.end());
        std::sort(rows.begin(), rows.end());
        CHECK(runs == std::vector<int>{0, 1, 2, 3});
        CHECK(rows == std::vector<int>{0, 1, 2, 3});
        if (!window) CHECK(o.members.back() != 0);  // every row reads member 0's columns
      }
  }
  SUBCASE("a window of 40 keys back: a member's rows read its own columns and the member's before") {
    const ColumnRunOrder o = order({0, true, 40, 0}, 4, 3);
    CHECK(o.members == std::vector<int>{0, 1, 2, 3});
    CHECK(o.final_rows == Rows{{0}, {1}, {2}, {3}});
  }
}
