#include "plugins/loader.h"

#include "common/errors.h"

#include <boost/dll/shared_library.hpp>
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

namespace attnhost {
namespace fs = std::filesystem;

namespace {

struct Rejected : std::runtime_error {
  using std::runtime_error::runtime_error;
};

bool has_elf_magic(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && magic[0] == 0x7f && magic[1] == 'E' && magic[2] == 'L' && magic[3] == 'F';
}

bool looks_like_plugin(const fs::path& file) {
  std::string name = file.filename().string();
  return name.size() > 3 && (name.ends_with(".so") || name.find(".so.") != std::string::npos);
}

// A folder or file anyone may write to lets anyone run code in the host: refuse it.
std::string insecure_reason(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return "";
  if (st.st_mode & S_IWOTH) return "writable by others";
  return "";
}

// One rule for a plugin file, wherever it was named (--plugin or a folder): neither it nor its
// folder may be writable by others.
std::string insecure_file_reason(const fs::path& file) {
  if (std::string why = insecure_reason(file); !why.empty()) return why;
  std::error_code ec;
  const fs::path folder = fs::absolute(file, ec).parent_path();
  if (!insecure_reason(folder).empty()) return "in folder " + folder.string() + ", which is writable by others";
  return "";
}

std::string version_string(uint32_t major, uint32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

}  // namespace

std::filesystem::path executable_dir() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::current_path() : self.parent_path();
}

std::filesystem::path builtin_plugin_dir() {
  return (executable_dir() / ".." / "lib" / "attnhost" / "plugins").lexically_normal();
}

std::filesystem::path user_plugin_dir() {
  const char* home = std::getenv("HOME");
  return home && *home ? fs::path(home) / ".local" / "lib" / "attnhost" / "plugins" : fs::path();
}

std::shared_ptr<const Plugin> load_plugin_file(const fs::path& file) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) throw Rejected("not a regular file");
  if (!has_elf_magic(file)) throw Rejected("not a shared library (no ELF header)");

  auto library = std::make_shared<boost::dll::shared_library>();
  // rtld_now: a missing symbol fails here, not in the middle of a run; rtld_local: two plugins'
  // symbols never resolve against each other.
  library->load(file, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local, ec);
  if (ec) {
    const char* why = ::dlerror();
    std::string reason = why ? why : ec.message();
    // dlerror repeats the path; keep the part after it.
    if (auto pos = reason.find(file.string() + ": "); pos != std::string::npos)
      reason = reason.substr(pos + file.string().size() + 2);
    throw Rejected("load failed: " + reason);
  }
  if (!library->has(ATTNHOST_PLUGIN_ENTRY_NAME))
    throw Rejected(std::string("no entry symbol '") + ATTNHOST_PLUGIN_ENTRY_NAME + "' (not an attnhost plugin)");

  auto& entry = library->get<const attnhost_plugin_api*(const attnhost_version*)>(ATTNHOST_PLUGIN_ENTRY_NAME);
  attnhost_version host{ATTNHOST_STRUCT_SIZE(attnhost_version, minor), ATTNHOST_ABI_MAJOR, ATTNHOST_ABI_MINOR};
  const attnhost_plugin_api* api = nullptr;
  try {
    api = entry(&host);
  } catch (...) {
    throw Rejected("entry point threw an exception");
  }
  if (!api)
    throw Rejected("refused the host's ABI " + version_string(ATTNHOST_ABI_MAJOR, ATTNHOST_ABI_MINOR));
  if (api->abi_major != ATTNHOST_ABI_MAJOR)
    throw Rejected("built for plugin ABI " + version_string(api->abi_major, api->abi_minor) +
                   "; this host speaks ABI " + version_string(ATTNHOST_ABI_MAJOR, ATTNHOST_ABI_MINOR));
  if (api->struct_size < ATTNHOST_STRUCT_SIZE(attnhost_plugin_api, error_destroy))
    throw Rejected("function table smaller than ABI " + version_string(api->abi_major, api->abi_minor) + " requires");
  for (const void* fn : {(const void*)api->describe, (const void*)api->validate, (const void*)api->create,
                         (const void*)api->layout, (const void*)api->forward, (const void*)api->count_pairs,
                         (const void*)api->enumerate_keys, (const void*)api->enumerate_queries,
                         (const void*)api->destroy, (const void*)api->error_message,
                         (const void*)api->error_code, (const void*)api->error_destroy})
    if (!fn) throw Rejected("function table has a required entry set to NULL");

  const attnhost_plugin_info* info = nullptr;
  attnhost_error* error = nullptr;
  try {
    error = api->describe(&info);
  } catch (...) {
    throw Rejected("describe threw an exception across the ABI");
  }
  if (error) {
    std::string message = api->error_message(error) ? api->error_message(error) : "";
    api->error_destroy(error);
    throw Rejected("describe failed: " + message);
  }
  if (!info || !info->name || !*info->name) throw Rejected("describe returned no name");
  PluginDescription description = read_description(*info, api->backward != nullptr);
  return std::make_shared<const Plugin>(file, std::move(library), api, std::move(description));
}

