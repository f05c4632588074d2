// dilated through the host's runtime: LongNet's patterns at world sizes 1 to 4 on the CPU against
// the float64 reference (and on GPUs, label gpu), lengths that are not multiples of w, both head
// offset modes, GQA, segments wider than a rank (dilated K/V exchanged), errors that do not grow.
// The runtime's check trusts the plugin's enumeration, so the enumeration and the pair counts are
// also held against docs/VARIANTS.md's definition written out here by brute force, and multiplicity
// against the outputs themselves (a pattern given twice doubles the LSE's sum, not O).
#include "harness.h"

#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/problem.h"
#include "runtime/services.h"

#include <cmath>
#include <random>

using attnhost::DeviceKind;
using test::run_on;

namespace {

struct Patterns {
  std::vector<int64_t> w, r;
};

// LongNet's language-model configuration (arXiv 2307.02486, section 4.1).
const Patterns kLongNetLM = {{2048, 4096, 8192, 16384, 32768}, {1, 2, 4, 6, 12}};

attnhost::suite::Case dilated_case(std::vector<int> world_sizes, int64_t seqlen, int32_t heads, int32_t kv_heads,
                                   int32_t head_dim, bool causal, const Patterns& pt,
                                   const std::string& mode = "paper", const std::string& dtype = "bf16") {
  attnhost::suite::Case c = test::dense_case("dilated", std::move(world_sizes), seqlen, heads, kv_heads, head_dim,
                                             causal, dtype);
  c.problem.batch = 1;
  c.params["segment_lengths"] = pt.w;
  c.params["dilation_rates"] = pt.r;
  c.params["offset_mode"] = mode;
  return c;
}

// docs/VARIANTS.md's dilated attention, written out: how many times query q of head h attends key k.
struct Definition {
  int64_t seqlen;
  int32_t heads;
  bool causal;
  std::string mode;
  Patterns pt;

  int64_t offset(size_t p, int32_t h) const {
    const int64_t r = pt.r[p];
    return mode == "paper" ? h % r : h / ((heads + r - 1) / r);
  }
  bool selected(size_t p, int32_t h, int64_t pos) const {
    const int64_t u = pos % pt.w[p] - offset(p, h);
    return u >= 0 && u % pt.r[p] == 0;
  }
  int multiplicity(int32_t h, int64_t q, int64_t k) const {
    int m = 0;
    for (size_t p = 0; p < pt.w.size(); ++p)
      m += q / pt.w[p] == k / pt.w[p] && selected(p, h, q) && selected(p, h, k) && (!causal || k <= q);
    return m;
  }
  int64_t pairs() const {  // per batch entry
    int64_t n = 0;
    for (int32_t h = 0; h < heads; ++h)
      for (int64_t q = 0; q < seqlen; ++q)
        for (int64_t k = 0; k < seqlen; ++k) n += multiplicity(h, q, k);
    return n;
  }
};

Definition definition_of(const attnhost::suite::Case& c) {
  auto list = [&](const char* n) { return std::get<std::vector<int64_t>>(c.params.at(n)); };
  return {c.problem.seqlen_q, c.problem.heads_q, c.problem.causal, std::get<std::string>(c.params.at("offset_mode")),
          {list("segment_lengths"), list("dilation_rates")}};
}



// Passes at every world size, errors do not grow, and the pairs are the definition's.
void check_case(const attnhost::suite::Case& c) {
  attnhost::CaseResult r = run_on(DeviceKind::cpu, c);
  test::all_pass(r);
  test::error_does_not_grow(r);
  const int64_t pairs = definition_of(c).pairs() * c.problem.batch;
  for (const auto& run : r.runs) {
    INFO(r.spec.id, " at world size ", run.world_size);
    CHECK(run.total_pairs == pairs);
    CHECK(run.max_rank_pairs * run.world_size >= pairs);
  }
}

// One rank's instance made directly (no run): what the runtime's check cannot judge by itself.
class Direct {
 public:
  Direct(const attnhost::suite::Case& c, int rank, int world)
      : world_(world, std::chrono::milliseconds(20000)), comm_(world_.communicator(rank)),
        device_(attnhost::make_cpu_device()), tracer_(*device_, rank), services_(*device_, *comm_, tracer_, rank),
        plugin_(test::builtins().find(c.plugin)), binding_(c, plugin_->description(), ATTNHOST_DEVICE_CPU),
        problem_(binding_.at(rank, world)) {
    instance_ = plugin_->create(problem_, services_.api());
  }
  attnhost::Instance& operator*() { return *instance_; }
  attnhost::Instance* operator->() { return instance_.get(); }

