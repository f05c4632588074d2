// Every class of bad input, with the exact one-line message and where it points.
#include "suite_test_support.h"

using namespace attnhost::suite;
using namespace attnhost::suite::testing;

namespace {
// A valid case to which a test adds one bad line (line 4 onwards).
const std::string kCase = "[[case]]\nplugins = [\"ring\"]\npresets = [\"tiny\"]\n";
// A valid inline case (lines 1 to 6) to which a test adds one bad line.
const std::string kInline =
    "[[case]]\nname = \"x\"\nplugins = [\"ring\"]\nseqlen = 1024\nheads = 8\nhead_dim = 64\n";
} // namespace

TEST_CASE("errors: TOML syntax, at toml++'s position") {
  CHECK(error_of("name = \"unterminated\n") ==
        "t.toml:1:21: Error while parsing string: unescaped control characters other than TAB (U+0009) "
        "are explicitly prohibited");
  CHECK(error_of(kCase + "heads = = 3\n") == "t.toml:4:9: Error while parsing value: could not determine value type");
}

TEST_CASE("errors: unknown keys at every level, with a did-you-mean") {
  CHECK(error_of("[[cases]]\nplugins = [\"ring\"]\n") ==
        "t.toml:1:3: unknown key 'cases' at the top level (did you mean 'case'?)");
  CHECK(error_of("nmae = \"x\"\n" + kCase) == "t.toml:1:1: unknown key 'nmae' at the top level (did you mean 'name'?)");
  CHECK(error_of(kCase + "hedas = 8\n") == "t.toml:4:1: unknown key 'hedas' in [[case]] (did you mean 'heads'?)");
  CHECK(error_of(kCase + "num_heads = 8\n") == "t.toml:4:1: unknown key 'num_heads' in [[case]] (did you mean 'heads'?)");
  CHECK(error_of(kCase + "plugin = \"ring\"\n") == "t.toml:4:1: unknown key 'plugin' in [[case]] (did you mean 'plugins'?)");
  CHECK(error_of(kCase + "colour = \"red\"\n") == "t.toml:4:1: unknown key 'colour' in [[case]]");
  CHECK(error_of("[defaults]\nworld_size = [1]\n" + kCase) ==
        "t.toml:2:1: unknown key 'world_size' in [defaults] (did you mean 'world_sizes'?)");
  CHECK(error_of("[defaults.timing]\nmetod = \"simple\"\n" + kCase) ==
        "t.toml:2:1: unknown key 'metod' in [defaults.timing] (did you mean 'method'?)");
  CHECK(error_of(kCase + "[case.timing]\nwarmup_run = 3\n") ==
        "t.toml:5:1: unknown key 'warmup_run' in [case.timing] (did you mean 'warmup_runs'?)");
  CHECK(error_of(kCase + "[case.check]\nquery_row = 3\n") ==
        "t.toml:5:1: unknown key 'query_row' in [case.check] (did you mean 'query_rows'?)");
  CHECK(error_of(kCase + "[case.data]\nsed = 3\n") ==
        "t.toml:5:1: unknown key 'sed' in [case.data] (did you mean 'seed'?)");
  CHECK(error_of(kCase + "[outputs]\nformat = [\"json\"]\n") ==
        "t.toml:5:1: unknown key 'format' in [outputs] (did you mean 'formats'?)");
  CHECK(error_of("[[case]]\nname = \"v\"\nplugins = [\"varlen\"]\nheads = 8\nhead_dim = 64\n[case.varlen]\nlenghts = [1]\n") ==
        "t.toml:7:1: unknown key 'lenghts' in [varlen] (did you mean 'lengths'?)");
}

