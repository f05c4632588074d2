// The FP8 backward's inputs widened for its bf16 products (fp8_inputs.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "attncore/attention.h"

namespace attncore::cuda {

// Enqueues the widening of p's Q, dO, K and V (times their descales) into bf16 at `at`, which
// holds widened_inputs_bytes(p) bytes (workspace_bytes.h), and returns p as the bf16 call on them
// (descales 1). The inputs must be 16-byte aligned with strides that are multiples of 16 elements;
// head_dim a multiple of 16.
// fp8_products: only Q and K (the backward with e4m3 products), the returned d_o and v pointing at
// their slots unwritten (bf16 in name only: the caller writes dO^T into dO's); K, read only by dQ's
// product there, with its columns interleaved within each eight (interleaved_column: 8g + 2i and
// 8g + 2i + 1 hold 8g + i and 8g + 4 + i), so that dQ's accumulator comes out in stmatrix's order
// (BackwardConfig::kDqByStmatrix).
enum class WidenFor { bf16_kernels, fp8_products };
// The column of K that column c of its interleaved widening holds.
__host__ __device__ constexpr int interleaved_column(int c) { return c / 8 * 8 + 4 * (c % 2) + c % 8 / 2; }
BackwardParams widen_fp8_inputs(const BackwardParams& p, void* at, cudaStream_t stream,
                                WidenFor use = WidenFor::bf16_kernels);

} // namespace attncore::cuda
