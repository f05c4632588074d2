#include "plugins/loaded_plugin.h"

#include "common/errors.h"

#include <boost/dll/shared_library.hpp>

#include <sstream>

namespace attnhost {
namespace {

std::string text(const char* s) { return s ? s : ""; }

std::vector<std::string> split_choices(const char* s) {
  std::vector<std::string> out;
  if (!s) return out;
  std::string item;
  for (const char* p = s;; ++p) {
    if (*p == '|' || *p == '\0') {
      if (!item.empty()) out.push_back(item);
      item.clear();
      if (*p == '\0') break;
    } else {
      item += *p;
    }
  }
  return out;
}

std::vector<attnhost_span> copy_spans(const attnhost_span_list& list) {
  if (list.num_spans < 0 || (list.num_spans > 0 && !list.spans))
    throw PluginError(ATTNHOST_ERR_INTERNAL, "plugin returned a malformed span list");
  return {list.spans, list.spans + list.num_spans};
}

}  // namespace

Plugin::Plugin(std::filesystem::path file, std::shared_ptr<boost::dll::shared_library> library,
               const attnhost_plugin_api* api, PluginDescription description)
    : file_(std::move(file)), library_(std::move(library)), api_(api), description_(std::move(description)) {}

void Plugin::check(attnhost_error* error, const char* what) const {
  if (!error) return;
  std::string message = text(api_->error_message(error));
  int code = api_->error_code(error);
  api_->error_destroy(error);
  if (message.empty()) message = std::string(what) + " failed";
  throw PluginError(code, message);
}

std::string Plugin::validate(const attnhost_problem& problem) const {
  try {
    check(api_->validate(&problem), "validate");
    return "";
  } catch (const PluginError& e) {
    return e.what();
  }
}

std::unique_ptr<Instance> Plugin::create(const attnhost_problem& problem,
                                         const attnhost_host_api* host) const {
  attnhost_instance* raw = nullptr;
  check(api_->create(&problem, host, &raw), "create");
  if (!raw) throw PluginError(ATTNHOST_ERR_INTERNAL, "create returned no instance");
  return std::make_unique<Instance>(shared_from_this(), raw);
}

Instance::~Instance() {
  if (raw_) plugin_->api().destroy(raw_);
}

Instance::Layout Instance::layout(int32_t kind) {
  attnhost_layout out{};
  plugin_->check(plugin_->api().layout(raw_, kind, &out), "layout");
  if (out.local_tokens < 0 || out.num_ranges < 0 || (out.num_ranges > 0 && !out.ranges))
    throw PluginError(ATTNHOST_ERR_INTERNAL, "plugin returned a malformed layout");
  Layout layout;
  layout.local_tokens = out.local_tokens;
  layout.ranges.assign(out.ranges, out.ranges + out.num_ranges);
  for (const attnhost_token_range& r : layout.ranges)
    if (r.length < 0 || r.local_begin < 0 || r.local_begin + r.length > out.local_tokens || r.global_begin < 0)
      throw PluginError(ATTNHOST_ERR_INTERNAL, "plugin returned a layout range outside its local tensor");
  return layout;
}

void Instance::forward(const attnhost_forward_args& args) {
  plugin_->check(plugin_->api().forward(raw_, &args), "forward");
}

void Instance::backward(const attnhost_backward_args& args) {
  if (!plugin_->api().backward)
    throw PluginError(ATTNHOST_ERR_UNSUPPORTED, "plugin has no backward pass");
  plugin_->check(plugin_->api().backward(raw_, &args), "backward");
}

void Instance::count_pairs(int64_t* rank_pairs, int64_t* total_pairs) {
  plugin_->check(plugin_->api().count_pairs(raw_, rank_pairs, total_pairs), "count_pairs");
}

std::vector<attnhost_span> Instance::enumerate_keys(int64_t batch, int32_t head, int64_t query) {
  attnhost_span_list list{};
  plugin_->check(plugin_->api().enumerate_keys(raw_, batch, head, query, &list), "enumerate_keys");
  return copy_spans(list);
}

std::vector<attnhost_span> Instance::enumerate_queries(int64_t batch, int32_t kv_head, int64_t key) {
  attnhost_span_list list{};
  plugin_->check(plugin_->api().enumerate_queries(raw_, batch, kv_head, key, &list), "enumerate_queries");
  return copy_spans(list);
}

std::string Plugin::build() const {
  if (ATTNHOST_HAS_FIELD(api_, attnhost_plugin_api, build) && api_->build) return api_->build;
  return "not reported";
}

PluginDescription read_description(const attnhost_plugin_info& info, bool has_backward) {
  PluginDescription d;
  d.name = text(info.name);
  if (ATTNHOST_HAS_FIELD(&info, attnhost_plugin_info, version)) d.version = text(info.version);
  if (ATTNHOST_HAS_FIELD(&info, attnhost_plugin_info, description)) d.description = text(info.description);
  if (ATTNHOST_HAS_FIELD(&info, attnhost_plugin_info, capabilities)) {
    const attnhost_capabilities& c = info.capabilities;
    d.devices = c.devices;
    d.dtypes = c.dtypes;
    d.features = c.features;
    if (ATTNHOST_HAS_FIELD(&c, attnhost_capabilities, max_world_size)) {
      d.min_world_size = c.min_world_size < 1 ? 1 : c.min_world_size;
      d.max_world_size = c.max_world_size;
    }
    if (ATTNHOST_HAS_FIELD(&c, attnhost_capabilities, head_dims) && c.num_head_dims > 0 && c.head_dims)
      d.head_dims.assign(c.head_dims, c.head_dims + c.num_head_dims);
  }
  if (ATTNHOST_HAS_FIELD(&info, attnhost_plugin_info, params) && info.num_params > 0 && info.params) {
    for (int32_t i = 0; i < info.num_params; ++i) {
      const attnhost_param_spec& s = *ATTNHOST_ELEMENT(attnhost_param_spec, info.params, i);
      ParamSpec p;
      p.name = text(s.name);
      p.type = s.type;
      if (ATTNHOST_HAS_FIELD(&s, attnhost_param_spec, default_value)) p.default_value = text(s.default_value);
      if (ATTNHOST_HAS_FIELD(&s, attnhost_param_spec, help)) p.help = text(s.help);
      if (ATTNHOST_HAS_FIELD(&s, attnhost_param_spec, choices)) p.choices = split_choices(s.choices);
      d.params.push_back(std::move(p));
    }
  }
  d.has_backward = has_backward;
  return d;
}

namespace {
std::string join_bits(uint32_t bits, const std::vector<std::pair<uint32_t, const char*>>& names) {
  std::ostringstream out;
  bool first = true;
  for (const auto& [bit, name] : names)
    if (bits & bit) {
      out << (first ? "" : ",") << name;
      first = false;
    }
  return first ? "-" : out.str();
}
}  // namespace

std::string features_string(uint32_t f) {
  return join_bits(f, {{ATTNHOST_FEATURE_CAUSAL, "causal"},
                       {ATTNHOST_FEATURE_NONCAUSAL, "noncausal"},
                       {ATTNHOST_FEATURE_WINDOW, "window"},
                       {ATTNHOST_FEATURE_GQA, "gqa"},
                       {ATTNHOST_FEATURE_VARLEN, "varlen"},
                       {ATTNHOST_FEATURE_BACKWARD, "backward"},
                       {ATTNHOST_FEATURE_DETERMINISTIC, "deterministic"},
                       {ATTNHOST_FEATURE_CROSS, "cross"},
                       {ATTNHOST_FEATURE_FP8_HYBRID, "fp8_hybrid"}});
}

std::string dtypes_string(uint32_t d) {
  return join_bits(d, {{ATTNHOST_CAP_DTYPE(ATTNHOST_DTYPE_BF16), "bf16"},
                       {ATTNHOST_CAP_DTYPE(ATTNHOST_DTYPE_FP16), "fp16"},
                       {ATTNHOST_CAP_DTYPE(ATTNHOST_DTYPE_FP32), "fp32"},
                       {ATTNHOST_CAP_DTYPE(ATTNHOST_DTYPE_FP8_E4M3), "fp8_e4m3"},
                       {ATTNHOST_CAP_DTYPE(ATTNHOST_DTYPE_FP8_E5M2), "fp8_e5m2"}});
}

std::string devices_string(uint32_t d) {
  return join_bits(d, {{ATTNHOST_CAP_DEVICE_CPU, "cpu"}, {ATTNHOST_CAP_DEVICE_CUDA, "cuda"}});
}

const char* param_type_name(int32_t type) {
  switch (type) {
    case ATTNHOST_PARAM_INT: return "int";
    case ATTNHOST_PARAM_FLOAT: return "float";
    case ATTNHOST_PARAM_BOOL: return "bool";
    case ATTNHOST_PARAM_STRING: return "string";
    case ATTNHOST_PARAM_INT_LIST: return "int list";
    case ATTNHOST_PARAM_PATH: return "path";
    default: return "unknown";
  }
}

}  // namespace attnhost
