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
// q_and_k_only: only Q and K (the backward with e4m3 products); the returned d_o and v then point at
// their slots unwritten (bf16 in name only: the caller writes dO^T into dO's).
BackwardParams widen_fp8_inputs(const BackwardParams& p, void* at, cudaStream_t stream, bool q_and_k_only = false);

} // namespace attncore::cuda
