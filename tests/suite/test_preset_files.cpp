// presets.toml and ranges.toml written by a user: what loads and what each mistake says.
#include "suite_test_support.h"

#include <filesystem>
#include <fstream>

using namespace attnhost::suite;
using namespace attnhost::suite::testing;

namespace {

// A configs folder of its own per test, removed afterwards.
class ConfigsDir {
 public:
  ConfigsDir(const std::string& presets, const std::string& ranges) {
    path_ = std::filesystem::temp_directory_path() /
            ("attnhost_suite_test_" + std::to_string(reinterpret_cast<uintptr_t>(this)) + "_" +
             std::to_string(counter_++));
    std::filesystem::create_directories(path_);
    std::ofstream(path_ / "presets.toml") << presets;
    if (!ranges.empty()) std::ofstream(path_ / "ranges.toml") << ranges;
  }
  ~ConfigsDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

const std::string kRanges = "[ranges]\nshort = [128, 256]\n";

// The message loading a configs folder gives, with the folder replaced by DIR.
std::string load_error(const std::string& presets, const std::string& ranges = kRanges) {
  const ConfigsDir dir(presets, ranges);
  try {
    load_presets(dir.path());
  } catch (const SuiteError& error) {
    std::string message = error.what();
    const std::string prefix = dir.path().string();
    if (message.rfind(prefix, 0) == 0) message = "DIR" + message.substr(prefix.size());
    return message;
  }
  return "(no error)";
}

} // namespace

TEST_CASE("preset files: a user's presets, sets and ranges load") {
  const ConfigsDir dir(R"(
[presets.mine]
description = "my model"
batch = 3
seqlen = 2048
heads = 16
kv_heads = 2
head_dim = 192
window = [100, 100]
softmax_scale = 0.5

[presets.packed]
heads = 8
head_dim = 64
causal = true
varlen = { lengths = [10, 20, 30] }
params = { block_size = 64, pattern = "local" }

[sets]
both = ["mine", "packed"]
)", kRanges);
  const PresetLibrary library = load_presets(dir.path());
  REQUIRE(library.presets.size() == 2);
  const Problem& mine = library.find("mine")->problem;
  CHECK(mine.batch == 3);
  CHECK(mine.heads_kv == 2);
  CHECK(mine.head_dim == 192);
  CHECK(mine.window_left == 100);
  CHECK(mine.softmax_scale == 0.5);
  CHECK(mine.dtype == "bf16");
  CHECK_FALSE(mine.causal);
  const Preset& packed = *library.find("packed");
  CHECK(packed.problem.seqlen_q == 60);
  CHECK(packed.problem.batch == 1);
  CHECK(packed.params.size() == 2);
  CHECK(std::get<int64_t>(packed.params.at("block_size")) == 64);
  CHECK(library.sets.at("both") == std::vector<std::string>{"mine", "packed"});
  CHECK(library.ranges.at("short") == std::vector<int64_t>{128, 256});
}

TEST_CASE("preset files: mistakes, each at its place") {
  const std::string head = "[presets.p]\nseqlen = 1024\nheads = 8\nhead_dim = 64\n";
  CHECK(load_error(head + "hedas = 8\n") == "DIR/presets.toml:5:1: unknown key 'hedas' in [presets.p] (did you mean 'heads'?)");
  CHECK(load_error("[presets.p]\nseqlen = 1024\nhead_dim = 64\n") == "DIR/presets.toml:1:1: preset 'p' needs 'heads'");
  CHECK(load_error("[presets.p]\nheads = 8\nhead_dim = 64\n") ==
        "DIR/presets.toml:1:1: preset 'p' needs 'seqlen' (or a [varlen] table)");
  CHECK(load_error(head + "kv_heads = 3\n") == "DIR/presets.toml:5:12: 'heads' (8) must be divisible by 'kv_heads' (3)");
  CHECK(load_error("[presets.p]\nseqlen = [1024, 2048]\nheads = 8\nhead_dim = 64\n") ==
        "DIR/presets.toml:2:10: 'seqlen' must be a single value in a preset, got array");
  CHECK(load_error("[presets.p]\nbatch = \"auto\"\nseqlen = 1024\nheads = 8\nhead_dim = 64\n") ==
        "DIR/presets.toml:2:9: 'batch' must be an integer here (\"auto\" belongs in a suite)");
  CHECK(load_error(head + "tokens = 4096\n") == "DIR/presets.toml:5:1: unknown key 'tokens' in [presets.p]");
  CHECK(load_error(head + "[sets]\ns = [\"q\"]\n") == "DIR/presets.toml:6:6: unknown preset 'q' (expected p)");
  CHECK(load_error(head + "[sets]\np = [\"p\"]\n") == "DIR/presets.toml:6:1: set 'p' has the name of a preset");
  CHECK(load_error("[preset.p]\nheads = 8\n") ==
        "DIR/presets.toml:1:2: unknown key 'preset' in presets.toml (did you mean 'presets'?)");
  CHECK(load_error(head + "heads = 9\n") ==
        "DIR/presets.toml:5:9: Error while parsing key-value pair: cannot redefine existing integer 'heads'");
}

TEST_CASE("preset files: mistakes in ranges.toml") {
  const std::string presets = "[presets.p]\nseqlen = 1024\nheads = 8\nhead_dim = 64\n";
  CHECK(load_error(presets, "[ranges]\nr = []\n") == "DIR/ranges.toml:2:5: range 'r' is empty");
  CHECK(load_error(presets, "[ranges]\nr = [1, 0]\n") == "DIR/ranges.toml:2:9: range 'r' entries must be at least 1, got 0");
  CHECK(load_error(presets, "[ranges]\nr = [\"long\"]\n") ==
        "DIR/ranges.toml:2:6: 'r' must be an array of integers, got an element of type string");
  CHECK(load_error(presets, "[rangs]\n") ==
        "DIR/ranges.toml:1:2: unknown key 'rangs' in ranges.toml (did you mean 'ranges'?)");
  CHECK(load_error(presets, "") == "DIR/ranges.toml:1:1: cannot read the file (no such file)");
}