PluginRegistry PluginRegistry::load(const LoaderOptions& options, std::vector<std::string>& warnings) {
  PluginRegistry registry;
  std::vector<PluginSource> dirs;
  if (options.builtin) dirs.push_back({builtin_plugin_dir(), "built-in"});
  if (options.user && !user_plugin_dir().empty()) dirs.push_back({user_plugin_dir(), "user"});
  if (options.environment) {
    if (const char* env = std::getenv("ATTNHOST_PLUGIN_PATH")) {
      std::stringstream ss(env);
      std::string item;
      while (std::getline(ss, item, ':'))
        if (!item.empty()) dirs.push_back({item, "ATTNHOST_PLUGIN_PATH"});
    }
  }
  for (const fs::path& d : options.dirs) dirs.push_back({d, "--plugin-dir"});

  std::vector<PluginSource> files;
  std::set<fs::path> seen;
  auto add_file = [&](const fs::path& f, const std::string& origin) {
    std::error_code ec;
    fs::path canonical = fs::weakly_canonical(f, ec);
    if (seen.insert(ec ? f : canonical).second) files.push_back({f, origin});
  };
  for (const PluginSource& dir : dirs) {
    registry.searched_.push_back(dir);
    std::error_code ec;
    if (!fs::is_directory(dir.path, ec)) {
      if ((dir.origin != "built-in" && dir.origin != "user") || fs::exists(dir.path, ec))
        warnings.push_back("plugin folder " + dir.path.string() + " (" + dir.origin + "): not a folder; skipped");
      continue;
    }
    if (std::string why = insecure_reason(dir.path); !why.empty() && !options.allow_insecure) {
      warnings.push_back("plugin folder " + dir.path.string() + ": " + why +
                         "; skipped (use --allow-insecure-plugins to load it anyway)");
      continue;
    }
    std::vector<fs::path> entries;
    for (const auto& e : fs::directory_iterator(dir.path, ec))
      if (looks_like_plugin(e.path())) entries.push_back(e.path());
    std::sort(entries.begin(), entries.end());
    for (const fs::path& f : entries) add_file(f, dir.origin);
  }
  for (const fs::path& f : options.files) {
    registry.searched_.push_back({f, "--plugin"});
    add_file(f, "--plugin");
  }
  // Of two plugins with one name the one the user named most specifically is kept: a plugin just
  // built, named with --plugin, beats an installed copy of it.
  const auto precedence = [](const std::string& origin) {
    for (int i = 0; const char* o : {"--plugin", "--plugin-dir", "ATTNHOST_PLUGIN_PATH", "user"}) {
      if (origin == o) return i;
      ++i;
    }
    return 4;  // built-in
  };
  std::stable_sort(files.begin(), files.end(), [&](const PluginSource& a, const PluginSource& b) {
    return precedence(a.origin) < precedence(b.origin);
  });

  const auto origin_of = [&](const fs::path& file) {
    for (const PluginSource& f : files)
      if (f.path == file) return f.origin;
    return std::string("?");
  };
  for (const PluginSource& f : files) {
    try {
      if (std::string why = insecure_file_reason(f.path); !why.empty() && !options.allow_insecure)
        throw Rejected(why + " (use --allow-insecure-plugins to load it anyway)");
      std::shared_ptr<const Plugin> plugin = load_plugin_file(f.path);
      if (auto kept = registry.find(plugin->name())) {
        warnings.push_back("plugin '" + plugin->name() + "' in " + f.path.string() + " (" + f.origin +
                           ") duplicates the one loaded from " + kept->file().string() + " (" +
                           origin_of(kept->file()) + "), which is kept (--plugin, then --plugin-dir, "
                           "ATTNHOST_PLUGIN_PATH, the user folder, the built-in folder)");
        continue;
      }
      registry.plugins_.push_back(std::move(plugin));
    } catch (const std::exception& e) {
      warnings.push_back("plugin " + f.path.string() + ": " + e.what() + "; skipped");
    }
  }
  return registry;
}

std::shared_ptr<const Plugin> PluginRegistry::find(const std::string& name) const {
  for (const auto& p : plugins_)
    if (p->name() == name) return p;
  return nullptr;
}

std::vector<std::string> PluginRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& p : plugins_) out.push_back(p->name());
  return out;
}

}  // namespace attnhost
