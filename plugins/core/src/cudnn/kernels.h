// The small kernels around cuDNN's graphs: adding gradients that cuDNN wrote (it overwrites) into
// the core's fp32 accumulators, moving row statistics between the call's layout and the packed
// one cuDNN reads and writes, and the FP8 graphs' conversions and per-tensor factors.
#pragma once

#include <cstdint>

namespace attncore::cudnn {

// dst[b, t, h, :] += src[b, t, h, :] over [batch, tokens, heads, head_dim], fp32, strides in
// elements (dim contiguous in both). Throws attncore::Error on a failed launch.
void add_fp32(float* dst, int64_t dst_batch, int64_t dst_token, int64_t dst_head, const float* src, int64_t src_batch,
              int64_t src_token, int64_t src_head, int64_t batch, int64_t tokens, int64_t heads, int64_t head_dim,
              void* stream);

// dst[b, h, i] = src[b, h, i] over [batch, heads, rows] (rows contiguous in both).
void copy_stats(float* dst, int64_t dst_batch, int64_t dst_head, const float* src, int64_t src_batch,
                int64_t src_head, int64_t batch, int64_t heads, int64_t rows, void* stream);

// dst[i] = value for i < n.
void fill_i32(int32_t* dst, int32_t value, int64_t n, void* stream);

// dst[i * stride] = values[i] for i < n <= kMaxFactors, values read on the host when called: the
// FP8 graphs' one-element tensors, filled on the stream (no host synchronization, capturable).
constexpr int kMaxFactors = 32;
void fill_f32(float* dst, int64_t stride, const float* values, int n, void* stream);

// What convert does with each element: x (e4m3, or bf16) times `factor`, then written as bf16,
// added into fp32, or rounded to e4m3 (saturating at +-448).
enum class Convert { e4m3_to_bf16, e4m3_add_fp32, bf16_to_e4m3 };

// dst[b, t, h, :] (op) src[b, t, h, :] * factor over [batch, tokens, heads, head_dim]; strides in
// elements of each side, dim contiguous, head_dim a multiple of 8; each run of 8 elements starts
// 8-byte aligned in e4m3, 16-byte aligned in bf16 and fp32 (what 16-byte strides give).
void convert(Convert op, void* dst, int64_t dst_batch, int64_t dst_token, int64_t dst_head, const void* src,
             int64_t src_batch, int64_t src_token, int64_t src_head, float factor, int64_t batch, int64_t tokens,
             int64_t heads, int64_t head_dim, void* stream);

} // namespace attncore::cudnn
