// Shared by the suite tests: the shipped preset library, a plugin catalog shaped like the
// built-in plugins, and parsing a suite written inline in a test.
#pragma once

#include "suite/suite.h"

#include <attnhost/plugin.h>
#include <doctest/doctest.h>

#include <string>
#include <vector>

// Failed checks on lists print the lists.
namespace doctest {
template <typename T>
struct StringMaker<std::vector<T>> {
  static String convert(const std::vector<T>& values) {
    String text = "{";
    for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + toString(values[i]);
    return text + "}";
  }
};
} // namespace doctest

namespace attnhost::suite::testing {

inline const PresetLibrary& shipped_library() {
  static const PresetLibrary library = load_presets(ATTNHOST_TEST_CONFIGS_DIR);
  return library;
}

// Names as the built-in plugins use them; parameters enough to exercise every type and choices.
inline const PluginCatalog& test_catalog() {
  static const PluginCatalog catalog = {
      {"naive_attention", {}},
      {"ring",
       {{"block_size", ATTNHOST_PARAM_INT, "128", "rows per tile", {}},
        {"overlap", ATTNHOST_PARAM_BOOL, "true", "overlap transfer with compute", {}}}},
      {"zigzag", {}},
      {"varlen", {{"min_split", ATTNHOST_PARAM_INT, "1", "smallest per-rank piece", {}}}},
      {"dilated",
       {{"segment_lengths", ATTNHOST_PARAM_INT_LIST, "[2048, 4096]", "segment length w per pattern", {}},
        {"dilation_rates", ATTNHOST_PARAM_INT_LIST, "[1, 2]", "dilation r per pattern", {}},
        {"offset_mode", ATTNHOST_PARAM_STRING, "\"paper\"", "head offsets", {"paper", "torchscale"}}}},
      {"blocksparse",
       {{"pattern", ATTNHOST_PARAM_STRING, "\"local\"", "named pattern",
         {"local", "strided", "global_local", "bigbird", "streaming", "dilated", "explicit"}},
        {"block_size", ATTNHOST_PARAM_INT, "128", "block size", {}},
        {"density", ATTNHOST_PARAM_FLOAT, "0.1", "kept fraction", {}},
        {"mask_file", ATTNHOST_PARAM_PATH, "\"\"", "explicit mask", {}}}},
  };
  return catalog;
}

inline Suite parse(const std::string& text) {
  return parse_suite(text, "t.toml", shipped_library(), test_catalog());
}

// The one-line message a bad suite gives.
inline std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const SuiteError& error) {
    return error.what();
  }
  return "(no error)";
}

inline std::vector<std::string> ids_of(const Suite& suite) {
  std::vector<std::string> ids;
  for (const Case& c : suite.cases) ids.push_back(c.id);
  return ids;
}

} // namespace attnhost::suite::testing
