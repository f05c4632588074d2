// How a suite expands: plugins x presets, sweeps, batch = "auto", defaults, and case ids.
#include "suite_test_support.h"

using namespace attnhost::suite;
using namespace attnhost::suite::testing;

TEST_CASE("expansion: plugins x presets, the plugins of one problem side by side") {
  const Suite suite = parse(R"(
[[case]]
plugins = ["ring", "zigzag"]
presets = ["tiny", "medium"]
)");
  CHECK(ids_of(suite) == std::vector<std::string>{"ring/tiny", "zigzag/tiny", "ring/medium", "zigzag/medium"});
  const Case& c = suite.cases.at(2);
  CHECK(c.plugin == "ring");
  CHECK(c.label == "medium");
  CHECK(c.group == "medium");
  CHECK(c.problem.heads_q == 24);
  CHECK(c.world_sizes == std::vector<int>{1});
  CHECK(c.params.empty());
  CHECK(c.where.str() == "t.toml:2:1");
}

TEST_CASE("expansion: a preset set expands to its presets, a single name needs no list") {
  CHECK(ids_of(parse("[[case]]\nplugins = \"ring\"\npresets = \"correctness\"\n")) ==
        std::vector<std::string>{"ring/tiny", "ring/small", "ring/small_fp16", "ring/small_window",
                                 "ring/medium_large_head", "ring/qwen3_4b", "ring/qwen3_14b"});
  CHECK(ids_of(parse("[[case]]\nplugins = [\"ring\"]\npresets = [\"gqa\", \"tiny\"]\n")) ==
        std::vector<std::string>{"ring/qwen3_4b", "ring/qwen3_14b", "ring/qwen3_32b", "ring/tiny"});
}

TEST_CASE("expansion: a field written over a preset changes the problem and names itself in the id") {
  const Suite suite = parse(R"(
[[case]]
plugins = ["ring"]
presets = ["medium", "qwen3_4b"]
seqlen = 4096
heads = 64
)");
  CHECK(ids_of(suite) == std::vector<std::string>{"ring/medium/seqlen=4096/heads=64",
                                                  "ring/qwen3_4b/seqlen=4096/heads=64"});
  const Problem& mha = suite.cases.at(0).problem;
  CHECK(mha.seqlen_q == 4096);
  CHECK(mha.seqlen_kv == 4096);  // self-attention stays self-attention
  CHECK(mha.heads_kv == 64);     // MHA stays MHA
  const Problem& gqa = suite.cases.at(1).problem;
  CHECK(gqa.heads_q == 64);
  CHECK(gqa.heads_kv == 4);      // GQA keeps its key/value heads
  CHECK(gqa.head_dim == 80);
}

TEST_CASE("expansion: an inline problem is labelled by its name") {
  const Suite suite = parse(R"(
[[case]]
name = "mine"
plugins = ["ring", "naive_attention"]
seqlen = 2048
seqlen_kv = 4096
heads = 16
kv_heads = 4
head_dim = 96
dtype = "fp16"
causal = true
window = [128, 0]
softmax_scale = 0.125
deterministic = true
)");
  CHECK(ids_of(suite) == std::vector<std::string>{"ring/mine", "naive_attention/mine"});
  const Problem& p = suite.cases.at(0).problem;
  CHECK(p.batch == 1);
  CHECK(p.seqlen_q == 2048);
  CHECK(p.seqlen_kv == 4096);
  CHECK(p.heads_q == 16);
  CHECK(p.heads_kv == 4);
  CHECK(p.head_dim == 96);
  CHECK(p.dtype == "fp16");
  CHECK(p.causal);
  CHECK(p.window_left == 128);
  CHECK(p.window_right == 0);
  CHECK(p.softmax_scale == 0.125);
  CHECK(p.deterministic);
  CHECK(suite.cases.at(0).group == "mine");
}

