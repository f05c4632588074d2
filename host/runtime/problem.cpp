#include "runtime/problem.h"

#include "common/errors.h"

#include <toml++/toml.h>

#include <cmath>

namespace attnhost {

int32_t dtype_from_name(const std::string& name) {
  if (name == "bf16") return ATTNHOST_DTYPE_BF16;
  if (name == "fp16") return ATTNHOST_DTYPE_FP16;
  if (name == "fp32") return ATTNHOST_DTYPE_FP32;
  if (name == "fp8_e4m3") return ATTNHOST_DTYPE_FP8_E4M3;
  if (name == "fp8_e5m2") return ATTNHOST_DTYPE_FP8_E5M2;
  return 0;
}

namespace {

// A schema default is written as a TOML value; parse it as the right-hand side of a key.
suite::ParamValue parse_default(const ParamSpec& spec, const std::string& plugin) {
  auto bad = [&](const std::string& why) {
    return UsageError("plugin '" + plugin + "': default of parameter '" + spec.name + "' (" + spec.default_value +
                      ") " + why);
  };
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + spec.default_value);
  } catch (const toml::parse_error&) {
    throw bad("is not a TOML value");
  }
  const toml::node* v = parsed.get("v");
  switch (spec.type) {
    case ATTNHOST_PARAM_INT:
      if (auto i = v->value<int64_t>()) return *i;
      break;
    case ATTNHOST_PARAM_FLOAT:
      if (auto f = v->value<double>()) return *f;
      break;
    case ATTNHOST_PARAM_BOOL:
      if (auto b = v->value<bool>()) return *b;
      break;
    case ATTNHOST_PARAM_STRING:
    case ATTNHOST_PARAM_PATH:  // a default path is taken as written (a plugin's defaults are "" or absolute)
      if (auto s = v->value<std::string>()) return *s;
      break;
    case ATTNHOST_PARAM_INT_LIST:
      if (const toml::array* a = v->as_array()) {
        std::vector<int64_t> out;
        for (const toml::node& e : *a) {
          auto i = e.value<int64_t>();
          if (!i) throw bad("is not a list of integers");
          out.push_back(*i);
        }
        return out;
      }
      break;
  }
  throw bad(std::string("does not have the declared type ") + param_type_name(spec.type));
}

}  // namespace

ProblemBinding::ProblemBinding(const suite::Case& c, const PluginDescription& plugin, int32_t device_type) {
  const suite::Problem& p = c.problem;
  problem_.struct_size = ATTNHOST_STRUCT_SIZE(attnhost_problem, grad_dtype);
  problem_.batch = p.batch;
  problem_.seqlen_q = p.seqlen_q;
  problem_.seqlen_kv = p.seqlen_kv > 0 ? p.seqlen_kv : p.seqlen_q;
  problem_.heads_q = p.heads_q;
  problem_.heads_kv = p.heads_kv > 0 ? p.heads_kv : p.heads_q;
  problem_.head_dim = p.head_dim;
  problem_.dtype = dtype_from_name(p.dtype);
  problem_.grad_dtype = p.grad_dtype.empty() ? 0 : dtype_from_name(p.grad_dtype);
  problem_.causal = p.causal ? 1 : 0;
  problem_.deterministic = p.deterministic ? 1 : 0;
  problem_.window_left = p.window_left;
  problem_.window_right = p.window_right;
  problem_.softmax_scale = p.softmax_scale ? *p.softmax_scale : 1.0 / std::sqrt(static_cast<double>(p.head_dim));
  if (p.varlen && !p.varlen->lengths.empty()) {
    cu_q_.push_back(0);
    for (int64_t len : p.varlen->lengths) cu_q_.push_back(cu_q_.back() + len);
    cu_kv_ = cu_q_;
    problem_.batch = 1;
    problem_.seqlen_q = problem_.seqlen_kv = cu_q_.back();
    problem_.num_seqs = static_cast<int32_t>(p.varlen->lengths.size());
    problem_.cu_seqlens_q = cu_q_.data();
    problem_.cu_seqlens_kv = cu_kv_.data();
  }
  problem_.device_type = device_type;

  // Every schema entry is present: the written value, else the schema's default.
  for (const ParamSpec& spec : plugin.params) {
    auto it = c.params.find(spec.name);
    suite::ParamValue value = it != c.params.end() ? it->second : parse_default(spec, plugin.name);
    names_.push_back(spec.name);
    attnhost_param_value v{};
    v.struct_size = ATTNHOST_STRUCT_SIZE(attnhost_param_value, list_length);
    v.type = spec.type;
    if (auto* i = std::get_if<int64_t>(&value)) {
      v.int_value = *i;
      v.float_value = static_cast<double>(*i);  // an integer written where a float is expected
    } else if (auto* f = std::get_if<double>(&value)) {
      v.float_value = *f;
    } else if (auto* b = std::get_if<bool>(&value)) {
      v.int_value = *b ? 1 : 0;
    } else if (auto* s = std::get_if<std::string>(&value)) {
      strings_.push_back(*s);
    } else if (auto* l = std::get_if<std::vector<int64_t>>(&value)) {
      lists_.push_back(*l);
      v.list_length = static_cast<int64_t>(l->size());
    }
    values_.push_back(v);
  }
  // Pointers last: the vectors above no longer grow.
  size_t s = 0, l = 0;
  for (size_t i = 0; i < values_.size(); ++i) {
    values_[i].name = names_[i].c_str();
    if (values_[i].type == ATTNHOST_PARAM_STRING || values_[i].type == ATTNHOST_PARAM_PATH)
      values_[i].string_value = strings_[s++].c_str();
    if (values_[i].type == ATTNHOST_PARAM_INT_LIST) values_[i].list_value = lists_[l++].data();
  }
  problem_.num_params = static_cast<int32_t>(values_.size());
  problem_.params = values_.data();
}

attnhost_problem ProblemBinding::at(int rank, int world_size, int local_rank, int local_size) const {
  attnhost_problem p = problem_;
  p.rank = rank;
  p.world_size = world_size;
  p.local_rank = local_size > 0 ? local_rank : rank;
  p.local_size = local_size > 0 ? local_size : world_size;
  return p;
}

}  // namespace attnhost
