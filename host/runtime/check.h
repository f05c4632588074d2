// The correctness check of DESIGN.md section 5, in three steps that fit the SPMD runner:
//   plan (every rank computes the same sample from the problem and the seed),
//   pack (each rank serializes the sampled rows and columns it holds),
//   evaluate (rank 0 compares them with the float64 reference).
//
// Small problems are checked completely: every row's O, LSE and dQ and every column's dK and dV.
// Larger ones are sampled: query_rows random rows plus the rows at every chunk boundary of the
// usual shardings (S * i / 2P and the token before, for P up to 16), where tiling and sharding
// bugs live, and key_columns columns chosen the same way. A column needs the LSE and delta = dO.O of
// every row attending it; when rows were only sampled these come from the plugin's own outputs
// (the O and LSE of which are themselves checked on the sampled rows).
#pragma once

#include "plugins/loaded_plugin.h"
#include "results/records.h"
#include "runtime/data.h"
#include "suite/suite.h"

#include <attnhost/plugin.h>

#include <cstdint>
#include <string>
#include <vector>

namespace attnhost {

struct RowId {
  int64_t b;
  int32_t h;
  int64_t t;
};

struct CheckPlan {
  bool complete = false;    // every row and column
  bool gradients = false;   // dQ, dK, dV are checked too
  std::vector<RowId> rows;  // (b, query head, query token)
  std::vector<RowId> cols;  // (b, kv head, key token)
};

// One rank's outputs, copied to host memory, with the layouts that place them.
struct RankOutputs {
  Instance::Layout q_layout, kv_layout;
  int32_t dtype = ATTNHOST_DTYPE_BF16;        // of the outputs
  int32_t input_dtype = ATTNHOST_DTYPE_BF16;  // of dO (FP8 problems: FP8, times descale_do)
  double descale_do = 1;
  int64_t batch = 1;
  int32_t heads_q = 1, heads_kv = 1, head_dim = 1;
  std::vector<char> o, lse, dq, dk, dv, d_o; // dq..d_o empty without gradients
};

CheckPlan plan_check(const attnhost_problem& problem, const suite::Check& settings, uint64_t seed,
                     int64_t total_pairs, bool gradients);

std::string pack_samples(const CheckPlan& plan, const RankOutputs& out);

// `packed` holds every rank's pack_samples; `nonfinite` the NaN/Inf counts per tensor name.
CheckResult evaluate_check(const CheckPlan& plan, const std::vector<std::string>& packed,
                           const attnhost_problem& problem, const data::Params& data, Instance& enumerator,
                           const suite::Check& settings, const std::vector<std::pair<std::string, int64_t>>& nonfinite);

struct Tolerance {
  double rel_l2, max;
};
Tolerance tolerance(const std::string& tensor, int32_t dtype);

}  // namespace attnhost
