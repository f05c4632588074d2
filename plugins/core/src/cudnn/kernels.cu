#include "kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
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

struct Factors {
  float v[kMaxFactors];
};

__global__ void fill_f32_kernel(float* dst, int64_t stride, Factors values, int n) {
  if (int(threadIdx.x) < n) dst[threadIdx.x * stride] = values.v[threadIdx.x];
}

__device__ float e4m3_to_float(uint32_t byte) {
  __nv_fp8_e4m3 f;
  f.__x = __nv_fp8_storage_t(byte);
  return float(f);
}

// One thread per run of 8 elements; words are assembled by shifts so that no type is read through another.
template <Convert op>
__global__ void convert_kernel(void* dst, int64_t db, int64_t dt, int64_t dh, const void* src, int64_t sb, int64_t st,
                               int64_t sh, float factor, int64_t tokens, int64_t heads, int64_t runs, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = (i % runs) * 8;
    int64_t r = i / runs;
    const int64_t h = r % heads;
    r /= heads;
    const int64_t t = r % tokens, b = r / tokens;
    const int64_t from = b * sb + t * st + h * sh + d, to = b * db + t * dt + h * dh + d;
    float x[8];
    if constexpr (op == Convert::bf16_to_e4m3) {
      const uint4 w = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(src) + from);
      const uint32_t words[4] = {w.x, w.y, w.z, w.w};
      for (int k = 0; k < 8; ++k) x[k] = __uint_as_float(((words[k / 2] >> (16 * (k % 2))) & 0xffffu) << 16);
    } else {
      const uint2 w = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(src) + from);
      for (int k = 0; k < 8; ++k) x[k] = e4m3_to_float(((k < 4 ? w.x : w.y) >> (8 * (k % 4))) & 0xffu);
    }
    for (int k = 0; k < 8; ++k) x[k] *= factor;
    if constexpr (op == Convert::e4m3_to_bf16) {
      uint32_t words[4];
      for (int k = 0; k < 4; ++k)
        words[k] = uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(x[2 * k]))) |
                   uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(x[2 * k + 1]))) << 16;
      *reinterpret_cast<uint4*>(static_cast<uint16_t*>(dst) + to) = make_uint4(words[0], words[1], words[2], words[3]);
    } else if constexpr (op == Convert::e4m3_add_fp32) {
      float4* out = reinterpret_cast<float4*>(static_cast<float*>(dst) + to);
      float4 lo = out[0], hi = out[1];
      lo.x += x[0], lo.y += x[1], lo.z += x[2], lo.w += x[3];
      hi.x += x[4], hi.y += x[5], hi.z += x[6], hi.w += x[7];
      out[0] = lo;
      out[1] = hi;
    } else {
      uint32_t words[2] = {0, 0};
      for (int k = 0; k < 8; ++k)
        words[k / 4] |= uint32_t(__nv_cvt_float_to_fp8(x[k], __NV_SATFINITE, __NV_E4M3)) << (8 * (k % 4));
      *reinterpret_cast<uint2*>(static_cast<uint8_t*>(dst) + to) = make_uint2(words[0], words[1]);
    }
  }
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

void fill_f32(float* dst, int64_t stride, const float* values, int n, void* stream) {
  if (n <= 0) return;
  if (n > kMaxFactors) throw Error("attncore cudnn: " + std::to_string(n) + " factors to fill, at most 32");
  Factors f{};
  std::copy(values, values + n, f.v);
  fill_f32_kernel<<<1, kMaxFactors, 0, static_cast<cudaStream_t>(stream)>>>(dst, stride, f, n);
  check_launch("factor fill");
}

void convert(Convert op, void* dst, int64_t dst_batch, int64_t dst_token, int64_t dst_head, const void* src,
             int64_t src_batch, int64_t src_token, int64_t src_head, float factor, int64_t batch, int64_t tokens,
             int64_t heads, int64_t head_dim, void* stream) {
  const int64_t runs = head_dim / 8, n = batch * tokens * heads * runs;
  if (n == 0) return;
  const auto launch = [&](auto kernel) {
    kernel<<<grid_for(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        dst, dst_batch, dst_token, dst_head, src, src_batch, src_token, src_head, factor, tokens, heads, runs, n);
  };
  switch (op) {
  case Convert::e4m3_to_bf16: launch(convert_kernel<Convert::e4m3_to_bf16>); break;
  case Convert::e4m3_add_fp32: launch(convert_kernel<Convert::e4m3_add_fp32>); break;
  case Convert::bf16_to_e4m3: launch(convert_kernel<Convert::bf16_to_e4m3>); break;
  }
  check_launch("FP8 conversion");
}

} // namespace attncore::cudnn