TEST_CASE("errors: keys that belong in [defaults] or a case, written at the top level") {
  CHECK(error_of("[timing]\nmethod = \"simple\"\n" + kCase) ==
        "t.toml:1:2: unknown top-level key 'timing' (it belongs in [defaults] or in a [[case]])");
  CHECK(error_of("world_sizes = [1, 2]\n" + kCase) ==
        "t.toml:1:1: unknown top-level key 'world_sizes' (it belongs in [defaults] or in a [[case]])");
}

TEST_CASE("errors: wrong types say what was expected and what was found") {
  CHECK(error_of(kInline + "kv_heads = \"8\"\n") == "t.toml:7:12: 'kv_heads' must be an integer, got string");
  CHECK(error_of(kInline + "causal = 1\n") == "t.toml:7:10: 'causal' must be a boolean, got integer");
  CHECK(error_of(kInline + "dtype = 16\n") == "t.toml:7:9: 'dtype' must be a string, got integer");
  CHECK(error_of(kInline + "softmax_scale = \"x\"\n") == "t.toml:7:17: 'softmax_scale' must be a number, got string");
  CHECK(error_of(kInline + "window = 512\n") == "t.toml:7:10: 'window' must be an array of integers, got integer");
  CHECK(error_of("[[case]]\nname = \"x\"\nplugins = [\"ring\"]\nseqlen = 1024\nheads = 8.5\nhead_dim = 64\n") ==
        "t.toml:5:9: 'heads' must be an integer, got float");
  CHECK(error_of("[[case]]\nplugins = 3\npresets = [\"tiny\"]\n") ==
        "t.toml:2:11: 'plugins' must be a string or an array of strings, got integer");
  CHECK(error_of("[[case]]\nplugins = [\"ring\", 3]\npresets = [\"tiny\"]\n") ==
        "t.toml:2:20: 'plugins' must be an array of strings, got an element of type integer");
  CHECK(error_of(kCase + "world_sizes = 2\n") ==
        "t.toml:4:15: 'world_sizes' must be an array of integers, e.g. [1, 2], got integer");
  CHECK(error_of(kCase + "world_sizes = [1, \"2\"]\n") ==
        "t.toml:4:19: 'world_sizes' must be an array of integers, got an element of type string");
  CHECK(error_of(kCase + "timing = \"fast\"\n") == "t.toml:4:10: 'timing' must be a table, got string");
  CHECK(error_of(kCase + "[case.timing]\nwarmup_runs = true\n") ==
        "t.toml:5:15: 'warmup_runs' must be an integer, got boolean");
  CHECK(error_of("name = 3\n" + kCase) == "t.toml:1:8: 'name' must be a string, got integer");
  CHECK(error_of("case = 3\n") == "t.toml:1:8: 'case' must be an array of tables ([[case]]), got integer");
  CHECK(error_of("case = [1]\n") ==
        "t.toml:1:9: 'case' must be an array of tables ([[case]]), got an element of type integer");
}

