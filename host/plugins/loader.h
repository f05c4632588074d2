// Finds and loads plugins (Boost.DLL). Every rejection is one warning line naming the file and
// the reason; the plugin is skipped and loading goes on.
#pragma once

#include "plugins/loaded_plugin.h"

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace attnhost {

struct LoaderOptions {
  bool builtin = true;                       // <exe>/../lib/attnhost/plugins
  bool user = true;                          // ~/.local/lib/attnhost/plugins, when it exists
  bool environment = true;                   // ATTNHOST_PLUGIN_PATH, colon-separated
  std::vector<std::filesystem::path> dirs;   // --plugin-dir
  std::vector<std::filesystem::path> files;  // --plugin
  bool allow_insecure = false;               // --allow-insecure-plugins
};

struct PluginSource {
  std::filesystem::path path;
  std::string origin; // "built-in", "user", "ATTNHOST_PLUGIN_PATH", "--plugin-dir", "--plugin"
};

class PluginRegistry {
 public:
  // Loads everything the options name; `warnings` receives one line per rejected file or folder.
  static PluginRegistry load(const LoaderOptions& options, std::vector<std::string>& warnings);

  const std::vector<std::shared_ptr<const Plugin>>& plugins() const { return plugins_; }
  std::shared_ptr<const Plugin> find(const std::string& name) const;
  std::vector<std::string> names() const;
  const std::vector<PluginSource>& searched() const { return searched_; }

 private:
  std::vector<std::shared_ptr<const Plugin>> plugins_;
  std::vector<PluginSource> searched_;
};

// Loads one file; throws std::runtime_error with the one-line reason on rejection.
std::shared_ptr<const Plugin> load_plugin_file(const std::filesystem::path& file);

// The folder of built-in plugins beside the running executable.
std::filesystem::path builtin_plugin_dir();
// The user's own plugin folder, ~/.local/lib/attnhost/plugins ("" without HOME).
std::filesystem::path user_plugin_dir();
// The running executable's folder.
std::filesystem::path executable_dir();

}  // namespace attnhost