  // Forward of one device on fp32 data from `seed`: O and LSE as the plugin wrote them.
  std::pair<std::vector<float>, std::vector<float>> forward(uint32_t seed) {
    const attnhost_problem& p = problem_;
    const int64_t S = p.seqlen_q, q_elems = p.batch * S * p.heads_q * p.head_dim,
                  kv_elems = p.batch * S * p.heads_kv * p.head_dim;
    std::mt19937 gen(seed);
    std::normal_distribution<float> normal;
    std::vector<float> q(q_elems), k(kv_elems), v(kv_elems), o(q_elems), lse(p.batch * p.heads_q * S);
    for (auto* t : {&q, &k, &v})
      for (float& x : *t) x = normal(gen);
    attnhost_forward_args a{};
    a.struct_size = sizeof(a);
    a.q.data = q.data();
    a.k.data = k.data();
    a.v.data = v.data();
    a.o.data = o.data();
    a.lse.data = lse.data();
    instance_->forward(a);
    return {o, lse};
  }

 private:
  attnhost::InprocWorld world_;
  std::unique_ptr<attnhost::Communicator> comm_;
  std::unique_ptr<attnhost::Device> device_;
  attnhost::Tracer tracer_;
  attnhost::RankServices services_;
  std::shared_ptr<const attnhost::Plugin> plugin_;
  attnhost::ProblemBinding binding_;
  attnhost_problem problem_;
  std::unique_ptr<attnhost::Instance> instance_;
};

// Every (query, key) the plugin enumerates, with multiplicity, is the definition's; both ways.
void enumeration_is_the_definition(const attnhost::suite::Case& c) {
  const Definition def = definition_of(c);
  Direct d(c, 0, 1);
  const int32_t group = c.problem.heads_q / c.problem.heads_kv;
  for (int32_t h = 0; h < def.heads; ++h)
    for (int64_t q = 0; q < def.seqlen; ++q) {
      std::vector<int> got(def.seqlen, 0), want(def.seqlen, 0);
      for (const attnhost_span& s : d->enumerate_keys(0, h, q))
        for (int64_t k = s.begin; k < s.end; k += s.step) got[k] += s.multiplicity;
      for (int64_t k = 0; k < def.seqlen; ++k) want[k] = def.multiplicity(h, q, k);
      INFO("keys of head ", h, " query ", q);
      REQUIRE(got == want);
    }
  for (int32_t kvh = 0; kvh < c.problem.heads_kv; ++kvh)
    for (int64_t k = 0; k < def.seqlen; ++k) {
      std::vector<int> got(group * def.seqlen, 0), want(group * def.seqlen, 0);
      for (const attnhost_span& s : d->enumerate_queries(0, kvh, k)) {
        REQUIRE(s.head / group == kvh);
        for (int64_t q = s.begin; q < s.end; q += s.step) got[(s.head % group) * def.seqlen + q] += s.multiplicity;
      }
      for (int32_t h = kvh * group; h < (kvh + 1) * group; ++h)
        for (int64_t q = 0; q < def.seqlen; ++q) want[(h % group) * def.seqlen + q] = def.multiplicity(h, q, k);
      INFO("queries of kv head ", kvh, " key ", k);
      REQUIRE(got == want);
    }
}

}  // namespace