TEST_CASE("errors: impossible problem values") {
  CHECK(error_of(kInline + "batch = 0\n") == "t.toml:7:9: 'batch' must be at least 1, got 0");
  CHECK(error_of("[[case]]\nname = \"x\"\nplugins = [\"ring\"]\nseqlen = -5\nheads = 8\nhead_dim = 64\n") ==
        "t.toml:4:10: 'seqlen' must be at least 1, got -5");
  CHECK(error_of("[[case]]\nname = \"x\"\nplugins = [\"ring\"]\nseqlen = 1024\nheads = 0\nhead_dim = 64\n") ==
        "t.toml:5:9: 'heads' must be at least 1, got 0");
  CHECK(error_of("[[case]]\nname = \"x\"\nplugins = [\"ring\"]\nseqlen = 1024\nheads = 8\nhead_dim = 100\n") ==
        "t.toml:6:12: 'head_dim' must be a positive multiple of 8, got 100");
  CHECK(error_of(kInline + "kv_heads = 3\n") == "t.toml:7:12: 'heads' (8) must be divisible by 'kv_heads' (3)");
  CHECK(error_of(kInline + "kv_heads = 16\n") == "t.toml:7:12: 'kv_heads' (16) must not exceed 'heads' (8)");
  CHECK(error_of(kInline + "window = [-2, 0]\n") ==
        "t.toml:7:11: 'window' values must be -1 (unbounded) or at least 0, got -2");
  CHECK(error_of(kInline + "window = [1, 2, 3]\n") == "t.toml:7:10: 'window' must be [left, right], got 3 values");
  CHECK(error_of(kInline + "dtype = \"bf61\"\n") == "t.toml:7:9: unknown dtype 'bf61' (did you mean 'bf16'?)");
  CHECK(error_of(kInline + "dtype = \"bf32\"\n") == "t.toml:7:9: unknown dtype 'bf32' (expected bf16, fp16, fp32, fp8_e4m3 or fp8_e5m2)");
  CHECK(error_of(kInline + "dtype = \"int8\"\n") == "t.toml:7:9: unknown dtype 'int8' (expected bf16, fp16, fp32, fp8_e4m3 or fp8_e5m2)");
  CHECK(error_of(kInline + "softmax_scale = 0\n") == "t.toml:7:17: 'softmax_scale' must be positive, got 0");
  CHECK(error_of(kInline + "grad_dtype = \"fp8_e4m3\"\n") ==
        "t.toml:7:14: unknown grad_dtype 'fp8_e4m3' (did you mean 'fp8_e5m2'?)");
  CHECK(error_of(kInline + "grad_dtype = \"fp8_e5m2\"\n") ==
        "t.toml:7:14: 'grad_dtype' = \"fp8_e5m2\" goes with dtype \"fp8_e4m3\" (dO in e5m2 beside e4m3 Q, K and V), not "
        "\"bf16\"");
  CHECK(error_of(kInline + "seqlen_kv = 0\n") == "t.toml:7:13: 'seqlen_kv' must be at least 1, got 0");
}

TEST_CASE("errors: a value that is wrong only against a preset points at the case's field") {
  CHECK(error_of(kCase + "kv_heads = 3\n") ==
        "t.toml:4:12: 'heads' (8) must be divisible by 'kv_heads' (3) (preset 'tiny')");
  CHECK(error_of("[[case]]\nplugins = [\"ring\"]\npresets = [\"medium\", \"qwen3_14b\"]\nkv_heads = 12\n") ==
        "t.toml:4:12: 'heads' (40) must be divisible by 'kv_heads' (12) (preset 'qwen3_14b')");
}

TEST_CASE("errors: one bad point of a sweep is found at its own element") {
  CHECK(error_of("[[case]]\nname = \"x\"\nplugins = [\"ring\"]\nseqlen = 1024\nheads = 8\nhead_dim = [64, 100]\n") ==
        "t.toml:6:17: 'head_dim' must be a positive multiple of 8, got 100");
  CHECK(error_of(kInline + "kv_heads = [1, 2, 3]\n") == "t.toml:7:12: 'heads' (8) must be divisible by 'kv_heads' (3)");
  CHECK(error_of(kInline + "dtype = [\"bf16\", \"fp61\"]\n") ==
        "t.toml:7:18: unknown dtype 'fp61' (did you mean 'fp16'?)");
  CHECK(error_of(kInline + "causal = [true, true]\n") == "t.toml:7:17: 'causal' lists true twice");
  CHECK(error_of(kInline + "dtype = []\n") == "t.toml:7:9: 'dtype' sweep is empty");
  CHECK(error_of(kInline + "window = [[1, 0], [1]]\n") == "t.toml:7:19: 'window' must be [left, right], got 1 value");
}

