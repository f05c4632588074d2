// The loader: what it accepts, and one clear line for each file it rejects.
#include "plugins/loader.h"

#include <attnhost/plugin.hpp>
#include <doctest/doctest.h>

#include <cstring>

#include <filesystem>
#include <fstream>

using namespace attnhost;
namespace fs = std::filesystem;

namespace {

// This host's ABI, as the loader writes it ("1.1"), and a plugin's of the next major.
const std::string kHostAbi = std::to_string(ATTNHOST_ABI_MAJOR) + "." + std::to_string(ATTNHOST_ABI_MINOR);
const std::string kNextMajorAbi = std::to_string(ATTNHOST_ABI_MAJOR + 1) + "." + std::to_string(ATTNHOST_ABI_MINOR);

fs::path variant(const std::string& name) {
  return fs::path(TEST_PLUGIN_DIR) / name / ("libabi_" + name + ".so");
}

struct Loaded {
  PluginRegistry registry;
  std::vector<std::string> warnings;
};

Loaded load_files(std::vector<fs::path> files, std::vector<fs::path> dirs = {}, bool insecure = false) {
  LoaderOptions o;
  o.builtin = false;
  o.user = false;
  o.environment = false;
  o.files = std::move(files);
  o.dirs = std::move(dirs);
  o.allow_insecure = insecure;
  Loaded l;
  l.registry = PluginRegistry::load(o, l.warnings);
  return l;
}

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("attnhost-test-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  fs::permissions(d, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                         fs::perms::others_read | fs::perms::others_exec);
  return d;
}

}  // namespace

TEST_CASE("a valid plugin loads and describes itself") {
  Loaded l = load_files({variant("good")});
  REQUIRE(l.warnings.empty());
  REQUIRE(l.registry.plugins().size() == 1);
  const PluginDescription& d = l.registry.plugins()[0]->description();
  CHECK(d.name == "abi_good");
  CHECK(d.version == "1.0.0");
  CHECK(d.max_world_size == 1);
  CHECK_FALSE(d.has_backward);
}

TEST_CASE("a file that is not a shared library is rejected") {
  fs::path dir = temp_dir("text");
  std::ofstream(dir / "notes.so") << "not a library\n";
  Loaded l = load_files({dir / "notes.so"});
  CHECK(l.registry.plugins().empty());
  REQUIRE(l.warnings.size() == 1);
  CHECK(l.warnings[0] == "plugin " + (dir / "notes.so").string() + ": not a shared library (no ELF header); skipped");
  fs::remove_all(dir);
}

TEST_CASE("a library without the entry symbol is rejected") {
  Loaded l = load_files({variant("no_entry")});
  REQUIRE(l.warnings.size() == 1);
  CHECK(l.warnings[0] == "plugin " + variant("no_entry").string() +
                             ": no entry symbol 'attnhost_plugin_entry' (not an attnhost plugin); skipped");
}

TEST_CASE("a different ABI major is rejected with both versions") {
  Loaded l = load_files({variant("abi_major_2")});
  REQUIRE(l.warnings.size() == 1);
  CHECK(l.warnings[0] == "plugin " + variant("abi_major_2").string() +
                             ": built for plugin ABI " + kNextMajorAbi + "; this host speaks ABI " + kHostAbi + "; skipped");
}

TEST_CASE("a plugin that refuses the host's version is rejected") {
  Loaded l = load_files({variant("refuses")});
  REQUIRE(l.warnings.size() == 1);
  CHECK(l.warnings[0] == "plugin " + variant("refuses").string() + ": refused the host's ABI " + kHostAbi + "; skipped");
}

TEST_CASE("a table smaller than the ABI requires is rejected") {
  Loaded l = load_files({variant("small_table")});
  REQUIRE(l.warnings.size() == 1);
  CHECK(l.warnings[0] == "plugin " + variant("small_table").string() + ": function table smaller than ABI " + kHostAbi + " requires; skipped");
}

TEST_CASE("describe that fails or throws is rejected") {
  Loaded l = load_files({variant("describe_fails"), variant("describe_throws")});
  CHECK(l.registry.plugins().empty());
  REQUIRE(l.warnings.size() == 2);
  CHECK(l.warnings[0] == "plugin " + variant("describe_fails").string() +
                             ": describe failed: describe: licence file not found; skipped");
  CHECK(l.warnings[1] == "plugin " + variant("describe_throws").string() +
                             ": describe threw an exception across the ABI; skipped");
}