TEST_CASE("dilated: the enumeration and the pair counts are docs/VARIANTS.md's definition") {
  const Patterns mixed = {{64, 96, 256, 40}, {1, 5, 4, 8}};  // 96 % 5 != 0; 40 < the offsets 0..7 of r = 8
  for (const char* mode : {"paper", "torchscale"})
    for (bool causal : {false, true}) {
      CAPTURE(mode);
      CAPTURE(causal);
      auto c = dilated_case({1}, 300, 12, 4, 16, causal, mixed, mode);
      enumeration_is_the_definition(c);
      // The ranks' pairs add up to the total, whatever the sharding.
      const int64_t total = definition_of(c).pairs();
      for (int world : {1, 2, 3, 4, 7}) {
        int64_t sum = 0;
        for (int rank = 0; rank < world; ++rank) {
          Direct d(c, rank, world);
          int64_t rank_pairs = 0, all = 0;
          d->count_pairs(&rank_pairs, &all);
          CHECK(all == total);
          sum += rank_pairs;
        }
        CHECK(sum == total);
      }
    }
}

TEST_CASE("dilated: cost per pattern is S*w/r^2 pairs") {
  // S a multiple of every w, w of every r: each pattern is S/w segments of (w/r)^2 pairs per head.
  auto c = dilated_case({1}, 1024, 4, 4, 16, false, {{64, 256, 1024}, {1, 4, 8}});
  Direct d(c, 0, 1);
  int64_t rank_pairs = 0, total = 0;
  d->count_pairs(&rank_pairs, &total);
  CHECK(total == 4 * (1024 * 64 / 1 + 1024 * 256 / 16 + 1024 * 1024 / 64));
  CHECK(rank_pairs == total);
}

TEST_CASE("dilated: a key two patterns select counts twice") {
  // The same pattern twice: every key of a row twice, so the LSE grows by log 2 and O stays.
  auto once = dilated_case({1}, 200, 4, 2, 16, false, {{64}, {2}}, "paper", "fp32");
  auto twice = dilated_case({1}, 200, 4, 2, 16, false, {{64, 64}, {2, 2}}, "paper", "fp32");
  auto [o1, l1] = Direct(once, 0, 1).forward(5);
  auto [o2, l2] = Direct(twice, 0, 1).forward(5);
  for (size_t i = 0; i < l1.size(); ++i) {
    if (std::isinf(l1[i])) CHECK(std::isinf(l2[i]));  // a row r = 2 does not select (offset 1 of head 0, ...)
    else CHECK(l2[i] == doctest::Approx(l1[i] + std::log(2.0)).epsilon(1e-6));
  }
  for (size_t i = 0; i < o1.size(); ++i) CHECK(o2[i] == doctest::Approx(o1[i]).epsilon(1e-5));
  // Through the runtime: overlapping patterns (every key of (64, 2) is also one of (64, 1)).
  check_case(dilated_case({1, 2, 3}, 200, 4, 2, 16, true, {{64, 64, 128}, {1, 2, 2}}));
  check_case(dilated_case({1, 3}, 200, 4, 2, 16, false, {{64, 64}, {2, 2}}));
}

TEST_CASE("dilated: three patterns at S = 512, causal and not, world sizes 1 to 4 (w > S/P at 3 and 4)") {
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    check_case(dilated_case({1, 2, 3, 4}, 512, 4, 4, 32, causal, {{64, 128, 256}, {1, 2, 4}}));
  }
}

// The pattern that writes the local dK/dV (r = 1, every key) listed after one that adds into them:
// it must still run first. Before it was only looked for first in the list, and the accumulators
// were zeroed instead.
TEST_CASE("dilated: the dK/dV writer listed after a pattern that adds, world sizes 1 to 3") {
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    check_case(dilated_case({1, 2, 3}, 512, 4, 4, 32, causal, {{128, 64}, {2, 1}}));
  }
}