TEST_CASE("errors: unknown presets, sets, ranges and plugins, with a did-you-mean") {
  CHECK(error_of("[[case]]\nplugins = [\"ring\"]\npresets = [\"mediun\"]\n") ==
        "t.toml:3:12: unknown preset or preset set 'mediun' (did you mean 'medium'?)");
  CHECK(error_of("[[case]]\nplugins = [\"ring\"]\npresets = [\"tiny\", \"qwen3_4\"]\n") ==
        "t.toml:3:20: unknown preset or preset set 'qwen3_4' (did you mean 'qwen3_4b'?)");
  CHECK(error_of("[[case]]\nplugins = [\"ring\"]\npresets = \"corectness\"\n") ==
        "t.toml:3:11: unknown preset or preset set 'corectness' (did you mean 'correctness'?)");
  CHECK(error_of("[[case]]\nplugins = [\"rnig\"]\npresets = [\"tiny\"]\n") ==
        "t.toml:2:12: unknown plugin 'rnig' (did you mean 'ring'?)");
  CHECK(error_of("[[case]]\nplugins = [\"ring\", \"flash\"]\npresets = [\"tiny\"]\n") ==
        "t.toml:2:20: unknown plugin 'flash' (loaded: naive_attention, ring, zigzag, varlen, dilated and blocksparse)");
  CHECK(error_of("[defaults]\nplugins = [\"zigzg\"]\n" + kCase) ==
        "t.toml:2:12: unknown plugin 'zigzg' (did you mean 'zigzag'?)");
  CHECK(error_of("[[case]]\nname = \"x\"\nplugins = [\"ring\"]\nseqlen = \"prodution\"\nheads = 8\nhead_dim = 64\n") ==
        "t.toml:4:10: unknown sequence range 'prodution' (did you mean 'production'?)");
}

TEST_CASE("errors: no plugin loaded at all is said plainly") {
  try {
    parse_suite(kCase, "t.toml", shipped_library(), {});
    FAIL("no error");
  } catch (const SuiteError& error) {
    CHECK(std::string(error.what()) == "t.toml:2:12: unknown plugin 'ring' (no plugins are loaded)");
  }
}

TEST_CASE("errors: batch = \"auto\" and tokens go together") {
  CHECK(error_of(kInline + "batch = \"auto\"\n") ==
        "t.toml:7:9: batch = \"auto\" needs 'tokens' (the token budget of one step)");
  CHECK(error_of(kInline + "tokens = 65536\n") == "t.toml:7:10: 'tokens' sizes the batch only with batch = \"auto\"");
  CHECK(error_of(kInline + "batch = \"many\"\n") == "t.toml:7:9: 'batch' must be an integer or \"auto\", got \"many\"");
  CHECK(error_of(kInline + "batch = \"auto\"\ntokens = 0\n") == "t.toml:8:10: 'tokens' must be at least 1, got 0");
}