TEST_CASE("a missing symbol fails at load, not later") {
  Loaded l = load_files({variant("missing_symbol")});
  REQUIRE(l.warnings.size() == 1);
  CHECK(l.warnings[0].find("load failed: ") != std::string::npos);
  CHECK(l.warnings[0].find("attnhost_test_symbol_nobody_defines") != std::string::npos);
}

TEST_CASE("a duplicate name: the first of one origin wins and the warning names both files") {
  Loaded l = load_files({variant("good"), variant("duplicate")});
  REQUIRE(l.registry.plugins().size() == 1);
  CHECK(l.registry.plugins()[0]->description().version == "1.0.0");
  REQUIRE(l.warnings.size() == 1);
  CHECK(l.warnings[0] == "plugin 'abi_good' in " + variant("duplicate").string() +
                             " (--plugin) duplicates the one loaded from " + variant("good").string() +
                             " (--plugin), which is kept (--plugin, then --plugin-dir, ATTNHOST_PLUGIN_PATH, the "
                             "user folder, the built-in folder)");
}

// The README's recipe builds a copy of an installed plugin and names it with --plugin: the
// installed copy once won, being found first, and the user timed the wrong library.
TEST_CASE("a plugin named with --plugin is kept over a same-named one of a --plugin-dir") {
  Loaded l = load_files({variant("duplicate")}, {TEST_PLUGIN_DIR "/good"});
  REQUIRE(l.registry.plugins().size() == 1);
  CHECK(l.registry.plugins()[0]->file() == variant("duplicate"));
  REQUIRE(l.warnings.size() == 1);
  CHECK(l.warnings[0].find("(--plugin-dir) duplicates the one loaded from " + variant("duplicate").string() +
                           " (--plugin), which is kept") != std::string::npos);
}

TEST_CASE("a plugin folder writable by others is refused unless allowed, named as a folder or through a file") {
  fs::path dir = temp_dir("insecure");
  fs::copy_file(variant("good"), dir / "libgood.so");
  fs::permissions(dir, fs::perms::others_write, fs::perm_options::add);
  Loaded refused = load_files({}, {dir});
  CHECK(refused.registry.plugins().empty());
  REQUIRE(refused.warnings.size() == 1);
  CHECK(refused.warnings[0] == "plugin folder " + dir.string() +
                                   ": writable by others; skipped (use --allow-insecure-plugins to load it anyway)");
  Loaded allowed = load_files({}, {dir}, true);
  CHECK(allowed.registry.plugins().size() == 1);
  // The same rule for a file named with --plugin (it once loaded from such a folder).
  Loaded file = load_files({dir / "libgood.so"});
  CHECK(file.registry.plugins().empty());
  REQUIRE(file.warnings.size() == 1);
  CHECK(file.warnings[0] == "plugin " + (dir / "libgood.so").string() + ": in folder " + dir.string() +
                                ", which is writable by others (use --allow-insecure-plugins to load it anyway); skipped");
  CHECK(load_files({dir / "libgood.so"}, {}, true).registry.plugins().size() == 1);
  fs::remove_all(dir);
}

TEST_CASE("folders: only .so files are considered, and a missing folder is named") {
  fs::path dir = temp_dir("folder");
  fs::copy_file(variant("good"), dir / "libgood.so");
  std::ofstream(dir / "README.txt") << "plugins live here\n";
  Loaded l = load_files({}, {dir, dir / "nope"});
  CHECK(l.registry.plugins().size() == 1);
  REQUIRE(l.warnings.size() == 1);
  CHECK(l.warnings[0] == "plugin folder " + (dir / "nope").string() + " (--plugin-dir): not a folder; skipped");
  fs::remove_all(dir);
}