TEST_CASE("dilated: lengths that are not multiples of w, both offset modes, GQA") {
  const Patterns pt = {{64, 96, 256}, {1, 5, 4}};  // 500 = 7x64 + 52 = 5x96 + 20 = 256 + 244; 96 % 5 != 0
  for (const char* mode : {"paper", "torchscale"})
    for (bool causal : {false, true}) {
      CAPTURE(mode);
      CAPTURE(causal);
      check_case(dilated_case({1, 2, 3, 4}, 500, 8, 2, 32, causal, pt, mode));
    }
  // Rows no pattern selects (no r = 1): their O is 0 and LSE -inf, checked like any row.
  check_case(dilated_case({1, 2, 4}, 250, 6, 6, 16, true, {{32, 250}, {3, 5}}, "torchscale"));
}

TEST_CASE("dilated: MHA where w % r != 0: a head's segments lie on several lattices, a strided call each") {
  // 500 = 5x96 + 20: segment g of w = 96 starts 96g = g (mod 5) past a multiple of 5, so each head's
  // six segments fall into five classes; 250 % 4 != 0 gives two. At world size 2 some are exchanged.
  const Patterns pt = {{64, 96, 250}, {1, 5, 4}};
  for (const char* mode : {"paper", "torchscale"})
    for (bool causal : {false, true}) {
      CAPTURE(mode);
      CAPTURE(causal);
      check_case(dilated_case({1, 2}, 500, 6, 6, 32, causal, pt, mode));
    }
  // Two batch entries: every view's batch stride, on strided and gathered patterns alike.
  auto batched = dilated_case({1, 2, 3}, 500, 6, 6, 32, true, pt);
  batched.problem.batch = 2;
  check_case(batched);
}

TEST_CASE("dilated: segments wider than a rank, misaligned with the shards, ranks of one token or of padding only") {
  // P = 4, S = 301: shards of 76 tokens; every segment of 100 or 301 spans two to four ranks.
  check_case(dilated_case({1, 2, 3, 4}, 301, 4, 1, 16, true, {{100, 301}, {3, 7}}));
  check_case(dilated_case({1, 4}, 301, 4, 1, 16, false, {{100, 301}, {3, 7}}, "torchscale"));
  check_case(dilated_case({1, 3, 4}, 4, 2, 2, 16, false, {{2, 4}, {1, 2}}));  // a rank of padding only
}

TEST_CASE("dilated: LongNet's language-model patterns, 12 heads, at world sizes 1 to 4") {
  // S = 2100: two segments of 2048 (the second one 52 tokens and padding), the wider patterns one
  // segment each (w > S); shards of 1050, 700 and 525 tokens put every pattern's segment on several
  // ranks: r = 1 too is gathered and exchanged. Head dim 32: the schedule does not depend on it, and
  // the CPU reference's time does (the GPU test below runs S = 32768 at D = 128).
  for (bool causal : {true, false}) {
    CAPTURE(causal);
    check_case(dilated_case(causal ? std::vector<int>{1, 2, 3, 4} : std::vector<int>{1, 4}, 2100, 12, 12, 32,
                            causal, kLongNetLM));
  }
}

TEST_CASE("dilated: fp16 and fp32, and the run without overlap") {
  check_case(dilated_case({1, 2}, 200, 4, 4, 24, true, {{64, 200}, {1, 4}}, "paper", "fp16"));
  auto fp32 = dilated_case({1, 3}, 200, 4, 4, 24, false, {{64, 200}, {2, 4}}, "paper", "fp32");
  attnhost::CaseResult r = run_on(DeviceKind::cpu, fp32);
  test::all_pass(r);
  CHECK(test::error_of(r.runs[1], "O") < 1e-5);
  auto single_stream = dilated_case({3}, 200, 4, 4, 24, true, {{64, 200}, {2, 4}});
  single_stream.params["overlap"] = false;
  test::all_pass(run_on(DeviceKind::cpu, single_stream));
}

