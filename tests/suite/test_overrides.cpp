// Command-line overrides and the suite of `attnhost compare`.
#include "suite_test_support.h"

#include <filesystem>

using namespace attnhost::suite;
using namespace attnhost::suite::testing;

namespace {

std::string override_error(Suite suite, const Overrides& overrides) {
  try {
    apply_overrides(suite, overrides);
  } catch (const SuiteError& error) {
    return error.what();
  }
  return "(no error)";
}

Suite presets_suite() {
  return parse("[[case]]\nplugins = [\"ring\", \"zigzag\"]\npresets = [\"medium\", \"qwen3_4b\"]\n");
}

} // namespace

TEST_CASE("overrides: problem fields change every case and name themselves in its id") {
  Suite suite = presets_suite();
  Overrides o;
  o.seqlen = 4096;
  o.heads = 64;
  o.dtype = "fp16";
  o.causal = false;
  o.window = std::pair<int64_t, int64_t>{256, 256};
  apply_overrides(suite, o);
  CHECK(ids_of(suite) == std::vector<std::string>{
                             "ring/medium/seqlen=4096/heads=64/dtype=fp16/causal=false/window=256,256",
                             "zigzag/medium/seqlen=4096/heads=64/dtype=fp16/causal=false/window=256,256",
                             "ring/qwen3_4b/seqlen=4096/heads=64/dtype=fp16/causal=false/window=256,256",
                             "zigzag/qwen3_4b/seqlen=4096/heads=64/dtype=fp16/causal=false/window=256,256"});
  const Problem& mha = suite.cases.at(0).problem;
  CHECK(mha.seqlen_q == 4096);
  CHECK(mha.seqlen_kv == 4096);
  CHECK(mha.heads_q == 64);
  CHECK(mha.heads_kv == 64);
  CHECK(mha.dtype == "fp16");
  CHECK_FALSE(mha.causal);
  CHECK(mha.window_left == 256);
  CHECK(suite.cases.at(2).problem.heads_kv == 4);
  CHECK(suite.cases.at(2).problem.head_dim == 80);
}

TEST_CASE("overrides: an overridden sweep field replaces its id part, equal cases run once") {
  Suite suite = parse("[[case]]\nname = \"s\"\nplugins = [\"ring\"]\nseqlen = [1024, 2048]\nheads = 8\nhead_dim = 64\n");
  Overrides o;
  o.seqlen = 512;
  apply_overrides(suite, o);
  CHECK(ids_of(suite) == std::vector<std::string>{"ring/s/seqlen=512"});
}

TEST_CASE("overrides: --seqlen keeps batch = \"auto\" on its budget, --batch ends it") {
  const std::string text =
      "[[case]]\nname = \"s\"\nplugins = [\"ring\"]\nbatch = \"auto\"\ntokens = 65536\nseqlen = 1024\nheads = 8\nhead_dim = 64\n";
  Suite automatic = parse(text);
  Overrides seqlen;
  seqlen.seqlen = 16384;
  apply_overrides(automatic, seqlen);
  CHECK(automatic.cases.at(0).problem.batch == 4);
  CHECK(automatic.cases.at(0).id == "ring/s/seqlen=16384");

  Suite fixed = parse(text);
  Overrides batch;
  batch.batch = 3;
  apply_overrides(fixed, batch);
  CHECK(fixed.cases.at(0).problem.batch == 3);
  CHECK(fixed.cases.at(0).tokens == 0);
  CHECK(fixed.cases.at(0).id == "ring/s/batch=3");
}

TEST_CASE("overrides: world sizes and timing") {
  Suite suite = presets_suite();
  Overrides o;
  o.world_sizes = std::vector<int>{1, 2, 4};
  o.timing_method = "profiler";
  o.warmup_runs = 0;
  o.timing_runs = 100;
  o.warmup_seconds = 1.5;
  o.rounds = 3;
  apply_overrides(suite, o);
  for (const Case& c : suite.cases) {
    CHECK(c.world_sizes == std::vector<int>{1, 2, 4});
    CHECK(c.timing.method == "profiler");
    CHECK(c.timing.warmup_runs == 0);
    CHECK(c.timing.timing_runs == 100);
    CHECK(c.timing.warmup_seconds == 1.5);
    CHECK(c.timing.rounds == 3);
  }
  CHECK(suite.cases.at(0).id == "ring/medium");  // how a case is run is not what it is
}

