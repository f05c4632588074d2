#include "suite/problem_fields.h"

#include "suite/toml_reader.h"

#include <cstdint>
#include <limits>

namespace attnhost::suite {
namespace detail {
namespace {

// ---- checks shared by the reader (one value, at its location) and validate_problem ----------

std::string check_at_least_one(const std::string& key, int64_t value) {
  if (value >= 1) return "";
  return "'" + key + "' must be at least 1, got " + std::to_string(value);
}

std::string check_fits_int32(const std::string& key, int64_t value) {
  if (value <= std::numeric_limits<int32_t>::max()) return "";
  return "'" + key + "' is too large: " + std::to_string(value);
}

std::string check_head_dim(int64_t value) {
  // Tensor-core tiles and vectorized loads need D in multiples of 8 elements.
  if (value >= 8 && value % 8 == 0) return "";
  return "'head_dim' must be a positive multiple of 8, got " + std::to_string(value);
}

std::string check_window_side(int64_t value) {
  if (value >= -1) return "";
  return "'window' values must be -1 (unbounded) or at least 0, got " + std::to_string(value);
}

std::string check_dtype(const std::string& dtype) { return choice_message("dtype", dtype, dtype_names()); }

std::string check_grad_dtype(const std::string& dtype) {
  return dtype.empty() ? "" : choice_message("grad_dtype", dtype, grad_dtype_names());
}

// ---- reading one value of a field ----------------------------------------------------------

enum class Kind { Count, Int32Count, HeadDim, DType, GradDType, Flag, Window, Scale, Batch, Seqlen };

struct FieldInfo {
  std::string name;
  Kind kind;
};

const std::vector<FieldInfo>& field_infos() {
  static const std::vector<FieldInfo> infos = {
      {"batch", Kind::Batch},        {"tokens", Kind::Count},        {"seqlen", Kind::Seqlen},
      {"seqlen_kv", Kind::Count},    {"heads", Kind::Int32Count},    {"kv_heads", Kind::Int32Count},
      {"head_dim", Kind::HeadDim},   {"dtype", Kind::DType},         {"causal", Kind::Flag},
      {"window", Kind::Window},      {"softmax_scale", Kind::Scale}, {"deterministic", Kind::Flag},
      {"grad_dtype", Kind::GradDType},
  };
  return infos;
}

void fail_if(const toml::node& node, const std::string& message) {
  if (!message.empty()) fail(location_of(node), message);
}

ParamValue read_window(const toml::node& node) {
  const std::vector<int64_t> sides = read_integer_list(node, "window");
  if (sides.size() != 2)
    fail(location_of(node), "'window' must be [left, right], got " + std::to_string(sides.size()) +
                                (sides.size() == 1 ? " value" : " values"));
  const toml::array& array = *node.as_array();
  for (size_t i = 0; i < 2; ++i) fail_if(*array.get(i), check_window_side(sides[i]));
  return sides;
}

ParamValue read_count(const toml::node& node, const std::string& key, bool int32) {
  const int64_t value = read_integer(node, key);
  fail_if(node, check_at_least_one(key, value));
  if (int32) fail_if(node, check_fits_int32(key, value));
  return value;
}

ParamValue read_one_value(const toml::node& node, const FieldInfo& field, bool allow_auto) {
  switch (field.kind) {
    case Kind::Count: return read_count(node, field.name, false);
    case Kind::Int32Count: return read_count(node, field.name, true);
    case Kind::Seqlen: return read_count(node, field.name, false);
    case Kind::HeadDim: {
      const int64_t value = read_integer(node, field.name);
      fail_if(node, check_head_dim(value));
      fail_if(node, check_fits_int32(field.name, value));
      return value;
    }
    case Kind::DType: {
      const std::string value = read_string(node, field.name);
      fail_if(node, check_dtype(value));
      return value;
    }
    case Kind::GradDType: {
      const std::string value = read_string(node, field.name);
      fail_if(node, check_grad_dtype(value));
      return value;
    }
    case Kind::Flag: return read_bool(node, field.name);
    case Kind::Window: return read_window(node);
    case Kind::Scale: {
      const double value = read_number(node, field.name);
      require_positive(node, field.name, value);
      return value;
    }
    case Kind::Batch: {
      if (allow_auto && node.is_string()) {
        const std::string text = node.as_string()->get();
        if (text != "auto")
          fail(location_of(node), "'batch' must be an integer or \"auto\", got \"" + text + "\"");
        return text;
      }
      if (node.is_string())
        fail(location_of(node), "'batch' must be an integer here (\"auto\" belongs in a suite)");
      return read_count(node, field.name, false);
    }
  }
  return {};
}

bool is_sweep(const toml::node& node, Kind kind) {
  if (!node.is_array()) return false;
  if (kind != Kind::Window) return true;
  // A window is itself [left, right]; a sweep of windows is a list of those.
  const toml::array& array = *node.as_array();
  return !array.empty() && array.get(0)->is_array();
}

std::vector<ParamValue> read_range(const toml::node& node, const PresetLibrary& library) {
  const std::string name = node.as_string()->get();
  std::vector<std::string> names;
  for (const auto& [range, lengths] : library.ranges) names.push_back(range);
  require_choice(location_of(node), "sequence range", name, names);
  const std::vector<int64_t>& lengths = library.ranges.at(name);
  return {lengths.begin(), lengths.end()};
}

Setting read_setting(const toml::node& node, const FieldInfo& field, const PresetLibrary& library,
                     bool allow_sweeps) {
  Setting setting;
  setting.where = location_of(node);
  if (allow_sweeps && field.kind == Kind::Seqlen && node.is_string()) {
    setting.values = read_range(node, library);
    setting.sweep = true;
    return setting;
  }
  if (!allow_sweeps || !is_sweep(node, field.kind)) {
    if (!allow_sweeps && node.is_array() && field.kind != Kind::Window)
      fail(location_of(node), "'" + field.name + "' must be a single value in a preset, got array");
    setting.values.push_back(read_one_value(node, field, allow_sweeps));
    return setting;
  }
  const toml::array& array = *node.as_array();
  if (array.empty()) fail(location_of(node), "'" + field.name + "' sweep is empty");
  for (const toml::node& element : array) {
    if (element.is_array() && field.kind != Kind::Window)
      fail(location_of(element, setting.where), "'" + field.name + "' must be " +
                                                    "a value or a list of values, got nested array");
    setting.values.push_back(read_one_value(element, field, true));
  }
  reject_repeated_values(setting, array, "'" + field.name + "'");
  setting.sweep = true;
  return setting;
}

} // namespace

void reject_repeated_values(const Setting& setting, const toml::array& array, const std::string& what) {
  for (size_t i = 1; i < setting.values.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (setting.values[i] == setting.values[j])
        fail(location_of(*array.get(i), setting.where),
             what + " lists " + format_value(setting.values[i]) + " twice");
}

const std::vector<std::string>& dtype_names() {
  static const std::vector<std::string> names = {"bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2"};
  return names;
}

const std::vector<std::string>& grad_dtype_names() {
  static const std::vector<std::string> names = {"fp8_e5m2"};
  return names;
}

const std::vector<std::string>& problem_field_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const FieldInfo& info : field_infos()) out.push_back(info.name);
    return out;
  }();
  return names;
}

