// Every shipped suite loads against the real plugins' schemas (the suite tests use a stand-in
// catalog; only here are the built-in plugins loaded).
#include "harness.h"

#include "suite/suite.h"

#include <filesystem>

TEST_CASE("every shipped suite and preset loads against the built-in plugins") {
  attnhost::suite::PluginCatalog catalog;
  attnhost::LoaderOptions o;
  o.builtin = false;
  o.user = false;
  o.environment = false;
  o.dirs = {BUILTIN_PLUGIN_DIR};
  std::vector<std::string> warnings;
  attnhost::PluginRegistry registry = attnhost::PluginRegistry::load(o, warnings);
  CHECK(warnings.empty());
  for (const auto& p : registry.plugins()) {
    attnhost::suite::PluginSchema schema{p->name(), {}};
    for (const attnhost::ParamSpec& s : p->description().params)
      schema.params.push_back({s.name, s.type, s.default_value, s.help, s.choices});
    catalog.push_back(schema);
  }
  const std::filesystem::path configs = CONFIGS_DIR;
  attnhost::suite::PresetLibrary library = attnhost::suite::load_presets(configs);
  int suites = 0;
  for (const auto& entry : std::filesystem::directory_iterator(configs / "suites")) {
    CAPTURE(entry.path().string());
    attnhost::suite::Suite s;
    CHECK_NOTHROW(s = attnhost::suite::load_suite(entry.path(), library, catalog));
    CHECK_FALSE(s.cases.empty());
    CHECK_FALSE(s.description.empty());
    if (s.name == "cp_strategies")  // as the suite tests check the other GPU suites that report efficiency
      for (const attnhost::suite::Case& c : s.cases) CHECK((c.timing.method == "adaptive" && c.timing.warmup_seconds >= 1));
    ++suites;
  }
  CHECK(suites == 10);
}