TEST_CASE("dilated: torchscale's backward equals the exact one for one pattern, and not for overlapping ones") {
  auto one = dilated_case({1, 2}, 256, 4, 4, 32, true, {{64}, {2}}, "torchscale");
  one.params["torchscale_backward"] = true;
  test::all_pass(run_on(DeviceKind::cpu, one));
  // Overlapping patterns: the weights exp(LSE_i - LSE) depend on q and k, and holding them
  // constant drops that part of dQ and dK. The forward is the same; the gradients are not.
  auto two = dilated_case({1, 2}, 256, 4, 4, 32, true, {{64, 256}, {1, 2}}, "torchscale");
  attnhost::CaseResult exact = run_on(DeviceKind::cpu, two);
  test::all_pass(exact);
  two.params["torchscale_backward"] = true;
  attnhost::CaseResult approx = run_on(DeviceKind::cpu, two);
  for (size_t i = 0; i < approx.runs.size(); ++i) {
    const auto& run = approx.runs[i];
    INFO("world size ", run.world_size, ": ", run.error);
    CHECK(run.status == "FAILED");
    CHECK(test::error_of(run, "O") == doctest::Approx(test::error_of(exact.runs[i], "O")));
    CHECK(test::error_of(run, "dV") == doctest::Approx(test::error_of(exact.runs[i], "dV")).epsilon(0.05));
    CHECK(test::error_of(run, "dQ") > 10 * test::error_of(exact.runs[i], "dQ"));
  }
}

TEST_CASE("dilated refuses what it does not define, before any allocation") {
  auto bad = dilated_case({1}, 256, 2, 2, 16, true, {{64, 128}, {1}});
  auto r = run_on(DeviceKind::cpu, bad);
  CHECK(r.runs[0].error ==
        "plugin 'dilated' refused the problem: segment_lengths has 2 entries but dilation_rates has 1: they pair up "
        "one to one");
  auto rate = dilated_case({1}, 256, 2, 2, 16, true, {{64}, {65}});
  CHECK(run_on(DeviceKind::cpu, rate).runs[0].error ==
        "plugin 'dilated' refused the problem: pattern 0 (w = 64, r = 65) needs 1 <= r <= w");
  auto window = dilated_case({1}, 256, 2, 2, 16, true, {{64}, {1}});
  window.problem.window_left = 8;
  CHECK(run_on(DeviceKind::cpu, window).runs[0].status == "UNSUPPORTED");
}

#if ATTNHOST_HAVE_CUDA
TEST_CASE("gpu: dilated on the GPUs against the float64 reference" * doctest::test_suite("gpu")) {
  const int gpus = attnhost::cuda_device_count();
  REQUIRE_MESSAGE(gpus > 0, "no GPU visible");
  std::vector<int> sizes = {1};
  if (gpus > 1) sizes.push_back(2);
  // LongNet's language model at S = 32768 (every w a whole number of segments; at two GPUs the
  // 32768 pattern spans both), and at S = 20000 (no w divides it), both offset modes.
  for (bool causal : {true, false}) {
    auto r = run_on(DeviceKind::cuda, dilated_case(sizes, 32768, 12, 12, 128, causal, kLongNetLM));
    test::all_pass(r);
    test::error_does_not_grow(r);
    auto odd = run_on(DeviceKind::cuda, dilated_case(sizes, 20000, 12, 12, 128, causal, kLongNetLM, "torchscale"));
    test::all_pass(odd);
    test::error_does_not_grow(odd);
  }
  // GQA, fp16, head dim 64, segments misaligned with the shards.
  test::all_pass(run_on(DeviceKind::cuda, dilated_case(sizes, 3001, 8, 2, 64, true, {{256, 1000, 3001}, {1, 3, 7}},
                                                 "paper", "fp16")));
  // Head dim 256 (the combine loads two float4s of a row a lane), and rows no pattern selects
  // (no r = 1; head dim 80, fp16): the combine gives them O = 0 and LSE = -inf, with no warp
  // diverging around its shuffles (an earlier combine did, and verify caught it).
  test::all_pass(run_on(DeviceKind::cuda, dilated_case(sizes, 4000, 4, 4, 256, true, {{1000, 2000}, {1, 2}})));
  test::all_pass(run_on(DeviceKind::cuda, dilated_case(sizes, 2370, 12, 12, 80, false, {{500, 960, 2370}, {3, 5, 7}},
                                                 "paper", "fp16")));
}
#endif
