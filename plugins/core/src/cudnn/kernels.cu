#include "kernels.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

#include "attncore/attention.h"

namespace attncore::cudnn {

namespace {

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(std::string("attncore cudnn: ") + what + " launch failed: " + cudaGetErrorString(e));
}

unsigned grid_for(int64_t n, int threads) {
  return unsigned(std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, 65536)));
}

// One thread per pair of elements (head_dim is a multiple of 8 and fp32 tensors are 8-byte aligned
// with even strides: the core's contract).
__global__ void add_fp32_kernel(float* dst, int64_t db, int64_t dt, int64_t dh, const float* src, int64_t sb,
                                int64_t st, int64_t sh, int64_t tokens, int64_t heads, int64_t pairs, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = (i % pairs) * 2;
    int64_t r = i / pairs;
    const int64_t h = r % heads;
    r /= heads;
    const int64_t t = r % tokens, b = r / tokens;
    float2* out = reinterpret_cast<float2*>(dst + b * db + t * dt + h * dh + d);
    const float2 in = *reinterpret_cast<const float2*>(src + b * sb + t * st + h * sh + d);
    float2 acc = *out;
    acc.x += in.x;
    acc.y += in.y;
    *out = acc;
  }
}

__global__ void copy_stats_kernel(float* dst, int64_t db, int64_t dh, const float* src, int64_t sb, int64_t sh,
                                  int64_t heads, int64_t rows, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i % rows, bh = i / rows, h = bh % heads, b = bh / heads;
    dst[b * db + h * dh + row] = src[b * sb + h * sh + row];
  }
}

__global__ void fill_i32_kernel(int32_t* dst, int32_t value, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = value;
}

} // namespace

void add_fp32(float* dst, int64_t dst_batch, int64_t dst_token, int64_t dst_head, const float* src, int64_t src_batch,
              int64_t src_token, int64_t src_head, int64_t batch, int64_t tokens, int64_t heads, int64_t head_dim,
              void* stream) {
  const int64_t pairs = head_dim / 2, n = batch * tokens * heads * pairs;
  if (n == 0) return;
  add_fp32_kernel<<<grid_for(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      dst, dst_batch, dst_token, dst_head, src, src_batch, src_token, src_head, tokens, heads, pairs, n);
  check_launch("gradient add");
}

void copy_stats(float* dst, int64_t dst_batch, int64_t dst_head, const float* src, int64_t src_batch,
                int64_t src_head, int64_t batch, int64_t heads, int64_t rows, void* stream) {
  const int64_t n = batch * heads * rows;
  if (n == 0) return;
  copy_stats_kernel<<<grid_for(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      dst, dst_batch, dst_head, src, src_batch, src_head, heads, rows, n);
  check_launch("row statistics copy");
}

void fill_i32(int32_t* dst, int32_t value, int64_t n, void* stream) {
  if (n == 0) return;
  fill_i32_kernel<<<grid_for(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(dst, value, n);
  check_launch("int32 fill");
}

} // namespace attncore::cudnn
