#include "suite/varlen.h"

#include "suite/toml_reader.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace attnhost::suite::detail {
namespace {

const std::vector<std::string> kVarlenKeys = {"lengths",    "distribution", "total_tokens",
                                              "min_length", "max_length",   "seed",
                                              "median_length", "sigma"};
const std::vector<std::string> kDistributions = {"uniform", "lognormal", "documents"};

// The "documents" mix: most sequences short, a few very long, as in a pretraining corpus.
constexpr double kLongDocumentShare = 0.1;
constexpr int64_t kShortMedianDivisor = 64;  // short documents: median max_length / 64
constexpr int64_t kLongMinDivisor = 8;       // long documents: uniform in [max/8, max/2]
constexpr int64_t kLongMaxDivisor = 2;

// splitmix64: tiny, well mixed, and the same everywhere (std:: distributions are not).
class Generator {
 public:
  explicit Generator(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform01() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  int64_t uniform_int(int64_t low, int64_t high) {                              // [low, high]
    return low + static_cast<int64_t>(uniform01() * static_cast<double>(high - low + 1));
  }
  double normal() {  // Box-Muller
    const double u1 = 1.0 - uniform01();  // (0, 1]: log is finite
    const double u2 = uniform01();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  uint64_t state_;
};

int64_t lognormal_length(Generator& rng, double median, double sigma) {
  return std::llround(median * std::exp(sigma * rng.normal()));
}

int64_t draw_one(Generator& rng, const SeqlenSpec& spec, int64_t max_length) {
  const int64_t min_length = spec.min_length;
  if (spec.distribution == "uniform") return rng.uniform_int(min_length, max_length);
  if (spec.distribution == "lognormal") {
    const double median = spec.median_length > 0
                              ? static_cast<double>(spec.median_length)
                              : std::sqrt(static_cast<double>(min_length) * static_cast<double>(max_length));
    return lognormal_length(rng, median, spec.sigma);
  }
  // documents
  if (rng.uniform01() < kLongDocumentShare) {
    const int64_t low = std::max(min_length, max_length / kLongMinDivisor);
    const int64_t high = std::max(low, max_length / kLongMaxDivisor);
    return rng.uniform_int(low, high);
  }
  const double median = static_cast<double>(std::max(min_length, max_length / kShortMedianDivisor));
  return lognormal_length(rng, median, 1.0);
}

void read_explicit_lengths(const toml::table& table, SeqlenSpec& spec) {
  const toml::node& node = *table.get("lengths");
  spec.lengths = read_integer_list(node, "lengths");
  if (spec.lengths.empty()) fail(location_of(node), "'lengths' must not be empty");
  for (size_t i = 0; i < spec.lengths.size(); ++i)
    if (spec.lengths[i] < 1)
      fail(location_of(*node.as_array()->get(i)),
           "'lengths' entries must be at least 1, got " + std::to_string(spec.lengths[i]));
  for (const char* only_for_distributions :
       {"total_tokens", "min_length", "max_length", "seed", "median_length", "sigma"})
    if (const toml::node* extra = table.get(only_for_distributions))
      fail(location_of(*extra), "'" + std::string(only_for_distributions) +
                                    "' applies to a distribution, not to explicit 'lengths'");
}

void read_distribution(const toml::table& table, const SourceLocation& where, SeqlenSpec& spec) {
  const toml::node& kind = *table.get("distribution");
  spec.distribution = read_string(kind, "distribution");
  require_choice(location_of(kind), "length distribution", spec.distribution, kDistributions);
  const toml::node* total = table.get("total_tokens");
  if (!total) fail(where, "'distribution' needs 'total_tokens' (the token budget to fill)");
  spec.total_tokens = read_integer(*total, "total_tokens");
  require_at_least(*total, "total_tokens", spec.total_tokens, 1);
  if (const toml::node* node = table.get("min_length")) {
    spec.min_length = read_integer(*node, "min_length");
    require_at_least(*node, "min_length", spec.min_length, 1);
  }
  if (const toml::node* node = table.get("max_length")) {
    spec.max_length = read_integer(*node, "max_length");
    require_at_least(*node, "max_length", spec.max_length, 1);
    if (spec.max_length < spec.min_length)
      fail(location_of(*node), "'max_length' (" + std::to_string(spec.max_length) +
                                   ") must not be less than 'min_length' (" +
                                   std::to_string(spec.min_length) + ")");
  }
  if (const toml::node* node = table.get("seed")) {
    const int64_t seed = read_integer(*node, "seed");
    require_at_least(*node, "seed", seed, 0);
    spec.seed = static_cast<uint64_t>(seed);
  }
  if (const toml::node* node = table.get("median_length")) {
    spec.median_length = read_integer(*node, "median_length");
    require_at_least(*node, "median_length", spec.median_length, 1);
  }
  if (const toml::node* node = table.get("sigma")) {
    spec.sigma = read_number(*node, "sigma");
    require_positive(*node, "sigma", spec.sigma);
  }
  for (const char* lognormal_only : {"median_length", "sigma"})
    if (spec.distribution != "lognormal" && table.get(lognormal_only))
      fail(location_of(*table.get(lognormal_only)),
           "'" + std::string(lognormal_only) + "' applies to distribution = \"lognormal\" only");
  spec.lengths = draw_lengths(spec);
}

} // namespace

std::vector<int64_t> draw_lengths(const SeqlenSpec& spec) {
  const int64_t max_length =
      std::min(spec.total_tokens, spec.max_length > 0 ? spec.max_length : spec.total_tokens);
  const int64_t min_length = std::min(spec.min_length, max_length);
  Generator rng(spec.seed);
  std::vector<int64_t> lengths;
  int64_t remaining = spec.total_tokens;
  while (remaining > 0) {
    const int64_t length = std::clamp(draw_one(rng, spec, max_length), min_length, max_length);
    lengths.push_back(std::min(length, remaining));
    remaining -= lengths.back();
  }
  // A remainder shorter than min_length joins the sequence before it when that stays in bounds.
  if (lengths.size() > 1 && lengths.back() < min_length &&
      lengths[lengths.size() - 2] + lengths.back() <= max_length) {
    lengths[lengths.size() - 2] += lengths.back();
    lengths.pop_back();
  }
  return lengths;
}

void apply_varlen(Problem& problem, const SeqlenSpec& spec) {
  int64_t total = 0;
  for (int64_t length : spec.lengths) total += length;
  problem.varlen = spec;
  problem.batch = 1;
  problem.seqlen_q = problem.seqlen_kv = total;
}

SeqlenSpec read_varlen(const toml::node& node) {
  const toml::table& table = read_table(node, "varlen");
  const SourceLocation where = location_of(node);
  reject_unknown_keys(table, kVarlenKeys, "in [varlen]", where);
  const bool has_lengths = table.contains("lengths");
  const bool has_distribution = table.contains("distribution");
  if (has_lengths && has_distribution)
    fail(location_of(*table.get("distribution"), where),
         "'varlen' takes 'lengths' or 'distribution', not both");
  if (!has_lengths && !has_distribution)
    fail(where, "'varlen' needs 'lengths' (an explicit list) or 'distribution' "
                "(uniform, lognormal or documents)");
  SeqlenSpec spec;
  if (has_lengths) read_explicit_lengths(table, spec);
  else read_distribution(table, where, spec);
  return spec;
}

} // namespace attnhost::suite::detail