TEST_CASE("expansion: lists are a cartesian sweep, the first field outermost") {
  const Suite suite = parse(R"(
[[case]]
name = "grid"
plugins = ["ring"]
seqlen = [1024, 2048, 4096]
heads = [8, 16]
head_dim = 64
)");
  CHECK(ids_of(suite) == std::vector<std::string>{
                             "ring/grid/seqlen=1024/heads=8", "ring/grid/seqlen=1024/heads=16",
                             "ring/grid/seqlen=2048/heads=8", "ring/grid/seqlen=2048/heads=16",
                             "ring/grid/seqlen=4096/heads=8", "ring/grid/seqlen=4096/heads=16"});
  CHECK(suite.cases.at(5).problem.seqlen_q == 4096);
  CHECK(suite.cases.at(5).problem.heads_q == 16);
  for (const Case& c : suite.cases) CHECK(c.group == "grid");
}

TEST_CASE("expansion: sweeps of windows, dtypes and causality") {
  const Suite suite = parse(R"(
[[case]]
name = "w"
plugins = ["ring"]
seqlen = 1024
heads = 8
head_dim = 64
dtype = ["bf16", "fp16"]
causal = [true, false]
window = [[-1, -1], [256, 0]]
)");
  CHECK(suite.cases.size() == 8);
  CHECK(suite.cases.at(0).id == "ring/w/dtype=bf16/causal=true/window=-1,-1");
  CHECK(suite.cases.at(7).id == "ring/w/dtype=fp16/causal=false/window=256,0");
  CHECK(suite.cases.at(7).problem.window_left == 256);
}

TEST_CASE("expansion: seqlen = a named range sweeps it") {
  const Suite suite = parse(R"(
[[case]]
name = "docs"
plugins = ["ring"]
seqlen = "document"
heads = 8
head_dim = 64
)");
  CHECK(ids_of(suite) == std::vector<std::string>{"ring/docs/seqlen=512", "ring/docs/seqlen=1024",
                                                  "ring/docs/seqlen=2048", "ring/docs/seqlen=4096"});
}

TEST_CASE("expansion: batch = \"auto\" keeps the tokens of a step near the budget") {
  const Suite suite = parse(R"(
[[case]]
name = "s"
plugins = ["ring"]
batch = "auto"
tokens = 16384
seqlen = [1024, 3000, 16384, 32768]
heads = 8
head_dim = 64
)");
  REQUIRE(suite.cases.size() == 4);
  CHECK(suite.cases.at(0).problem.batch == 16);
  CHECK(suite.cases.at(1).problem.batch == 5);  // rounded down: never over the budget
  CHECK(suite.cases.at(2).problem.batch == 1);
  CHECK(suite.cases.at(3).problem.batch == 1);  // one sequence even past the budget
  CHECK(suite.cases.at(0).tokens == 16384);
  CHECK(suite.cases.at(0).id == "ring/s/seqlen=1024");
}

TEST_CASE("expansion: batch = \"auto\" over a preset") {
  const Suite suite = parse(R"(
[[case]]
plugins = ["ring"]
presets = ["large"]
batch = "auto"
tokens = 65536
)");
  CHECK(suite.cases.at(0).problem.batch == 4);
  CHECK(suite.cases.at(0).id == "ring/large/batch=auto/tokens=65536");
}

