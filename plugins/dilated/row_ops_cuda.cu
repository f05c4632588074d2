// The row operations on the GPU (row_ops.h). Memory-bound copies and adds: each thread moves one
// 16-byte (or 4-byte, for LSE rows and odd sizes) unit of a row, reading the row's index from a
// table; the combine gives each local row one warp. Four small kernels, one instantiation each
// except the sum and the combine (bf16, fp16, fp32 output).
#include "geometry.h"
#include "row_ops.h"

#include <attnhost/plugin.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <type_traits>

namespace dilated {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxJobs = 6;        // copies per launch (Q, K, V, dO and two row-stats tables)
constexpr unsigned kMaxBlocks = 8192;  // grid-stride beyond this

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) attnhost::fail(ATTNHOST_ERR_DEVICE, std::string("dilated ") + what + ": " + cudaGetErrorString(e));
}

cudaStream_t cuda(void* s) { return static_cast<cudaStream_t>(s); }

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

// Element i of a job of `rows` rows of `units` units, split into (row, unit); 32-bit division
// where it fits.
__device__ __forceinline__ void split(int64_t i, int32_t units, int64_t& row, int32_t& unit) {
  if (i <= 0x7fffffff) {
    const uint32_t r = uint32_t(i) / uint32_t(units);
    row = r;
    unit = int32_t(uint32_t(i) - r * uint32_t(units));
  } else {
    row = i / units;
    unit = int32_t(i - row * units);
  }
}

struct CopyJob {
  char* dst;
  const char* src;
  const int32_t* dst_rows;
  const int32_t* src_rows;
  int64_t rows;
  int32_t row_bytes, unit;  // unit: 16 or 4 bytes
  int64_t dst_batch, src_batch;
};
struct CopyArgs {
  CopyJob jobs[kMaxJobs];
};

// grid: x strides over (row, unit), y the job, z the batch entry.
__global__ void copy_rows_kernel(const __grid_constant__ CopyArgs a) {
  const CopyJob& j = a.jobs[blockIdx.y];
  const int32_t units = j.row_bytes / j.unit;
  const int64_t n = j.rows * units;
  char* dst = j.dst + blockIdx.z * j.dst_batch;
  const char* src = j.src + blockIdx.z * j.src_batch;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t row;
    int32_t u;
    split(i, units, row, u);
    const int64_t d = j.dst_rows ? j.dst_rows[row] : row;
    const int64_t s = j.src_rows ? j.src_rows[row] : row;
    if (d < 0 || s < 0) continue;
    if (j.unit == 16)
      reinterpret_cast<uint4*>(dst + d * j.row_bytes)[u] = reinterpret_cast<const uint4*>(src + s * j.row_bytes)[u];
    else
      reinterpret_cast<uint32_t*>(dst + d * j.row_bytes)[u] = reinterpret_cast<const uint32_t*>(src + s * j.row_bytes)[u];
  }
}

struct SumArgs {
  SumPart parts[kMaxPatterns];
  int32_t num_parts;
  void* dst;
  const float* base;
  int64_t rows;
  int32_t row_floats;
  int64_t batch;
};

template <class T> __device__ __forceinline__ void store4(T* dst, float4 v) {
  if constexpr (std::is_same_v<T, float>) {
    *reinterpret_cast<float4*>(dst) = v;
  } else {
    using T2 = std::conditional_t<std::is_same_v<T, __nv_bfloat16>, __nv_bfloat162, __half2>;
    T2 lo, hi;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      lo = __floats2bfloat162_rn(v.x, v.y);
      hi = __floats2bfloat162_rn(v.z, v.w);
    } else {
      lo = __floats2half2_rn(v.x, v.y);
      hi = __floats2half2_rn(v.z, v.w);
    }
    uint2 bits;
    bits.x = *reinterpret_cast<uint32_t*>(&lo);
    bits.y = *reinterpret_cast<uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(dst) = bits;
  }
}