TEST_CASE("errors: varlen tables") {
  const std::string head = "[[case]]\nname = \"v\"\nplugins = [\"varlen\"]\nheads = 8\nhead_dim = 64\n";
  CHECK(error_of(head + "[case.varlen]\nseed = 1\n") ==
        "t.toml:6:1: 'varlen' needs 'lengths' (an explicit list) or 'distribution' (uniform, lognormal or documents)");
  CHECK(error_of(head + "[case.varlen]\nlengths = [10]\ndistribution = \"uniform\"\n") ==
        "t.toml:8:16: 'varlen' takes 'lengths' or 'distribution', not both");
  CHECK(error_of(head + "[case.varlen]\nlengths = [10, 0]\n") == "t.toml:7:16: 'lengths' entries must be at least 1, got 0");
  CHECK(error_of(head + "[case.varlen]\nlengths = []\n") == "t.toml:7:11: 'lengths' must not be empty");
  CHECK(error_of(head + "[case.varlen]\nlengths = [10]\nseed = 3\n") ==
        "t.toml:8:8: 'seed' applies to a distribution, not to explicit 'lengths'");
  CHECK(error_of(head + "[case.varlen]\ndistribution = \"zipf\"\ntotal_tokens = 100\n") ==
        "t.toml:7:16: unknown length distribution 'zipf' (expected uniform, lognormal or documents)");
  CHECK(error_of(head + "[case.varlen]\ndistribution = \"unifrom\"\ntotal_tokens = 100\n") ==
        "t.toml:7:16: unknown length distribution 'unifrom' (did you mean 'uniform'?)");
  CHECK(error_of(head + "[case.varlen]\ndistribution = \"uniform\"\n") ==
        "t.toml:6:1: 'distribution' needs 'total_tokens' (the token budget to fill)");
  CHECK(error_of(head + "[case.varlen]\ndistribution = \"uniform\"\ntotal_tokens = 100\nmin_length = 50\nmax_length = 10\n") ==
        "t.toml:10:14: 'max_length' (10) must not be less than 'min_length' (50)");
  CHECK(error_of(head + "[case.varlen]\ndistribution = \"uniform\"\ntotal_tokens = 100\nsigma = 1.0\n") ==
        "t.toml:9:9: 'sigma' applies to distribution = \"lognormal\" only");
  CHECK(error_of(head + "seqlen = 4096\n[case.varlen]\nlengths = [10]\n") ==
        "t.toml:6:10: 'seqlen' cannot be combined with 'varlen' (the lengths set the tokens)");
  CHECK(error_of(head + "varlen = 3\n") == "t.toml:6:10: 'varlen' must be a table, got integer");
}

TEST_CASE("errors: timing, check, data, world sizes and outputs") {
  CHECK(error_of(kCase + "timing.method = \"fast\"\n") ==
        "t.toml:4:17: unknown timing method 'fast' (expected simple, warmup, adaptive or profiler)");
  CHECK(error_of(kCase + "timing.method = \"adaptve\"\n") ==
        "t.toml:4:17: unknown timing method 'adaptve' (did you mean 'adaptive'?)");
  CHECK(error_of(kCase + "timing.timing_runs = 0\n") == "t.toml:4:22: 'timing_runs' must be at least 1, got 0");
  CHECK(error_of(kCase + "timing.warmup_runs = -1\n") == "t.toml:4:22: 'warmup_runs' must be at least 0, got -1");
  CHECK(error_of(kCase + "timing.rounds = 0\n") == "t.toml:4:17: 'rounds' must be at least 1, got 0");
  CHECK(error_of(kCase + "timing.rounds = 1000\n") == "t.toml:4:17: 'rounds' must be at most 100, got 1000");
  CHECK(error_of(kCase + "timing.target_noise = 2\n") ==
        "t.toml:4:23: 'target_noise' must be between 0 and 1 (a relative noise, e.g. 0.02), got 2");
  CHECK(error_of(kCase + "timing.max_seconds = 0\n") == "t.toml:4:22: 'max_seconds' must be positive, got 0");
  CHECK(error_of(kCase + "timing.warmup_seconds = -1\n") ==
        "t.toml:4:25: 'warmup_seconds' must be between 0 and 600, got -1");
  CHECK(error_of(kCase + "timing.passes = [\"fwd\", \"backward\"]\n") ==
        "t.toml:4:25: unknown pass 'backward' (expected fwd, bwd or fwd_bwd)");
  CHECK(error_of(kCase + "timing.passes = []\n") == "t.toml:4:17: 'passes' must name at least one of fwd, bwd or fwd_bwd");
  CHECK(error_of(kCase + "check.tolerance_scale = -1\n") == "t.toml:4:25: 'tolerance_scale' must be positive, got -1");
  CHECK(error_of(kCase + "check.query_rows = -1\n") == "t.toml:4:20: 'query_rows' must be at least 0, got -1");
  CHECK(error_of(kCase + "data.distribution = \"gauss\"\n") ==
        "t.toml:4:21: unknown data distribution 'gauss' (expected normal, uniform or scaled)");
  CHECK(error_of(kCase + "data.seed = -3\n") == "t.toml:4:13: 'seed' must be at least 0, got -3");
  CHECK(error_of(kCase + "data.scale = 0.0\n") == "t.toml:4:14: 'scale' must be positive, got 0");
  CHECK(error_of(kCase + "world_sizes = [1, 0]\n") == "t.toml:4:19: world sizes must be at least 1, got 0");
  CHECK(error_of(kCase + "world_sizes = [2, 4, 2]\n") == "t.toml:4:22: world size 2 is listed twice");
  CHECK(error_of(kCase + "world_sizes = []\n") == "t.toml:4:15: 'world_sizes' must not be empty");
  CHECK(error_of(kCase + "[outputs]\nformats = [\"json\", \"htlm\"]\n") ==
        "t.toml:5:20: unknown output format 'htlm' (expected console, json, jsonl, csv, markdown, charts or trace)");
  CHECK(error_of(kCase + "[outputs]\nformats = [\"markdwn\"]\n") ==
        "t.toml:5:12: unknown output format 'markdwn' (did you mean 'markdown'?)");
}

