// The configs the project ships: every preset of the ring-attention benchmark family with the
// shape the family gives it, the named sets and ranges, and every example suite loads and expands.
#include "suite_test_support.h"

#include <filesystem>
#include <set>

using namespace attnhost::suite;
using namespace attnhost::suite::testing;

namespace {

struct Shape {
  const char* name;
  int64_t batch;
  int32_t heads, kv_heads, head_dim;
  int64_t seqlen;
  const char* dtype;
  bool causal;
  int64_t window_left, window_right;
};

// The presets' BxHxD (batch x heads x head dim) and the rest of each shape, from the benchmark family.
const Shape kShapes[] = {
    {"tiny", 2, 8, 8, 64, 1024, "bf16", true, -1, -1},
    {"small", 4, 12, 12, 128, 4096, "bf16", true, -1, -1},
    {"small_fp16", 4, 12, 12, 128, 4096, "fp16", false, -1, -1},
    {"small_window", 4, 12, 12, 128, 4096, "bf16", true, 512, 0},
    {"medium", 4, 24, 24, 128, 8192, "bf16", true, -1, -1},
    {"medium_large_head", 4, 12, 12, 256, 8192, "bf16", false, -1, -1},
    {"medium_many_heads", 4, 32, 32, 128, 8192, "bf16", true, -1, -1},
    {"medium_fp16", 4, 24, 24, 128, 8192, "fp16", true, -1, -1},
    {"medium_window", 4, 24, 24, 128, 8192, "bf16", true, 512, 0},
    {"large", 4, 32, 32, 128, 16384, "bf16", true, -1, -1},
    {"large_seq", 4, 24, 24, 128, 32768, "bf16", true, -1, -1},
    {"large_head", 4, 24, 24, 256, 16384, "bf16", false, -1, -1},
    {"xlarge", 8, 32, 32, 128, 32768, "bf16", true, -1, -1},
    {"large_window", 4, 32, 32, 128, 16384, "bf16", true, 512, 0},
    {"qwen3_235b_a22b", 2, 64, 4, 64, 16384, "bf16", true, -1, -1},
    {"qwen3_30b_a3b", 4, 32, 4, 64, 16384, "bf16", true, -1, -1},
    {"qwen3_4b", 4, 32, 4, 80, 16384, "bf16", true, -1, -1},
    {"qwen3_32b", 2, 64, 8, 128, 16384, "bf16", true, -1, -1},
    {"qwen3_14b", 4, 40, 8, 128, 16384, "bf16", true, -1, -1},
    {"zigzag_tiny", 2, 8, 8, 64, 1024, "bf16", true, -1, -1},
    {"zigzag_small", 4, 12, 12, 128, 4096, "bf16", true, -1, -1},
    {"zigzag_medium", 4, 24, 24, 128, 8192, "bf16", true, -1, -1},
    {"zigzag_large", 4, 32, 32, 128, 16384, "bf16", true, -1, -1},
    {"zigzag_fp16", 4, 12, 12, 128, 4096, "fp16", true, -1, -1},
    {"zigzag_gqa", 4, 32, 8, 128, 8192, "bf16", true, -1, -1},
};

Suite load_shipped_suite(const std::string& name) {
  return load_suite(std::filesystem::path(ATTNHOST_TEST_CONFIGS_DIR) / "suites" / (name + ".toml"),
                    shipped_library(), test_catalog());
}

} // namespace

TEST_CASE("presets: every preset of the benchmark family, with its shape") {
  // The family comes first; the variants' own presets (varlen_*, dilated_*, bs_*) follow it.
  const PresetLibrary& library = shipped_library();
  REQUIRE(library.presets.size() >= std::size(kShapes));
  for (size_t i = 0; i < std::size(kShapes); ++i) CHECK(library.presets[i].name == kShapes[i].name);
  for (const Shape& shape : kShapes) {
    CAPTURE(shape.name);
    const Preset* preset = library.find(shape.name);
    REQUIRE(preset);
    const Problem& p = preset->problem;
    CHECK(p.batch == shape.batch);
    CHECK(p.heads_q == shape.heads);
    CHECK(p.heads_kv == shape.kv_heads);
    CHECK(p.head_dim == shape.head_dim);
    CHECK(p.seqlen_q == shape.seqlen);
    CHECK(p.seqlen_kv == shape.seqlen);
    CHECK(p.dtype == shape.dtype);
    CHECK(p.causal == shape.causal);
    CHECK(p.window_left == shape.window_left);
    CHECK(p.window_right == shape.window_right);
    CHECK_FALSE(p.varlen);
    CHECK_FALSE(preset->description.empty());
    CHECK(validate_problem(p).empty());
  }
}

TEST_CASE("presets: presets keep the file's order and find() misses unknown names") {
  const PresetLibrary& library = shipped_library();
  CHECK(library.presets.front().name == "tiny");
  CHECK(library.presets[std::size(kShapes) - 1].name == "zigzag_gqa");
  CHECK(library.find("no_such_preset") == nullptr);
}

TEST_CASE("presets: the named sets") {
  const auto& sets = shipped_library().sets;
  CHECK(sets.size() == 8);  // the family's five, and verify_<plugin> for varlen, dilated, blocksparse
  for (const char* plugin : {"varlen", "dilated", "blocksparse"}) CHECK(sets.count(std::string("verify_") + plugin));
  CHECK(sets.at("correctness") == std::vector<std::string>{"tiny", "small", "small_fp16", "small_window",
                                                          "medium_large_head", "qwen3_4b", "qwen3_14b"});
  CHECK(sets.at("performance") == std::vector<std::string>{"medium", "large"});
  CHECK(sets.at("multi_gpu") == std::vector<std::string>{"small", "medium"});
  CHECK(sets.at("gqa") == std::vector<std::string>{"qwen3_4b", "qwen3_14b", "qwen3_32b"});
  CHECK(sets.at("zigzag") == std::vector<std::string>{"zigzag_tiny", "zigzag_small", "zigzag_medium"});
}

