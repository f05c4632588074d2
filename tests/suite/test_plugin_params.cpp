// Plugin parameters: tables per plugin, checked against each plugin's schema.
#include "suite_test_support.h"

#include <filesystem>

using namespace attnhost::suite;
using namespace attnhost::suite::testing;

namespace {
const std::string kTwoPlugins = "[[case]]\nplugins = [\"ring\", \"blocksparse\"]\npresets = [\"tiny\"]\n";
const std::string kRing = "[[case]]\nplugins = [\"ring\"]\npresets = [\"tiny\"]\n";
} // namespace

TEST_CASE("params: a table per plugin, typed by the plugin's schema") {
  const Suite suite = parse(kTwoPlugins + R"(
[case.params.ring]
block_size = 64
overlap = false

[case.params.blocksparse]
pattern = "bigbird"
density = 1
)");
  REQUIRE(suite.cases.size() == 2);
  const auto& ring = suite.cases.at(0).params;
  CHECK(std::get<int64_t>(ring.at("block_size")) == 64);
  CHECK(std::get<bool>(ring.at("overlap")) == false);
  const auto& blocksparse = suite.cases.at(1).params;
  CHECK(std::get<std::string>(blocksparse.at("pattern")) == "bigbird");
  CHECK(std::get<double>(blocksparse.at("density")) == 1.0);  // an integer where a number goes
  CHECK(blocksparse.count("block_size") == 0);  // defaults are added when the case runs
  CHECK(ids_of(suite) == std::vector<std::string>{"ring/tiny", "blocksparse/tiny"});
}

TEST_CASE("params: a case of one plugin may put them right in [case.params]") {
  const Suite suite = parse(kRing + "[case.params]\nblock_size = 256\n");
  CHECK(std::get<int64_t>(suite.cases.at(0).params.at("block_size")) == 256);
}

TEST_CASE("params: integer lists, and sweeps of values and of lists") {
  const Suite suite = parse(R"(
[[case]]
plugins = ["dilated"]
presets = ["tiny"]
[case.params]
segment_lengths = [[256, 512], [512, 1024]]
dilation_rates = [1, 2]
offset_mode = ["paper", "torchscale"]
)");
  CHECK(ids_of(suite) == std::vector<std::string>{
                             "dilated/tiny/offset_mode=paper/segment_lengths=256,512",
                             "dilated/tiny/offset_mode=paper/segment_lengths=512,1024",
                             "dilated/tiny/offset_mode=torchscale/segment_lengths=256,512",
                             "dilated/tiny/offset_mode=torchscale/segment_lengths=512,1024"});
  const auto& params = suite.cases.at(1).params;
  CHECK(std::get<std::vector<int64_t>>(params.at("segment_lengths")) == std::vector<int64_t>{512, 1024});
  CHECK(std::get<std::vector<int64_t>>(params.at("dilation_rates")) == std::vector<int64_t>{1, 2});
  CHECK(std::get<std::string>(params.at("offset_mode")) == "paper");
}

TEST_CASE("params: [defaults.params.<plugin>] apply wherever the plugin runs, a case overrides them") {
  const Suite suite = parse(R"(
[defaults.params.ring]
block_size = 64
overlap = false

[[case]]
plugins = ["ring", "zigzag"]
presets = ["tiny"]

[[case]]
plugins = ["ring"]
presets = ["small"]
[case.params]
block_size = 128
)");
  CHECK(std::get<int64_t>(suite.cases.at(0).params.at("block_size")) == 64);
  CHECK(suite.cases.at(1).params.empty());
  CHECK(std::get<int64_t>(suite.cases.at(2).params.at("block_size")) == 128);
  CHECK(std::get<bool>(suite.cases.at(2).params.at("overlap")) == false);
}

TEST_CASE("params: a preset's parameters reach the plugins that have them") {
  PresetLibrary library = shipped_library();
  Preset preset = *library.find("small");
  preset.name = "small_sparse";
  preset.params = {{"block_size", int64_t{64}}, {"pattern", std::string("streaming")}};
  library.presets.push_back(preset);
  const Suite suite = parse_suite(
      "[[case]]\nplugins = [\"ring\", \"blocksparse\", \"zigzag\"]\npresets = [\"small_sparse\"]\n"
      "[case.params.blocksparse]\nblock_size = 128\n",
      "t.toml", library, test_catalog());
  CHECK(suite.cases.at(0).params == std::map<std::string, ParamValue>{{"block_size", int64_t{64}}});
  CHECK(suite.cases.at(1).params == std::map<std::string, ParamValue>{{"block_size", int64_t{128}},
                                                                     {"pattern", std::string("streaming")}});
  CHECK(suite.cases.at(2).params.empty());
}

TEST_CASE("params: a preset parameter of the wrong kind is reported at the preset's name") {
  PresetLibrary library = shipped_library();
  Preset preset = *library.find("small");
  preset.name = "bad_sparse";
  preset.params = {{"pattern", std::string("lokal")}};
  library.presets.push_back(preset);
  try {
    parse_suite("[[case]]\nplugins = [\"blocksparse\"]\npresets = [\"bad_sparse\"]\n", "t.toml", library, test_catalog());
    FAIL("no error");
  } catch (const SuiteError& error) {
    CHECK(std::string(error.what()) ==
          "t.toml:3:12: preset 'bad_sparse': parameter 'pattern' of plugin 'blocksparse' must be one of local, "
          "strided, global_local, bigbird, streaming, dilated or explicit, got 'lokal' (did you mean 'local'?)");
  }
}

