// The float64 reference of docs/VARIANTS.md ("Reference semantics for the host's check"), computed
// from the plugin's key enumeration and the deterministic data, one row or column at a time:
//   s_k = scale * q.k,  LSE = log sum_k m_k exp(s_k),  O = sum_k m_k exp(s_k - LSE) v_k
//   dQ = scale * sum_k m_k p_k (dO.v_k - D) k_k,  D = dO.O
//   dV_k = sum_q m p dO_q,  dK_k = scale * sum_q m p (dO_q.v_k - D_q) q
#pragma once

#include "plugins/loaded_plugin.h"
#include "runtime/data.h"

#include <attnhost/plugin.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace attnhost {

struct RowReference {
  double lse = 0;            // -inf when the row attends no key
  std::vector<double> o, dq; // head_dim each
  double delta = 0;          // dO . O
  int64_t keys = 0;          // attended keys, with multiplicity
};

struct ColumnReference {
  std::vector<double> dk, dv;
};

// Row statistics (LSE and delta = dO.O) of any row: from this reference, or from the plugin
// when only sampled rows were recomputed (see check.cpp).
using RowStatsFn = std::function<std::pair<double, double>(int64_t b, int32_t h, int64_t q)>;

class Reference {
 public:
  Reference(const attnhost_problem& problem, const data::Params& data, Instance& enumerator);

  RowReference row(int64_t b, int32_t h, int64_t q, bool with_dq);
  ColumnReference column(int64_t b, int32_t kv_head, int64_t k, const RowStatsFn& stats);

  // Inputs as the plugin sees them (rounded to dtype), widened to double.
  void load_q(int64_t b, int32_t h, int64_t t, double* out) const { load(data::kQ, b, h, t, heads_q_, out); }
  void load_do(int64_t b, int32_t h, int64_t t, double* out) const { load(data::kDO, b, h, t, heads_q_, out); }

 private:
  void load(uint32_t tensor, int64_t b, int32_t h, int64_t t, int32_t heads, double* out) const;
  // K and V of one (batch, kv head), generated once and kept: rows of one head reuse them.
  const std::vector<float>& keys(int64_t b, int32_t kvh);
  const std::vector<float>& values(int64_t b, int32_t kvh);
  void fill_head_cache(int64_t b, int32_t kvh);

  attnhost_problem problem_;
  data::Params data_;
  Instance& enumerator_;
  int32_t heads_q_, heads_kv_, d_;
  int64_t cache_b_ = -1;
  int32_t cache_h_ = -1;
  std::vector<float> k_cache_, v_cache_;
};

}  // namespace attnhost
