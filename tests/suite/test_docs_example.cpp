// The example at the top of docs/SUITES.md is a real suite: it must keep parsing.
#include "suite_test_support.h"

#include <fstream>
#include <sstream>

using namespace attnhost::suite;
using namespace attnhost::suite::testing;

namespace {

std::string first_toml_block(const std::string& markdown) {
  const std::string fence = "```toml\n";
  const size_t begin = markdown.find(fence);
  REQUIRE(begin != std::string::npos);
  const size_t end = markdown.find("```", begin + fence.size());
  return markdown.substr(begin + fence.size(), end - begin - fence.size());
}

} // namespace

TEST_CASE("docs: the SUITES.md example parses and expands as it says") {
  std::ifstream in(ATTNHOST_TEST_DOCS_DIR "/SUITES.md");
  REQUIRE(in);
  std::ostringstream text;
  text << in.rdbuf();
  const Suite suite = parse(first_toml_block(text.str()));
  // 2 plugins x 2 presets, then 6 lengths x (ring at 2 block sizes + zigzag).
  REQUIRE(suite.cases.size() == 4 + 6 * 3);
  CHECK(suite.cases.at(0).id == "ring/medium");
  CHECK(suite.cases.at(4).id == "ring/scaling/seqlen=1024/block_size=64");
  CHECK(suite.cases.at(5).id == "ring/scaling/seqlen=1024/block_size=128");
  CHECK(suite.cases.at(6).id == "zigzag/scaling/seqlen=1024");
  CHECK(suite.cases.at(4).problem.batch == 64);
  CHECK(suite.outputs.dir == "results/example");
}
