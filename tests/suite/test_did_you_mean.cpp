#include "suite/suite.h"

#include <doctest/doctest.h>

using attnhost::suite::did_you_mean;

TEST_CASE("did_you_mean: a typo finds its word") {
  const std::vector<std::string> plugins = {"naive_attention", "ring", "zigzag", "varlen", "dilated"};
  CHECK(did_you_mean("rnig", plugins) == "ring");      // transposition: one edit
  CHECK(did_you_mean("zigzg", plugins) == "zigzag");   // deletion
  CHECK(did_you_mean("Ring", plugins) == "ring");      // case does not matter
  CHECK(did_you_mean("naive_atention", plugins) == "naive_attention");
}

TEST_CASE("did_you_mean: nothing close, no suggestion") {
  const std::vector<std::string> plugins = {"naive_attention", "ring", "zigzag"};
  CHECK(did_you_mean("tiny", plugins).empty());        // two edits from "ring" is too far for 4 letters
  CHECK(did_you_mean("flash", plugins).empty());
  CHECK(did_you_mean("x", {"y"}).empty());              // replacing everything is no suggestion
  CHECK(did_you_mean("ring", {}).empty());
}

TEST_CASE("did_you_mean: the closest of several wins, ties go to the first") {
  CHECK(did_you_mean("mediun", {"medium_fp16", "medium", "median"}) == "medium");
  CHECK(did_you_mean("smal", {"small", "small_fp16"}) == "small");
  CHECK(did_you_mean("qwen3_4", {"qwen3_4b", "qwen3_14b", "qwen3_32b"}) == "qwen3_4b");
}