// One float4 of a local row per thread: its accumulator, then each pattern's rows, rounded once.
// grid: x strides over (row, unit), y the batch entry. Like the combine, bounded to 32 registers so
// that 8 CTAs fit an SM: these loops wait on memory, and every warp slot helps (6 CTAs at 35
// registers: 660 us a gradient, 564 us at 8 on the H200).
template <class T> __global__ void __launch_bounds__(kThreads, 8) sum_rows_kernel(const __grid_constant__ SumArgs a) {
  const int32_t units = a.row_floats / 4;
  const int64_t n = a.rows * units, b = blockIdx.y;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t row;
    int32_t u;
    split(i, units, row, u);
    float4 acc = reinterpret_cast<const float4*>(a.base + b * a.batch + row * a.row_floats)[u];
    for (int32_t p = 0; p < a.num_parts; ++p) {
      const SumPart& part = a.parts[p];
      for (int32_t f = 0; f < part.fan; ++f) {
        const int64_t s = part.rows[row * part.fan + f];
        if (s < 0) continue;
        const float4 x = reinterpret_cast<const float4*>(part.src + b * part.batch + s * a.row_floats)[u];
        acc.x += x.x;
        acc.y += x.y;
        acc.z += x.z;
        acc.w += x.w;
      }
    }
    store4(static_cast<T*>(a.dst) + b * a.batch + row * a.row_floats + 4 * u, acc);
  }
}

__global__ void scatter_add_kernel(const __grid_constant__ RowScatterAdd a) {
  const int64_t n = a.rows * a.row_floats;
  float* dst = a.dst + blockIdx.y * a.dst_batch;
  const float* src = a.src + blockIdx.y * a.src_batch;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t row;
    int32_t e;
    split(i, a.row_floats, row, e);
    const int64_t d = a.dst_rows[row];
    if (d >= 0) atomicAdd(dst + d * a.row_floats + e, src[i]);
  }
}

struct PartArgs {
  const float* o;
  const float* lse;
  const int32_t* rows;
  int64_t o_batch, lse_batch;
};
struct CombineArgs {
  PartArgs parts[kMaxPatterns];
  int32_t num_parts;
  void* o;
  float* lse;
  int64_t tokens;
  int32_t heads, head_dim;
};

constexpr int kCombineWarps = kThreads / 32;
constexpr int kCombineCtasPerSm = 64;  // over every batch entry: eight waves of 8 resident CTAs
constexpr int kMaxUnitsPerLane = 2;  // float4s of a row a lane adds: head_dim <= 256
static_assert(kMaxPatterns <= 32, "the combine gives each pattern's LSE one lane");

