// The host's view of one loaded plugin: a C++ face over the C table of <attnhost/plugin.h>.
// Every call turns a returned attnhost_error into a PluginError (and frees the error object
// with the plugin's own error_destroy); nothing from a plugin is trusted beyond struct_size.
#pragma once

#include <attnhost/plugin.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace boost::dll { class shared_library; }

namespace attnhost {

struct ParamSpec {
  std::string name;
  int32_t type = 0;
  std::string default_value;
  std::string help;
  std::vector<std::string> choices;
};

struct PluginDescription {
  std::string name, version, description;
  uint32_t devices = 0, dtypes = 0, features = 0;
  int32_t min_world_size = 1, max_world_size = 0;
  std::vector<int32_t> head_dims; // empty: any multiple of 8
  std::vector<ParamSpec> params;
  bool has_backward = false;
};

class Instance;

class Plugin : public std::enable_shared_from_this<Plugin> {
 public:
  Plugin(std::filesystem::path file, std::shared_ptr<boost::dll::shared_library> library,
         const attnhost_plugin_api* api, PluginDescription description);

  const std::filesystem::path& file() const { return file_; }
  const PluginDescription& description() const { return description_; }
  const std::string& name() const { return description_.name; }
  const attnhost_plugin_api& api() const { return *api_; }
  // "Release, optimized", "unoptimized", ... (ABI 1.3); "not reported" by older plugins.
  std::string build() const;

  // "" when the plugin accepts the problem, else its message.
  std::string validate(const attnhost_problem& problem) const;
  std::unique_ptr<Instance> create(const attnhost_problem& problem, const attnhost_host_api* host) const;

  // Throws PluginError carrying the plugin's message when `error` is not NULL.
  void check(attnhost_error* error, const char* what) const;

 private:
  std::filesystem::path file_;
  std::shared_ptr<boost::dll::shared_library> library_;
  const attnhost_plugin_api* api_;
  PluginDescription description_;
};

// One rank's instance; keeps its plugin (and so the library) alive until destroyed.
class Instance {
 public:
  Instance(std::shared_ptr<const Plugin> plugin, attnhost_instance* raw) : plugin_(std::move(plugin)), raw_(raw) {}
  ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  struct Layout {
    int64_t local_tokens = 0;
    std::vector<attnhost_token_range> ranges;
  };
  Layout layout(int32_t kind);
  void forward(const attnhost_forward_args& args);
  void backward(const attnhost_backward_args& args);
  bool has_backward() const { return plugin_->api().backward != nullptr; }
  void count_pairs(int64_t* rank_pairs, int64_t* total_pairs);
  std::vector<attnhost_span> enumerate_keys(int64_t batch, int32_t head, int64_t query);
  std::vector<attnhost_span> enumerate_queries(int64_t batch, int32_t kv_head, int64_t key);
  const Plugin& plugin() const { return *plugin_; }

 private:
  std::shared_ptr<const Plugin> plugin_;
  attnhost_instance* raw_;
};

// Reads a plugin's self-description, bounded by the struct sizes it reports.
PluginDescription read_description(const attnhost_plugin_info& info, bool has_backward);

std::string features_string(uint32_t features);
std::string dtypes_string(uint32_t dtypes);
std::string devices_string(uint32_t devices);
const char* param_type_name(int32_t type);

}  // namespace attnhost
