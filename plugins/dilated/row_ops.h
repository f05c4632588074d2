// The row operations around the core's attention calls: gather the dilated rows of a pattern into
// dense buffers, sum their gradients back into the local rows, pack and unpack messages, combine
// the patterns' partial outputs by LSE. CPU loops (row_ops_cpu.cpp) and CUDA kernels (row_ops_cuda.cu), one
// contract, chosen with the core's Engine.
//
// A row is `row_bytes` contiguous bytes at base + index * row_bytes: one token of one head (D
// elements), or one LSE/delta value. The index tables are built once on the host (geometry.h says
// what they hold) and live where the data lives (device memory on CUDA). Every operation repeats
// over `batch` entries, each at its own batch stride; the tables are the same for every entry.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace dilated {

// dst row (dst_rows ? dst_rows[j] : j) = src row (src_rows ? src_rows[j] : j) for j < rows; a
// negative index skips the row. Gather (src_rows), pack (src_rows), unpack (dst_rows).
struct RowCopy {
  void* dst = nullptr;
  const void* src = nullptr;
  const int32_t* dst_rows = nullptr;
  const int32_t* src_rows = nullptr;
  int64_t rows = 0;
  int32_t row_bytes = 0;  // a multiple of 4
  int64_t dst_batch_bytes = 0, src_batch_bytes = 0;
};

// One pattern's gathered gradient rows (fp32): local row j draws on rows[j * fan + f], f < fan
// (negative: nothing; fan > 1 when the query heads of a GQA group each have a copy of a key row).
struct SumPart {
  const float* src = nullptr;
  const int32_t* rows = nullptr;
  int32_t fan = 1;
  int64_t batch = 0;  // in floats
};

// A gradient's last step: every local row j of [B, rows, row_floats] is its fp32 accumulator row
// (base) plus every pattern's gathered rows for it, summed in fp32 in a fixed order and rounded
// once into dst (`dtype`). One writer per row: no atomics, the same sum every run.
struct RowSum {
  void* dst = nullptr;
  int32_t dtype = 0;  // attnhost_dtype: bf16, fp16 or fp32
  const float* base = nullptr;
  int64_t rows = 0;
  int32_t row_floats = 0;
  int64_t batch = 0;  // of dst and base, in elements
  std::vector<SumPart> parts;  // at most kMaxPatterns (geometry.h)
};

// fp32: dst row dst_rows[j] += src row j for j < rows; destinations may repeat (GQA: the query heads
// of a group send partials of one key row), so the GPU adds atomically.
struct RowScatterAdd {
  float* dst = nullptr;
  const float* src = nullptr;
  const int32_t* dst_rows = nullptr;
  int64_t rows = 0;
  int32_t row_floats = 0;
  int64_t dst_batch = 0, src_batch = 0;  // in floats
};

// One pattern's partial output: local query row j (token * heads + head) finds its O_i (fp32,
// head_dim floats) at row rows[j] of `o` and its LSE_i at lse[rows[j]]; rows[j] < 0: the pattern
// does not select it.
struct CombinePart {
  const float* o = nullptr;
  const float* lse = nullptr;
  const int32_t* rows = nullptr;
  int64_t o_batch = 0, lse_batch = 0;  // in floats
};

// Every local row: L = logsumexp_i LSE_i, O = sum_i exp(LSE_i - L) O_i, in fp32, O rounded once to
// `dtype` ([B, tokens, heads, D]) and L written to lse ([B, heads, tokens]); a row no pattern
// selects gets O = 0 and L = -inf.
struct Combine {
  void* o = nullptr;
  float* lse = nullptr;
  int32_t dtype = 0;  // attnhost_dtype: bf16, fp16 or fp32
  int64_t tokens = 0;
  int32_t heads = 0, head_dim = 0;
  std::vector<CombinePart> parts;  // at most kMaxPatterns (geometry.h)
};

class RowOps {
 public:
  virtual ~RowOps() = default;
  // cuda: the kernels on the given streams (throws when built without CUDA); else CPU loops.
  static std::unique_ptr<RowOps> make(bool cuda);

  virtual void copy(const std::vector<RowCopy>& jobs, int32_t batch, void* stream) = 0;
  virtual void sum(const RowSum& a, int32_t batch, void* stream) = 0;
  virtual void scatter_add(const RowScatterAdd& a, int32_t batch, void* stream) = 0;
  virtual void combine(const Combine& c, int32_t batch, void* stream) = 0;
};

}  // namespace dilated