TEST_CASE("errors: incomplete cases") {
  CHECK(error_of("name = \"empty\"\n") == "t.toml:1:1: the suite has no [[case]] (nothing to run)");
  CHECK(error_of("[[case]]\npresets = [\"tiny\"]\n") ==
        "t.toml:1:1: the case names no plugin: add plugins = [...] here or in [defaults]");
  CHECK(error_of("[[case]]\nplugins = [\"ring\"]\n") ==
        "t.toml:1:1: the case has no problem: add presets = [...] or problem fields (seqlen, heads, head_dim, ...)");
  CHECK(error_of("[[case]]\nplugins = [\"ring\"]\nseqlen = 1024\nheads = 8\nhead_dim = 64\n") ==
        "t.toml:1:1: a case without presets needs a 'name' (it labels the case's results)");
  CHECK(error_of("[[case]]\nname = \"x\"\nplugins = [\"ring\"]\nseqlen = 1024\nhead_dim = 64\n") ==
        "t.toml:1:1: case 'x' needs 'heads' (or presets = [...])");
  CHECK(error_of("[[case]]\nname = \"x\"\nplugins = [\"ring\"]\nheads = 8\nhead_dim = 64\n") ==
        "t.toml:1:1: case 'x' needs 'seqlen' or a [varlen] table (or presets = [...])");
  CHECK(error_of("[[case]]\nname = \"my case\"\nplugins = [\"ring\"]\npresets = [\"tiny\"]\n") ==
        "t.toml:2:8: 'name' may hold letters, digits, '_', '-' and '.', got \"my case\"");
  CHECK(error_of("[[case]]\nplugins = []\npresets = [\"tiny\"]\n") == "t.toml:2:11: 'plugins' must name at least one plugin");
}

TEST_CASE("errors: repeated plugins, presets and case ids") {
  CHECK(error_of("[[case]]\nplugins = [\"ring\", \"ring\"]\npresets = [\"tiny\"]\n") ==
        "t.toml:2:20: plugin 'ring' is listed twice");
  CHECK(error_of("[[case]]\nplugins = [\"ring\"]\npresets = [\"tiny\", \"correctness\"]\n") ==
        "t.toml:3:20: preset 'tiny' is listed twice");
  CHECK(error_of(kCase + "\n" + kCase) ==
        "t.toml:5:1: duplicate case id 'ring/tiny' (first from the case at t.toml:1:1); "
        "give one of the cases a distinct 'name'");
}

TEST_CASE("errors: a file that cannot be read") {
  try {
    load_suite("/no/such/suite.toml", shipped_library(), test_catalog());
    FAIL("no error");
  } catch (const SuiteError& error) {
    CHECK(std::string(error.what()) == "/no/such/suite.toml:1:1: cannot read the file (no such file)");
  }
}
