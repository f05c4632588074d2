// Host side of the Hopper path: whether it runs on the current device, and the tensor maps its
// bulk copies read through.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "attncore/attention.h"

namespace attncore::cuda::sm90 {

// True when this build carries sm_90a code, the current device is compute capability 9.0, and
// the environment variable ATTNCORE_KERNELS is not "mma" (which keeps every call on the portable
// mma.sync kernels: the GPU tests run both paths on one machine).
bool hopper_path_enabled();

// True when this build carries sm_90a code and the current device is compute capability 9.0 with a
// driver that makes tensor maps, whatever ATTNCORE_KERNELS says: the mma.sync kernels' sm_90a code
// hands its dQ to the copy engine there (backward.cuh).
bool sm90a_device();

// Whether a [batch, token, head, dim] tensor of `elem_bytes`-byte elements can be read (or reduced
// into) by the copy engine: base 16-byte aligned, strides non-negative multiples of 16 bytes below 2^40.
bool tma_readable(const TensorRef& t, int elem_bytes = 2);

// A 4-d map (dim, token, head, batch) over such a tensor (bf16, fp16, fp32 or FP8): boxes of
// `box_rows` tokens x `box_cols` dims of one head, swizzled for the matrix instructions
// (hopper.cuh). Throws attncore::Error when the driver refuses it.
CUtensorMap make_tile_map(const TensorRef& t, DType dtype, int32_t batch, int64_t tokens, int32_t heads, int32_t dim,
                          int box_rows, int box_cols, CUtensorMapSwizzle swizzle);

} // namespace attncore::cuda::sm90