TEST_CASE("ranges: the named sequence ranges") {
  const auto& ranges = shipped_library().ranges;
  CHECK(ranges.size() == 6);
  CHECK(ranges.at("production") == std::vector<int64_t>{1024, 2048, 4096, 8192, 12288, 16384});
  CHECK(ranges.at("medium") == std::vector<int64_t>{32768, 49152, 65536, 98304, 131072});
  CHECK(ranges.at("long") == std::vector<int64_t>{262144, 393216, 524288, 786432, 1048576});
  CHECK(ranges.at("document") == std::vector<int64_t>{512, 1024, 2048, 4096});
  CHECK(ranges.at("context") == std::vector<int64_t>{4096, 8192, 16384, 32768});
  CHECK(ranges.at("book") == std::vector<int64_t>{51200, 102400, 204800});
}

TEST_CASE("suites: every shipped suite is named after its file") {
  // Loading them against the real plugins' schemas is tests/plugins/test_shipped_suites.cpp's job.
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(ATTNHOST_TEST_CONFIGS_DIR) / "suites"))
    names.insert(entry.path().stem().string());
  CHECK(names == std::set<std::string>{"quick", "ring_vs_zigzag", "gqa", "scaling", "varlen", "dilated", "blocksparse", "scaling_gpus", "core_speed", "cp_strategies"});
}

TEST_CASE("suites: quick runs small problems with the example plugin, at world sizes 1 and 2") {
  const Suite suite = load_shipped_suite("quick");
  CHECK(ids_of(suite) == std::vector<std::string>{"naive_attention/causal", "ring/causal", "zigzag/causal",
                                                  "naive_attention/gqa", "ring/gqa", "zigzag/gqa",
                                                  "naive_attention/window", "ring/window", "naive_attention/documents"});
  for (const Case& c : suite.cases) {
    CAPTURE(c.id);
    CHECK(c.world_sizes == std::vector<int>{1, 2});
    CHECK(c.timing.method == "warmup");
    CHECK(c.timing.warmup_runs == 1);
    CHECK(c.timing.timing_runs == 3);
    CHECK(c.problem.batch * c.problem.seqlen_q <= 4096);  // small enough for the CPU
  }
  CHECK(suite.cases.at(3).problem.heads_kv == 2);
  CHECK(suite.cases.at(7).problem.window_left == 128);
  CHECK(suite.cases.at(8).problem.varlen->distribution == "documents");
}

TEST_CASE("suites: ring_vs_zigzag puts the two side by side over the medium and large presets") {
  const Suite suite = load_shipped_suite("ring_vs_zigzag");
  CHECK(ids_of(suite) == std::vector<std::string>{"ring/medium", "zigzag/medium", "ring/large", "zigzag/large",
                                                  "ring/large_seq", "zigzag/large_seq",
                                                  "ring/large_full/large/causal=false"});
  for (const Case& c : suite.cases) {
    CHECK(c.world_sizes == std::vector<int>{1, 2});
    CHECK(c.problem.causal == (c.label != "large_full/large"));  // zigzag is causal only
    CHECK(c.problem.window_left == -1);
    CHECK(c.problem.seqlen_q % 4 == 0);  // zigzag cuts S into 2 x world size chunks
    CHECK(c.timing.passes == std::vector<std::string>{"fwd", "bwd", "fwd_bwd"});
  }
}

TEST_CASE("suites: gqa covers the Qwen3 shapes and packed GQA documents") {
  const Suite suite = load_shipped_suite("gqa");
  CHECK(suite.cases.size() == 11);
  for (const Case& c : suite.cases) CHECK(c.problem.heads_kv < c.problem.heads_q);
  CHECK(suite.cases.back().id == "varlen/documents_64k");
  CHECK(suite.cases.back().problem.seqlen_q == 65536);
}

TEST_CASE("suites: scaling sweeps named ranges with a batch sized from a token budget") {
  const Suite suite = load_shipped_suite("scaling");
  CHECK(suite.cases.size() == 2 * 6 + 2 * 5);
  CHECK(suite.cases.at(0).id == "ring/production/seqlen=1024");
  CHECK(suite.cases.at(1).id == "zigzag/production/seqlen=1024");
  CHECK(suite.cases.at(0).problem.batch == 64);
  CHECK(suite.cases.at(0).tokens == 65536);
  CHECK(suite.cases.at(8).id == "ring/production/seqlen=12288");
  CHECK(suite.cases.at(8).problem.batch == 5);  // 65536 / 12288, rounded down
  CHECK(suite.cases.at(12).id == "ring/long_context/seqlen=32768");
  CHECK(suite.cases.at(12).problem.batch == 4);  // 131072 / 32768
  CHECK(suite.cases.back().problem.batch == 1);
  CHECK(suite.cases.at(0).timing.method == "adaptive");
}

TEST_CASE("suites: the GPU suites that report efficiency time adaptively after a sustained warm-up") {
  // Their default of 2 warm-ups and 8 runs once left 5-8% noise and part of each run at the boost clock.
  // (cp_strategies names plugins this test's catalog lacks; tests/plugins loads it with them all.)
  for (const char* name : {"ring_vs_zigzag", "scaling_gpus", "gqa", "scaling"}) {
    CAPTURE(name);
    for (const Case& c : load_shipped_suite(name).cases) {
      CHECK(c.timing.method == "adaptive");
      CHECK(c.timing.warmup_seconds >= 1.0);
      CHECK(c.timing.target_noise <= 0.02);
    }
  }
}