Settings read_problem_fields(const toml::table& table, const PresetLibrary& library,
                             bool allow_sweeps, const SourceLocation& fallback) {
  Settings settings;
  for (const FieldInfo& field : field_infos()) {
    const toml::node* node = table.get(field.name);
    if (!node) continue;
    Setting setting = read_setting(*node, field, library, allow_sweeps);
    if (setting.where.line == 0) setting.where = fallback;
    settings.emplace(field.name, std::move(setting));
  }
  return settings;
}

void apply_field(Problem& problem, const std::string& key, const ParamValue& value) {
  const auto integer = [&] { return std::get<int64_t>(value); };
  if (key == "batch") {
    if (std::holds_alternative<int64_t>(value)) problem.batch = integer();
  } else if (key == "seqlen") {
    if (problem.seqlen_kv == problem.seqlen_q) problem.seqlen_kv = integer();
    problem.seqlen_q = integer();
  } else if (key == "seqlen_kv") {
    problem.seqlen_kv = integer();
  } else if (key == "heads") {
    if (problem.heads_kv == problem.heads_q) problem.heads_kv = static_cast<int32_t>(integer());
    problem.heads_q = static_cast<int32_t>(integer());
  } else if (key == "kv_heads") {
    problem.heads_kv = static_cast<int32_t>(integer());
  } else if (key == "head_dim") {
    problem.head_dim = static_cast<int32_t>(integer());
  } else if (key == "dtype") {
    problem.dtype = std::get<std::string>(value);
  } else if (key == "grad_dtype") {
    problem.grad_dtype = std::get<std::string>(value);
  } else if (key == "causal") {
    problem.causal = std::get<bool>(value);
  } else if (key == "window") {
    const auto& sides = std::get<std::vector<int64_t>>(value);
    problem.window_left = sides.at(0);
    problem.window_right = sides.at(1);
  } else if (key == "softmax_scale") {
    problem.softmax_scale = std::get<double>(value);
  } else if (key == "deterministic") {
    problem.deterministic = std::get<bool>(value);
  }
  // "tokens" sizes batch = "auto"; the expander resolves it once seqlen is known.
}