TEST_CASE("overrides: each one is checked again") {
  Overrides kv;
  kv.kv_heads = 5;
  CHECK(override_error(presets_suite(), kv) ==
        "command line: 'heads' (24) must be divisible by 'kv_heads' (5) (case 'ring/medium/kv_heads=5')");
  Overrides head_dim;
  head_dim.head_dim = 100;
  CHECK(override_error(presets_suite(), head_dim) == "command line: --head-dim must be a positive multiple of 8, got 100");
  Overrides batch;
  batch.batch = 0;
  CHECK(override_error(presets_suite(), batch) == "command line: --batch must be at least 1, got 0");
  Overrides dtype;
  dtype.dtype = "bf61";
  CHECK(override_error(presets_suite(), dtype) == "command line: --dtype: unknown dtype 'bf61' (did you mean 'bf16'?)");
  Overrides grad;
  grad.grad_dtype = "fp8_e5m2";
  CHECK(override_error(presets_suite(), grad) ==
        "command line: 'grad_dtype' = \"fp8_e5m2\" goes with dtype \"fp8_e4m3\" (dO in e5m2 beside e4m3 Q, K and V), "
        "not \"bf16\" (case 'ring/medium/grad_dtype=fp8_e5m2')");
  grad.dtype = "fp8_e4m3";
  CHECK(override_error(presets_suite(), grad) == "(no error)");
  Overrides window;
  window.window = std::pair<int64_t, int64_t>{-3, 0};
  CHECK(override_error(presets_suite(), window) ==
        "command line: --window values must be -1 (unbounded) or at least 0, got -3");
  Overrides sizes;
  sizes.world_sizes = std::vector<int>{0};
  CHECK(override_error(presets_suite(), sizes) == "command line: --world-sizes: world sizes must be at least 1, got 0");
  Overrides method;
  method.timing_method = "fastest";
  CHECK(override_error(presets_suite(), method) ==
        "command line: --timing-method: unknown timing method 'fastest' (expected simple, warmup, adaptive or profiler)");
  Overrides runs;
  runs.timing_runs = 0;
  CHECK(override_error(presets_suite(), runs) == "command line: --timing-runs must be at least 1, got 0");
  Overrides warm;
  warm.warmup_seconds = 700;
  CHECK(override_error(presets_suite(), warm) == "command line: --warmup-seconds must be between 0 and 600, got 700");
  Overrides rounds;
  rounds.rounds = 0;
  CHECK(override_error(presets_suite(), rounds) == "command line: --rounds must be at least 1, got 0");
  rounds.rounds = 101;
  CHECK(override_error(presets_suite(), rounds) == "command line: --rounds must be at most 100, got 101");
}

TEST_CASE("overrides: --seqlen does not apply to packed variable-length cases") {
  const Suite suite = parse("[[case]]\nname = \"v\"\nplugins = [\"varlen\"]\nheads = 8\nhead_dim = 64\n"
                            "[case.varlen]\nlengths = [100, 200]\n");
  Overrides o;
  o.seqlen = 4096;
  CHECK(override_error(suite, o) ==
        "command line: --batch and --seqlen do not apply to case 'varlen/v': its packed lengths come from its [varlen] table");
}

TEST_CASE("compare: plugins x one preset or set, through the suite parser") {
  const Suite suite = make_compare_suite({"ring", "zigzag"}, "medium", shipped_library(), test_catalog());
  CHECK(suite.name == "compare");
  CHECK(suite.description == "ring vs zigzag on medium");
  CHECK(ids_of(suite) == std::vector<std::string>{"ring/medium", "zigzag/medium"});
  CHECK(suite.cases.at(0).problem.heads_q == 24);
  // The text recorded in results is a suite that reproduces the run.
  const Suite again = parse_suite(suite.text, "again.toml", shipped_library(), test_catalog());
  CHECK(ids_of(again) == ids_of(suite));

  CHECK(ids_of(make_compare_suite({"ring"}, "multi_gpu", shipped_library(), test_catalog())) ==
        std::vector<std::string>{"ring/small", "ring/medium"});
}

