// Shared by the CPU operations: element access by dtype, the regions a call covers (the whole call
// or its segments), and the key tiles each row tile visits (an interval of the mask, or a block list).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attncore/attention.h"
#include "attncore/numeric.h"

namespace attncore::cpu::detail {

constexpr int kRowTile = 16; // rows that share each loaded key tile
constexpr int kColTile = 64; // keys per tile: one online-softmax step

[[noreturn]] inline void fail(const std::string& what) { throw Error("attncore cpu: " + what); }

inline float resolve_scale(float scale, int head_dim) {
  return scale != 0.f ? scale : 1.f / std::sqrt(float(head_dim));
}

// Element offset of (batch, token, head) in a [batch, token, head, dim] view.
inline int64_t offset(const TensorRef& t, int64_t b, int64_t i, int64_t h) {
  return b * t.batch_stride + i * t.token_stride + h * t.head_stride;
}
inline float* stat_ptr(const RowStatsRef& r, int64_t b, int64_t h) {
  return r.data + b * r.batch_stride + h * r.head_stride;
}

// Reads `n` elements of dtype `t` at element offset `off` into Acc, each times `descale` (an FP8
// tensor's; 1 for any other).
template <class Acc> void load(DType t, const void* base, int64_t off, int n, Acc* out, float descale = 1.f) {
  switch (t) {
  case DType::fp8_e4m3:
  case DType::fp8_e5m2: {
    const uint8_t* s = static_cast<const uint8_t*>(base) + off;
    for (int i = 0; i < n; ++i) out[i] = Acc(fp8_to_float(s[i], t == DType::fp8_e4m3)) * Acc(descale);
    break;
  }
  case DType::bf16: {
    const uint16_t* s = static_cast<const uint16_t*>(base) + off;
    for (int i = 0; i < n; ++i) out[i] = Acc(bf16_to_float(s[i]));
    break;
  }
  case DType::fp16: {
    const uint16_t* s = static_cast<const uint16_t*>(base) + off;
    for (int i = 0; i < n; ++i) out[i] = Acc(fp16_to_float(s[i]));
    break;
  }
  case DType::fp32: {
    const float* s = static_cast<const float*>(base) + off;
    for (int i = 0; i < n; ++i) out[i] = Acc(s[i]);
    break;
  }
  default: fail("unsupported dtype");
  }
}

// Writes `n` values rounded to dtype `t` (through fp32, as the GPU does).
template <class Acc> void store(DType t, void* base, int64_t off, int n, const Acc* in) {
  switch (t) {
  case DType::bf16: {
    uint16_t* d = static_cast<uint16_t*>(base) + off;
    for (int i = 0; i < n; ++i) d[i] = float_to_bf16(float(in[i]));
    break;
  }
  case DType::fp16: {
    uint16_t* d = static_cast<uint16_t*>(base) + off;
    for (int i = 0; i < n; ++i) d[i] = float_to_fp16(float(in[i]));
    break;
  }
  case DType::fp32: {
    float* d = static_cast<float*>(base) + off;
    for (int i = 0; i < n; ++i) d[i] = float(in[i]);
    break;
  }
  default: fail("unsupported dtype");
  }
}

// Rows [row_begin, row_end) attend columns [col_begin, col_end); positions are global.
struct Region {
  int64_t row_begin, row_end, col_begin, col_end;
  int64_t row_pos0, col_pos0; // global positions of row_begin and col_begin
  int64_t row_pos(int64_t i) const { return row_pos0 + (i - row_begin); }
  int64_t col_pos(int64_t j) const { return col_pos0 + (j - col_begin); }
};

inline bool visible(const Mask& m, int64_t qp, int64_t kp) {
  return (!m.causal || kp <= qp) && (m.window_left < 0 || kp >= qp - m.window_left) &&
         (m.window_right < 0 || kp <= qp + m.window_right);
}

std::vector<Region> regions(int64_t seqlen_q, int64_t seqlen_kv, const Mask& mask,
                            const Segment* segments, int32_t num_segments);

// Validates a block list against the call (throws on anything the CUDA path would misread).
void check_blocks(const BlockList& bl, int64_t seqlen_q, int64_t seqlen_kv, int32_t heads_q);

struct KvTile {
  int64_t c0, c1; // columns [c0, c1), inside the region
  bool masked;    // evaluate the Mask per element
};

// The key tiles rows [r0, r1) of `reg` visit for query head hq, in increasing column order.
// Rows r0..r1 lie in one block of `blocks` when it is given (r0 a multiple of kRowTile).
void kv_tiles(const Mask& mask, const BlockList* blocks, const Region& reg, int64_t r0, int64_t r1,
              int32_t hq, int64_t seqlen_kv, std::vector<KvTile>& out);

// Common shape checks of forward and backward.
void check_call(DType dtype, int32_t batch, int32_t heads_q, int32_t heads_kv, int32_t head_dim,
                int64_t seqlen_q, int64_t seqlen_kv, const Segment* segments, int32_t num_segments,
                const BlockList* blocks);

} // namespace attncore::cpu::detail