TEST_CASE("expansion: [defaults] fill every case, a case overrides them key by key") {
  const Suite suite = parse(R"(
[defaults]
plugins = ["ring", "zigzag"]
world_sizes = [1, 2, 4]
heads = 8
head_dim = 64
causal = true

[defaults.timing]
method = "adaptive"
warmup_runs = 7
passes = ["fwd"]

[defaults.check]
query_rows = 32

[defaults.data]
seed = 11
distribution = "scaled"
scale = 4.0

[[case]]
name = "a"
seqlen = 1024

[[case]]
name = "b"
plugins = ["ring"]
seqlen = 2048
heads = 16
world_sizes = [2]
timing.timing_runs = 50
check.enabled = false
data.seed = 12
)");
  CHECK(ids_of(suite) == std::vector<std::string>{"ring/a", "zigzag/a", "ring/b"});
  const Case& a = suite.cases.at(0);
  CHECK(a.world_sizes == std::vector<int>{1, 2, 4});
  CHECK(a.problem.heads_q == 8);
  CHECK(a.problem.causal);
  CHECK(a.timing.method == "adaptive");
  CHECK(a.timing.warmup_runs == 7);
  CHECK(a.timing.timing_runs == 10);  // built-in default
  CHECK(a.timing.passes == std::vector<std::string>{"fwd"});
  CHECK(a.check.query_rows == 32);
  CHECK(a.data.seed == 11);
  CHECK(a.data.distribution == "scaled");
  CHECK(a.data.scale == 4.0);
  const Case& b = suite.cases.at(2);
  CHECK(b.world_sizes == std::vector<int>{2});
  CHECK(b.problem.heads_q == 16);
  CHECK(b.problem.head_dim == 64);
  CHECK(b.timing.method == "adaptive");  // from [defaults]
  CHECK(b.timing.timing_runs == 50);     // its own
  CHECK_FALSE(b.check.enabled);
  CHECK(b.check.query_rows == 32);
  CHECK(b.data.seed == 12);
  CHECK(b.data.distribution == "scaled");
}

TEST_CASE("expansion: a preset is a whole problem, [defaults] problem fields do not touch it") {
  const Suite suite = parse(R"(
[defaults]
dtype = "fp16"
heads = 8
head_dim = 64

[[case]]
plugins = ["ring"]
presets = ["medium"]
)");
  CHECK(suite.cases.at(0).problem.dtype == "bf16");
  CHECK(suite.cases.at(0).problem.heads_q == 24);
  CHECK(suite.cases.at(0).id == "ring/medium");
}

TEST_CASE("expansion: a name on a preset case prefixes the preset in the label") {
  const Suite suite = parse(R"(
[[case]]
plugins = ["ring"]
presets = ["tiny"]

[[case]]
name = "fp16"
plugins = ["ring"]
presets = ["tiny", "small"]
dtype = "fp16"
)");
  CHECK(ids_of(suite) == std::vector<std::string>{"ring/tiny", "ring/fp16/tiny/dtype=fp16",
                                                  "ring/fp16/small/dtype=fp16"});
  CHECK(suite.cases.at(1).label == "fp16/tiny");
}

TEST_CASE("expansion: suite name, description, outputs and text") {
  const std::string text = R"(
name = "nightly"
description = "what runs every night"

[[case]]
plugins = ["ring"]
presets = ["tiny"]

[outputs]
dir = "results/nightly"
formats = ["json", "jsonl", "trace"]
)";
  const Suite suite = parse(text);
  CHECK(suite.name == "nightly");
  CHECK(suite.description == "what runs every night");
  CHECK(suite.outputs.dir == "results/nightly");
  CHECK(suite.outputs.formats == std::vector<std::string>{"json", "jsonl", "trace"});
  CHECK(suite.text == text);
  CHECK(suite.path == "t.toml");
}

TEST_CASE("expansion: the suite name defaults to the file's stem, outputs to their defaults") {
  const Suite suite = parse_suite("[[case]]\nplugins = [\"ring\"]\npresets = [\"tiny\"]\n",
                                  "suites/my_suite.toml", shipped_library(), test_catalog());
  CHECK(suite.name == "my_suite");
  CHECK(suite.outputs.dir.empty());
  CHECK(suite.outputs.formats == Outputs{}.formats);
}

TEST_CASE("expansion: dotted keys and inline tables read the same as sub-tables") {
  const Suite suite = parse(R"(
[[case]]
plugins = ["ring"]
presets = ["tiny"]
timing = { method = "simple" }
data.seed = 5
)");
  CHECK(suite.cases.at(0).timing.method == "simple");
  CHECK(suite.cases.at(0).data.seed == 5);
}
