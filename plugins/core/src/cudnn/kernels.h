// The small kernels around cuDNN's graphs: adding gradients that cuDNN wrote (it overwrites) into
// the core's fp32 accumulators, and moving row statistics between the call's layout and the packed
// one cuDNN reads and writes.
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

} // namespace attncore::cudnn