TEST_CASE("params: errors") {
  CHECK(error_of(kRing + "[case.params.ring]\nblok_size = 64\n") ==
        "t.toml:5:1: plugin 'ring' has no parameter 'blok_size' (did you mean 'block_size'?)");
  CHECK(error_of(kRing + "[case.params.ring]\nstride = 64\n") ==
        "t.toml:5:1: plugin 'ring' has no parameter 'stride' (its parameters: block_size and overlap)");
  CHECK(error_of("[[case]]\nplugins = [\"zigzag\"]\npresets = [\"tiny\"]\n[case.params]\nchunks = 4\n") ==
        "t.toml:5:1: plugin 'zigzag' has no parameter 'chunks' (it takes none)");
  CHECK(error_of(kRing + "[case.params.ring]\nblock_size = \"64\"\n") ==
        "t.toml:5:14: parameter 'block_size' of plugin 'ring' must be an integer, got string");
  CHECK(error_of(kRing + "[case.params.ring]\noverlap = 1\n") ==
        "t.toml:5:11: parameter 'overlap' of plugin 'ring' must be a boolean, got integer");
  CHECK(error_of("[[case]]\nplugins = [\"dilated\"]\npresets = [\"tiny\"]\n[case.params]\nsegment_lengths = [1, \"2\"]\n") ==
        "t.toml:5:23: parameter 'segment_lengths' of plugin 'dilated' must be an array of integers, got an element of type string");
  CHECK(error_of("[[case]]\nplugins = [\"dilated\"]\npresets = [\"tiny\"]\n[case.params]\noffset_mode = \"papr\"\n") ==
        "t.toml:5:15: parameter 'offset_mode' of plugin 'dilated' must be one of paper or torchscale, got 'papr' (did you mean 'paper'?)");
  CHECK(error_of(kRing + "[case.params.ring]\nblock_size = [64, 64]\n") ==
        "t.toml:5:19: parameter 'block_size' of plugin 'ring' lists 64 twice");
  CHECK(error_of(kRing + "[case.params.zigzag]\nx = 1\n") ==
        "t.toml:4:14: [case.params.zigzag] names a plugin this case does not run (it runs ring)");
  CHECK(error_of(kRing + "[case.params.rnig]\nblock_size = 1\n") ==
        "t.toml:4:14: unknown plugin 'rnig' (did you mean 'ring'?)");
  CHECK(error_of(kTwoPlugins + "[case.params]\nblock_size = 64\n") ==
        "t.toml:5:1: parameter 'block_size' in [case.params] must go in a [case.params.<plugin>] table "
        "when a case runs several plugins");
  CHECK(error_of("[defaults.params]\nblock_size = 64\n" + kRing) ==
        "t.toml:2:1: parameter 'block_size' in [defaults.params] must go in a [defaults.params.<plugin>] table");
  CHECK(error_of("[defaults.params.ring]\nblock_sise = 64\n" + kRing) ==
        "t.toml:2:1: plugin 'ring' has no parameter 'block_sise' (did you mean 'block_size'?)");
  CHECK(error_of(kRing + "[case.params]\nblock_size = 64\n[case.params.ring]\nblock_size = 32\n") ==
        "t.toml:7:1: parameter 'block_size' of plugin 'ring' is given twice");
}

TEST_CASE("params: a path is taken from the folder of the file that wrote it, and reaches the plugin absolute") {
  namespace fs = std::filesystem;
  const std::string text = kTwoPlugins + "[case.params.blocksparse]\nmask_file = \"masks/m.txt\"\n";
  const Suite suite = parse_suite(text, "/opt/suites/s.toml", shipped_library(), test_catalog());
  CHECK(std::get<std::string>(suite.cases.at(1).params.at("mask_file")) == "/opt/suites/masks/m.txt");
  const Suite up = parse_suite(kTwoPlugins + "[case.params.blocksparse]\nmask_file = \"../m.txt\"\n",
                               "/opt/suites/s.toml", shipped_library(), test_catalog());
  CHECK(std::get<std::string>(up.cases.at(1).params.at("mask_file")) == "/opt/m.txt");
  const Suite absolute = parse_suite(kTwoPlugins + "[case.params.blocksparse]\nmask_file = \"/data/m.txt\"\n",
                                     "/opt/suites/s.toml", shipped_library(), test_catalog());
  CHECK(std::get<std::string>(absolute.cases.at(1).params.at("mask_file")) == "/data/m.txt");
  // A preset's: from presets.toml's folder, where the shipped example mask lies beside it.
  const Suite preset = parse("[[case]]\nplugins = [\"blocksparse\"]\npresets = [\"bs_explicit\"]\n");
  const fs::path mask = std::get<std::string>(preset.cases.at(0).params.at("mask_file"));
  CHECK(mask.is_absolute());
  CHECK(mask == fs::absolute(fs::path(ATTNHOST_TEST_CONFIGS_DIR) / "masks" / "example_64.txt").lexically_normal());
  CHECK(fs::exists(mask));
}