// One warp per local row (token, head). Lane p holds pattern p's row index and LSE, so the LSE
// reduction is two shuffle trees and each pattern's weight one broadcast; lanes then split the
// row in float4s (kUnits a lane), and every pattern's loads are independent of the others' (a
// sum, not a chain of dependent scalar loads). The first patterns' rows are loaded with their
// LSE, before the weights are known: the LSE, its reductions and the rows no longer wait in
// turn (-10% at S = 32768, docs/KERNELS.md, "Combine and sums").
template <class T, int kUnits>
__device__ __forceinline__ void combine_row(const CombineArgs& a, int64_t b, int64_t j, int lane) {
  int32_t idx = -1;
  float l = -INFINITY;
  if (lane < a.num_parts) {
    const PartArgs& part = a.parts[lane];
    idx = part.rows[j];
    if (idx >= 0) l = part.lse[b * part.lse_batch + idx];
  }
  const int32_t units = a.head_dim / 4;
  const auto row_of = [&](int32_t p, int32_t row) {
    return reinterpret_cast<const float4*>(a.parts[p].o + b * a.parts[p].o_batch + int64_t(row) * a.head_dim);
  };
  constexpr int kEarly = kUnits == 1 ? 3 : 0;  // (what fits 32 registers without spills)
  float4 x[kEarly > 0 ? kEarly : 1][kUnits];
#pragma unroll
  for (int g = 0; g < kEarly; ++g) {
    const int32_t row = __shfl_sync(0xffffffffu, idx, g);
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      const int u = lane + 32 * k;
      x[g][k] = g < a.num_parts && row >= 0 && u < units ? row_of(g, row)[u] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  float hi = l;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
  float lse = -INFINITY, weight = 0.f;
  if (hi != -INFINITY) {
    float sum = l == -INFINITY ? 0.f : expf(l - hi);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    lse = hi + logf(sum);
    if (l != -INFINITY) weight = expf(l - lse);
  }
  float4 acc[kUnits];
#pragma unroll
  for (int k = 0; k < kUnits; ++k) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  const auto add = [&](float w, const float4& v, float4& s) {
    s.x += w * v.x;
    s.y += w * v.y;
    s.z += w * v.z;
    s.w += w * v.w;
  };
#pragma unroll
  for (int g = 0; g < kEarly; ++g) {
    const float w = __shfl_sync(0xffffffffu, weight, g);  // 0 where not selected (x is 0 there too)
#pragma unroll
    for (int k = 0; k < kUnits; ++k) add(w, x[g][k], acc[k]);
  }
  for (int32_t p = kEarly; p < a.num_parts; ++p) {
    const float w = __shfl_sync(0xffffffffu, weight, p);
    const int32_t row = __shfl_sync(0xffffffffu, idx, p);
    if (w == 0.f) continue;  // not selected, or nothing attended (warp-uniform)
    const float4* o = row_of(p, row);
#pragma unroll
    for (int k = 0; k < kUnits; ++k)
      if (lane + 32 * k < units) add(w, o[lane + 32 * k], acc[k]);
  }
  T* out = static_cast<T*>(a.o) + (b * a.tokens * a.heads + j) * a.head_dim;
#pragma unroll
  for (int k = 0; k < kUnits; ++k)
    if (lane + 32 * k < units) store4(out + 4 * (lane + 32 * k), acc[k]);
  const int64_t t = j / a.heads, h = j - t * a.heads;
  if (lane == 0) a.lse[(b * a.heads + h) * a.tokens + t] = lse;
}

// grid: x strides over the rows, a warp a row at a time, y the batch entries; kCombineCtasPerSm
// CTAs an SM in all. A CTA for each 8 rows (400 thousand at S = 32768) took 695 us where this takes
// 619, at B = 4 and at B = 1; 16 CTAs an SM for each entry gave 619 at B = 4 and 691-696 at B = 1
// (docs/KERNELS.md, "Combine and sums"). 32 registers (see the sum).
template <class T, int kUnits>
__global__ void __launch_bounds__(kThreads, 8) combine_kernel(const __grid_constant__ CombineArgs a) {
  for (int64_t j = int64_t(blockIdx.x) * kCombineWarps + threadIdx.x / 32; j < a.tokens * a.heads;
       j += int64_t(gridDim.x) * kCombineWarps)
    combine_row<T, kUnits>(a, blockIdx.y, j, threadIdx.x % 32);
}

// f(T{}) with T the element type of an output dtype: bf16, fp16 or fp32.
template <class F> void by_output_type(int32_t dtype, const char* what, F&& f) {
  switch (dtype) {
    case ATTNHOST_DTYPE_BF16: f(__nv_bfloat16{}); break;
    case ATTNHOST_DTYPE_FP16: f(__half{}); break;
    case ATTNHOST_DTYPE_FP32: f(float{}); break;
    default: attnhost::fail(ATTNHOST_ERR_INTERNAL, std::string("dilated ") + what + ": output dtype must be bf16, fp16 or fp32");
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

class CudaRowOps final : public RowOps {
 public:
  CudaRowOps() {
    int device = 0;
    check(cudaGetDevice(&device), "device");
    check(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device), "SM count");
  }

  void copy(const std::vector<RowCopy>& jobs, int32_t batch, void* stream) override {
    for (size_t first = 0; first < jobs.size(); first += kMaxJobs) {
      CopyArgs a{};
      int64_t most = 0;
      const int count = static_cast<int>(std::min<size_t>(kMaxJobs, jobs.size() - first));
      for (int k = 0; k < count; ++k) {
        const RowCopy& c = jobs[first + k];
        if (c.row_bytes <= 0 || c.row_bytes % 4 != 0)
          attnhost::fail(ATTNHOST_ERR_INTERNAL, "dilated copy: rows must be a positive multiple of 4 bytes");
        const bool wide = c.row_bytes % 16 == 0 && c.dst_batch_bytes % 16 == 0 && c.src_batch_bytes % 16 == 0 &&
                          aligned16(c.dst) && aligned16(c.src);
        a.jobs[k] = {static_cast<char*>(c.dst), static_cast<const char*>(c.src), c.dst_rows, c.src_rows, c.rows,
                     c.row_bytes, wide ? 16 : 4, c.dst_batch_bytes, c.src_batch_bytes};
        most = std::max(most, c.rows * (c.row_bytes / a.jobs[k].unit));
      }
      if (most == 0) continue;
      copy_rows_kernel<<<dim3(blocks_for(most), count, batch), kThreads, 0, cuda(stream)>>>(a);
      check(cudaGetLastError(), "copy_rows launch");
    }
  }

  void sum(const RowSum& r, int32_t batch, void* stream) override {
    if (r.rows == 0) return;
    if (r.row_floats % 4 != 0 || r.parts.size() > static_cast<size_t>(kMaxPatterns))
      attnhost::fail(ATTNHOST_ERR_INTERNAL, "dilated sum: rows of 4k floats, at most kMaxPatterns parts");
    SumArgs a{};
    std::copy(r.parts.begin(), r.parts.end(), a.parts);
    a.num_parts = static_cast<int32_t>(r.parts.size());
    a.dst = r.dst;
    a.base = r.base;
    a.rows = r.rows;
    a.row_floats = r.row_floats;
    a.batch = r.batch;
    const dim3 grid(blocks_for(r.rows * r.row_floats / 4), batch);
    by_output_type(r.dtype, "sum", [&](auto t) { sum_rows_kernel<decltype(t)><<<grid, kThreads, 0, cuda(stream)>>>(a); });
    check(cudaGetLastError(), "sum_rows launch");
  }

  void scatter_add(const RowScatterAdd& a, int32_t batch, void* stream) override {
    if (a.rows == 0) return;
    scatter_add_kernel<<<dim3(blocks_for(a.rows * a.row_floats), batch), kThreads, 0, cuda(stream)>>>(a);
    check(cudaGetLastError(), "scatter_add launch");
  }

  void combine(const Combine& c, int32_t batch, void* stream) override {
    if (c.parts.size() > static_cast<size_t>(kMaxPatterns) || c.head_dim > 128 * kMaxUnitsPerLane || c.head_dim % 4 != 0)
      attnhost::fail(ATTNHOST_ERR_INTERNAL, "dilated combine: too many patterns or head_dim above 256");
    CombineArgs a{};
    for (size_t p = 0; p < c.parts.size(); ++p)
      a.parts[p] = {c.parts[p].o, c.parts[p].lse, c.parts[p].rows, c.parts[p].o_batch, c.parts[p].lse_batch};
    a.num_parts = static_cast<int32_t>(c.parts.size());
    a.o = c.o;
    a.lse = c.lse;
    a.tokens = c.tokens;
    a.heads = c.heads;
    a.head_dim = c.head_dim;
    const int64_t rows = c.tokens * c.heads;
    if (rows == 0) return;
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>((rows + kCombineWarps - 1) / kCombineWarps,
                                                            (int64_t{kCombineCtasPerSm} * sms_ + batch - 1) / batch)),
                    batch);
    by_output_type(c.dtype, "combine", [&](auto t) {
      if (c.head_dim <= 128) combine_kernel<decltype(t), 1><<<grid, kThreads, 0, cuda(stream)>>>(a);
      else combine_kernel<decltype(t), 2><<<grid, kThreads, 0, cuda(stream)>>>(a);
    });
    check(cudaGetLastError(), "combine launch");
  }

 private:
  int sms_ = 1;  // of the device the instance was made on
};

}  // namespace

std::unique_ptr<RowOps> make_cuda_row_ops() { return std::make_unique<CudaRowOps>(); }

}  // namespace dilated