TEST_CASE("compare: errors name the command line") {
  const auto compare_error = [](const std::vector<std::string>& plugins, const std::string& preset) {
    try {
      make_compare_suite(plugins, preset, shipped_library(), test_catalog());
    } catch (const SuiteError& error) {
      return std::string(error.what());
    }
    return std::string("(no error)");
  };
  CHECK(compare_error({"rnig"}, "medium") == "command line: unknown plugin 'rnig' (did you mean 'ring'?)");
  CHECK(compare_error({"ring", "ring"}, "medium") == "command line: plugin 'ring' is named twice");
  CHECK(compare_error({}, "medium") == "command line: compare needs at least one plugin");
  CHECK(compare_error({"ring"}, "mediun") == "--config: unknown preset or preset set 'mediun' (did you mean 'medium'?)");
}

TEST_CASE("overrides: --param sets a parameter on every case whose plugin has it, typed by its schema") {
  Suite suite = presets_suite();
  Overrides o;
  o.params = {{"overlap", "false"}, {"block_size", "64"}};
  apply_overrides(suite, o, test_catalog());
  CHECK(ids_of(suite) == std::vector<std::string>{"ring/medium/overlap=false/block_size=64", "zigzag/medium",
                                                  "ring/qwen3_4b/overlap=false/block_size=64", "zigzag/qwen3_4b"});
  CHECK(std::get<bool>(suite.cases.at(0).params.at("overlap")) == false);
  CHECK(std::get<int64_t>(suite.cases.at(0).params.at("block_size")) == 64);
  CHECK(suite.cases.at(1).params.count("overlap") == 0);

  Suite dilated = parse("[[case]]\nplugins = [\"dilated\"]\npresets = [\"medium\"]\n");
  Overrides lists;
  lists.params = {{"segment_lengths", "[1024, 2048]"}, {"dilation_rates", "1,2"}, {"offset_mode", "\"torchscale\""}};
  apply_overrides(dilated, lists, test_catalog());
  const Case& c = dilated.cases.at(0);
  CHECK(std::get<std::vector<int64_t>>(c.params.at("segment_lengths")) == std::vector<int64_t>{1024, 2048});
  CHECK(std::get<std::vector<int64_t>>(c.params.at("dilation_rates")) == std::vector<int64_t>{1, 2});
  CHECK(std::get<std::string>(c.params.at("offset_mode")) == "torchscale");

  // A path from the command line is taken from the working directory.
  Suite blocksparse = parse("[[case]]\nplugins = [\"blocksparse\"]\npresets = [\"medium\"]\n");
  Overrides path;
  path.params = {{"mask_file", "masks/m.txt"}};
  apply_overrides(blocksparse, path, test_catalog());
  CHECK(std::get<std::string>(blocksparse.cases.at(0).params.at("mask_file")) ==
        (std::filesystem::current_path() / "masks" / "m.txt").string());
}

TEST_CASE("overrides: a --param no plugin has, or a value of the wrong type or choice, is one line") {
  const auto error = [](const std::string& name, const std::string& value) {
    Suite suite = presets_suite();
    Overrides o;
    o.params = {{name, value}};
    try {
      apply_overrides(suite, o, test_catalog());
    } catch (const SuiteError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  CHECK(error("engine", "cudnn") ==
        "command line: --param engine=cudnn: no plugin of this run (ring and zigzag) has a parameter 'engine' "
        "(attnhost list plugins -v shows them)");
  CHECK(error("overlap", "yes") ==
        "command line: --param overlap=yes: parameter 'overlap' of plugin 'ring' takes true or false, got 'yes'");
  CHECK(error("block_size", "12x") ==
        "command line: --param block_size=12x: parameter 'block_size' of plugin 'ring' takes an integer, got '12x'");
  Suite sparse = parse("[[case]]\nplugins = [\"blocksparse\"]\npresets = [\"medium\"]\n");
  Overrides pattern;
  pattern.params = {{"pattern", "lcoal"}};
  CHECK_THROWS_WITH(apply_overrides(sparse, pattern, test_catalog()),
                    doctest::Contains("got 'lcoal' (did you mean 'local'?)"));
}