TEST_CASE("ATTNHOST_PLUGIN_PATH is searched, colon-separated") {
  fs::path a = temp_dir("env-a"), b = temp_dir("env-b");
  fs::copy_file(variant("good"), a / "libgood.so");
  fs::copy_file(fs::path(TEST_PLUGIN_DIR) / "faulty" / "libfaulty.so", b / "libfaulty.so");
  ::setenv("ATTNHOST_PLUGIN_PATH", (a.string() + ":" + b.string()).c_str(), 1);
  LoaderOptions o;
  o.builtin = false;
  o.user = false;
  std::vector<std::string> warnings;
  PluginRegistry r = PluginRegistry::load(o, warnings);
  ::unsetenv("ATTNHOST_PLUGIN_PATH");
  CHECK(warnings.empty());
  CHECK(r.find("abi_good"));
  CHECK(r.find("faulty"));
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST_CASE("a library stays loaded while an object it made is alive") {
  std::shared_ptr<const Plugin> plugin;
  {
    Loaded l = load_files({variant("good")});
    plugin = l.registry.find("abi_good");
  }  // the registry is gone; the plugin (and its library) is not
  REQUIRE(plugin);
  CHECK(plugin->description().name == "abi_good");
  attnhost_problem p{};
  p.struct_size = sizeof p;
  CHECK(plugin->validate(p) == "this test plugin computes nothing");
}

TEST_CASE("a plugin reads a 1.0 host's problem without the fields appended since") {
  // The C++ helper once copied a whole attnhost_problem from the host's pointer: from a host whose
  // struct ends at `params`, the appended local_rank and local_size were whatever lay beyond it.
  struct {
    attnhost_problem problem;
    unsigned char beyond[64];
  } old_host;
  std::memset(&old_host, 0x7f, sizeof(old_host));
  old_host.problem.struct_size = ATTNHOST_STRUCT_SIZE(attnhost_problem, params);
  old_host.problem.num_seqs = 0;
  old_host.problem.num_params = 0;
  old_host.problem.params = nullptr;
  old_host.problem.rank = 3;
  old_host.problem.world_size = 4;
  const attnhost::Problem p(old_host.problem);
  CHECK(p->local_rank == 3);
  CHECK(p->local_size == 4);
}

// A plugin built through attnhost::plugin_api reports its CMake configuration and whether the
// compiler optimized it (ABI 1.3); one whose table predates the field reports nothing.
TEST_CASE("a plugin says how it was compiled") {
  Loaded l = load_files({fs::path(BUILTIN_PLUGIN_DIR) / "libnaive_attention.so", variant("good")});
  REQUIRE(l.registry.plugins().size() == 2);
#ifdef __OPTIMIZE__
  const std::string optimized = "optimized";
#else
  const std::string optimized = "unoptimized";
#endif
  const std::string config = ATTNHOST_TEST_CONFIG;
  CHECK(l.registry.find("naive_attention")->build() == (config.empty() ? optimized : config + ", " + optimized));
  CHECK(l.registry.find("abi_good")->build() == "not reported");
}

// The host once indexed the plugin's parameter specs with its own sizeof: a plugin built against a
// later minor, whose specs carry one more field, would have been read at the wrong offsets.
TEST_CASE("parameter specs larger than the host's are walked at their own stride") {
  Loaded l = load_files({variant("wide_params")});
  REQUIRE(l.registry.plugins().size() == 1);
  const auto& params = l.registry.plugins()[0]->description().params;
  REQUIRE(params.size() == 2);
  CHECK(params[0].name == "first");
  CHECK(params[0].type == ATTNHOST_PARAM_INT);
  CHECK(params[0].help == "the first");
  CHECK(params[1].name == "second");
  CHECK(params[1].default_value == "\"b\"");
  CHECK(params[1].choices == std::vector<std::string>{"a", "b"});
}

// The same for the other direction: a host of a later minor may pass larger parameter values, and
// plugin.hpp's Problem walks them at their own stride.
TEST_CASE("plugin.hpp reads parameter values larger than its own at their stride") {
  struct WideValue {
    attnhost_param_value value;
    int64_t later_field;
  };
  const WideValue values[2] = {
      {{sizeof(WideValue), "a", ATTNHOST_PARAM_INT, 7, 0.0, nullptr, nullptr, 0}, -1},
      {{sizeof(WideValue), "b", ATTNHOST_PARAM_STRING, 0, 0.0, "bee", nullptr, 0}, -1},
  };
  attnhost_problem raw{};
  raw.struct_size = sizeof raw;
  raw.num_params = 2;
  raw.params = &values[0].value;
  const attnhost::Problem problem(raw);
  CHECK(problem.get_int("a") == 7);
  CHECK(problem.get_string("b") == "bee");
}