void apply_fields(Problem& problem, const FieldValues& values) {
  for (const std::string& key : problem_field_names()) {
    const auto found = values.find(key);
    if (found != values.end()) apply_field(problem, key, found->second);
  }
}

namespace {

std::optional<ProblemIssue> find_varlen_issue(const Problem& p) {
  const SeqlenSpec& varlen = *p.varlen;
  if (varlen.lengths.empty()) return ProblemIssue{"varlen", "'varlen' has no sequences"};
  int64_t total = 0;
  for (int64_t length : varlen.lengths) {
    if (length < 1)
      return ProblemIssue{"varlen", "'lengths' entries must be at least 1, got " + std::to_string(length)};
    total += length;
  }
  if (p.batch != 1)
    return ProblemIssue{"batch", "packed variable-length input has batch 1, got 'batch' = " +
                                     std::to_string(p.batch)};
  if (p.seqlen_q != total || p.seqlen_kv != total)
    return ProblemIssue{"seqlen", "'seqlen' (" + std::to_string(p.seqlen_q) +
                                      ") must equal the total of the varlen lengths (" +
                                      std::to_string(total) + ")"};
  return std::nullopt;
}

} // namespace

std::optional<ProblemIssue> find_problem_issue(const Problem& p) {
  const auto issue = [](const std::string& field, std::string message) -> std::optional<ProblemIssue> {
    if (message.empty()) return std::nullopt;
    return ProblemIssue{field, std::move(message)};
  };
  if (auto found = issue("batch", check_at_least_one("batch", p.batch))) return found;
  if (auto found = issue("seqlen", check_at_least_one("seqlen", p.seqlen_q))) return found;
  if (auto found = issue("seqlen_kv", check_at_least_one("seqlen_kv", p.seqlen_kv))) return found;
  if (auto found = issue("heads", check_at_least_one("heads", p.heads_q))) return found;
  if (auto found = issue("kv_heads", check_at_least_one("kv_heads", p.heads_kv))) return found;
  if (auto found = issue("head_dim", check_head_dim(p.head_dim))) return found;
  if (p.heads_kv > p.heads_q)
    return ProblemIssue{"kv_heads", "'kv_heads' (" + std::to_string(p.heads_kv) +
                                        ") must not exceed 'heads' (" + std::to_string(p.heads_q) + ")"};
  if (p.heads_q % p.heads_kv != 0)
    return ProblemIssue{"kv_heads", "'heads' (" + std::to_string(p.heads_q) +
                                        ") must be divisible by 'kv_heads' (" +
                                        std::to_string(p.heads_kv) + ")"};
  if (auto found = issue("dtype", check_dtype(p.dtype))) return found;
  if (auto found = issue("grad_dtype", check_grad_dtype(p.grad_dtype))) return found;
  if (!p.grad_dtype.empty() && p.dtype != "fp8_e4m3")
    return ProblemIssue{"grad_dtype", "'grad_dtype' = \"" + p.grad_dtype +
                                          "\" goes with dtype \"fp8_e4m3\" (dO in e5m2 beside e4m3 Q, K and V), not \"" +
                                          p.dtype + "\""};
  if (auto found = issue("window", check_window_side(p.window_left))) return found;
  if (auto found = issue("window", check_window_side(p.window_right))) return found;
  if (p.softmax_scale && !(*p.softmax_scale > 0))
    return ProblemIssue{"softmax_scale",
                        "'softmax_scale' must be positive, got " + format_number(*p.softmax_scale)};
  if (p.varlen) return find_varlen_issue(p);
  return std::nullopt;
}

std::string format_value(const ParamValue& value) {
  struct Formatter {
    std::string operator()(int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const { return format_number(v); }
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(const std::string& v) const { return v; }
    std::string operator()(const std::vector<int64_t>& v) const {
      std::string text;
      for (size_t i = 0; i < v.size(); ++i) text += (i ? "," : "") + std::to_string(v[i]);
      return text;
    }
  };
  return std::visit(Formatter{}, value);
}

} // namespace detail

std::string validate_problem(const Problem& p) {
  const auto issue = detail::find_problem_issue(p);
  return issue ? issue->message : "";
}

} // namespace attnhost::suite
