// The public CUDA entry points (attncore/cuda.h): validation on the host, dispatch to the
// per-head-dim launchers, and the small row-wise kernels (delta, merge, convert, amax).
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "../workspace_bytes.h"
#include "attncore/cuda.h"
#include "device.cuh"
#include "fp8_inputs.h"
#include "launch.h"
#if ATTNCORE_HAVE_SM90
#include "sm90/tensor_map.h"
#endif

namespace attncore {
namespace cuda {

namespace {

[[noreturn]] void fail(const std::string& what) { throw Error("attncore cuda: " + what); }

} // namespace

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) fail(std::string(what) + " launch failed: " + cudaGetErrorString(e));
}

size_t max_smem_per_block() {
  int dev = 0, bytes = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  // ATTNCORE_MAX_SMEM=<bytes> lowers it, so that one device runs the shapes a smaller one would
  // (tests: 166912 for an sm_80, 101376 for an sm_86, sm_89 or sm_120).
  if (const char* cap = std::getenv("ATTNCORE_MAX_SMEM"); cap && *cap) bytes = std::min(bytes, std::atoi(cap));
  return size_t(std::max(bytes, 0));
}

void require_smem(size_t bytes, size_t allowed, const char* what, int head_dim) {
  if (bytes > allowed)
    fail(std::string(what) + " at head dim " + std::to_string(head_dim) + " needs " + std::to_string(bytes) +
         " bytes of shared memory a block; this device allows " + std::to_string(allowed));
}

namespace {

constexpr int64_t kMaxLen = (int64_t(1) << 31) - 1;
constexpr int64_t kMaxGridYZ = 65535;

// Elements of a dtype tensor are copied 16 bytes at a time; fp32 ones two floats at a time.
void check_tensor(const TensorRef& t, bool fp32, const char* name) {
  if (!t.data) fail(std::string(name) + " is null");
  const uintptr_t addr = reinterpret_cast<uintptr_t>(t.data);
  const int64_t unit = fp32 ? 2 : 8;
  if (addr % uintptr_t(fp32 ? 8 : 16) != 0 || t.batch_stride % unit || t.token_stride % unit || t.head_stride % unit)
    fail(std::string(name) + (fp32 ? " must be 8-byte aligned with even strides"
                                   : " must be 16-byte aligned with strides that are multiples of 8 elements"));
}

void check_shape(DType dtype, int32_t batch, int32_t heads_q, int32_t heads_kv, int32_t head_dim, int64_t seqlen_q,
                 int64_t seqlen_kv, float scale, const Segment* segments, int32_t num_segments, const BlockList* blocks,
                 bool backward) {
  const std::string why = backward ? check_supported(dtype, head_dim) : check_supported_forward(dtype, head_dim);
  if (!why.empty()) throw Error(why);
  if (batch < 1 || heads_q < 1 || heads_kv < 1 || batch > kMaxGridYZ || heads_q > kMaxGridYZ)
    fail("batch and heads must be in [1, 65535]");
  if (heads_q % heads_kv != 0)
    fail("heads_q (" + std::to_string(heads_q) + ") must be a multiple of heads_kv (" + std::to_string(heads_kv) + ")");
  if (seqlen_q < 0 || seqlen_kv < 0 || seqlen_q > kMaxLen || seqlen_kv > kMaxLen)
    fail("lengths must be in [0, 2^31)");
  if (!(scale > 0.f)) fail("softmax_scale must be positive (0 means 1/sqrt(head_dim))");
  if (num_segments < 0 || (num_segments > 0 && !segments)) fail("bad segments");
  if (blocks) {
    if (num_segments > 0) fail("a block list cannot be combined with segments");
    const BlockList& b = *blocks;
    if ((b.block_q != 64 && b.block_q != 128) || (b.block_kv != 64 && b.block_kv != 128))
      fail("block list block sizes must be 64 or 128");
    if (int64_t(b.num_q_blocks) * b.block_q < seqlen_q) fail("block list has too few query blocks");
    if (b.heads != 1 && b.heads != heads_q) fail("block list heads must be 1 or heads_q");
    if (!b.row_ptr || !b.kv_block || !b.masked) fail("block list CSR arrays are missing");
    if (backward && (!b.col_ptr || !b.q_block || !b.q_masked ||
                     int64_t(b.num_kv_blocks) * b.block_kv < seqlen_kv))
      fail("backward with a block list needs its CSC (col_ptr, q_block, q_masked, num_kv_blocks): see make_block_list");
  }
}

float resolve_scale(float s, int32_t head_dim) { return s != 0.f ? s : 1.f / std::sqrt(float(head_dim)); }

template <class T> void dispatch_forward(const ForwardParams& p, cudaStream_t s) {
#if ATTNCORE_HAVE_SM90
  if (sm90::hopper_path_enabled() && sm90::tma_readable(p.q) && sm90::tma_readable(p.k) && sm90::tma_readable(p.v)) {
    switch (p.head_dim) {
    case 64: return sm90::launch_forward_sm90<T, 64>(p, s);
    case 80: return sm90::launch_forward_sm90<T, 80>(p, s);
    case 96: return sm90::launch_forward_sm90<T, 96>(p, s);
    case 128: return sm90::launch_forward_sm90<T, 128>(p, s);
    case 256: return sm90::launch_forward_sm90<T, 256>(p, s);
    }
  }
#endif
  switch (p.head_dim) {
  case 64: return launch_forward<T, 64>(p, s);
  case 80: return launch_forward<T, 80>(p, s);
  case 96: return launch_forward<T, 96>(p, s);
  case 128: return launch_forward<T, 128>(p, s);
  case 256: return launch_forward<T, 256>(p, s);
  }
}
// FP8 runs on the Hopper kernels alone (wgmma's e4m3 products), whose bulk copies read rows of
// 16-byte multiples.
constexpr const char* kFp8NeedsHopper =
    "the FP8 forward runs on the Hopper kernels only (an sm_90a build on a Hopper GPU, ATTNCORE_KERNELS not mma)";

// FP8 tensors are read 16 bytes at a time, by bulk copies and by the widening pass alike.
void check_fp8_inputs(std::initializer_list<const TensorRef*> tensors, const char* names) {
  const auto aligned = [](int64_t stride) { return stride % 16 == 0; };
  for (const TensorRef* t : tensors)
    if (reinterpret_cast<uintptr_t>(t->data) % 16 != 0 || !aligned(t->batch_stride) || !aligned(t->token_stride) ||
        !aligned(t->head_stride))
      fail(std::string(names) + " must be 16-byte aligned with strides that are multiples of 16 elements");
}

void dispatch_forward_fp8(const ForwardParams& p, cudaStream_t s) {
  check_fp8_inputs({&p.q, &p.k, &p.v}, "FP8 q, k and v");
#if ATTNCORE_HAVE_SM90
  if (!sm90::hopper_path_enabled()) fail(kFp8NeedsHopper);
  switch (p.head_dim) {
  case 64: return sm90::launch_forward_sm90_fp8<64>(p, s);
  case 128: return sm90::launch_forward_sm90_fp8<128>(p, s);
  case 256: return sm90::launch_forward_sm90_fp8<256>(p, s);
  }
#endif
  fail(kFp8NeedsHopper);
}
// The FP8 backward's inputs widened to bf16 in the workspace, after the split key groups' or the
// last wave's sums (workspace_bytes.h): all four for the bf16 kernels, or Q alone for the e4m3
// products (docs/KERNELS.md, "FP8 backward").
BackwardParams widened_backward(const BackwardParams& p, cudaStream_t s, WidenFor use = WidenFor::bf16_kernels) {
  if (!p.workspace || p.workspace_bytes < backward_workspace_bytes(p) || reinterpret_cast<uintptr_t>(p.workspace) % 256)
    fail("an FP8 backward needs backward_workspace_bytes(params) bytes of workspace, 256-byte aligned (its inputs "
         "widened to bf16)");
  BackwardParams bf16 = p;
  bf16.dtype = DType::bf16;
  bf16.dq_out = {};  // (its counters lie after the widened inputs)
  const size_t sums = workspace_align(backward_workspace_bytes(bf16));
  BackwardParams w = widen_fp8_inputs(p, static_cast<char*>(p.workspace) + sums, s, use);
  w.workspace = sums > 0 ? p.workspace : nullptr;
  w.workspace_bytes = sums;
  return w;
}

// True where the kernel wrote dq_out itself (else backward_cuda's pass does).
template <class T> bool dispatch_backward(const BackwardParams& p, cudaStream_t s) {
#if ATTNCORE_HAVE_SM90
  // The Hopper backward adds dQ with atomics: deterministic calls stay on the mma.sync kernels.
  if (!p.deterministic && sm90::hopper_path_enabled() && sm90::tma_readable(p.q) &&
      sm90::tma_readable(p.k) && sm90::tma_readable(p.v) && sm90::tma_readable(p.d_o)) {
    switch (p.head_dim) {
    case 64: return sm90::launch_backward_sm90<T, 64>(p, s);
    case 80: return sm90::launch_backward_sm90<T, 80>(p, s);
    case 96: return sm90::launch_backward_sm90<T, 96>(p, s);
    case 128: return sm90::launch_backward_sm90<T, 128>(p, s);
    case 256: return sm90::launch_backward_sm90<T, 256>(p, s);
    }
  }
#endif
  switch (p.head_dim) {
  case 64: launch_backward<T, 64>(p, s); break;
  case 80: launch_backward<T, 80>(p, s); break;
  case 96: launch_backward<T, 96>(p, s); break;
  case 128: launch_backward<T, 128>(p, s); break;
  case 256: launch_backward<T, 256>(p, s); break;
  }
  return false;
}

// ---- row-wise kernels: a warp per (batch, token, head) row, or per kWarpRows of them ----------------

constexpr int kRowWarps = 8;  // warps a block
constexpr int kWarpRows = 4;  // rows a warp of delta and convert, their loads issued together

struct RowIndex {
  int64_t b, h, i;
  bool valid;
};
// Rows numbered in the order of the [batch, token, head, D] tensors' bytes, heads fastest, so that
// a warp's rows and its neighbours' are one run of memory.
// 32-bit division where it fits: 64-bit division is a long software sequence (delta 2.42 -> 2.55
// TB/s on an H200).
__device__ RowIndex row_index(int32_t heads, int64_t seqlen, int64_t rows, int64_t row) {
  if (row <= 0x7fffffff && seqlen <= 0x7fffffff) {
    const uint32_t r = uint32_t(row), bi = r / uint32_t(heads), b = bi / uint32_t(seqlen);
    return RowIndex{b, int64_t(r - bi * uint32_t(heads)), int64_t(bi - b * uint32_t(seqlen)), row < rows};
  }
  const int64_t bi = row / heads;
  return RowIndex{bi / seqlen, row % heads, bi % seqlen, row < rows};
}
// Row r's first element in t.
__device__ int64_t row_offset(const TensorRef& t, const RowIndex& r) {
  return r.b * t.batch_stride + r.i * t.token_stride + r.h * t.head_stride;
}
// The first elements in a and in b of the kWarpRows rows from `first`.
__device__ void warp_row_offsets(const TensorRef& a, const TensorRef& b, int32_t heads, int64_t seqlen, int64_t rows,
                                 int64_t first, int64_t (&oa)[kWarpRows], int64_t (&ob)[kWarpRows]) {
#pragma unroll
  for (int k = 0; k < kWarpRows; ++k) {
    const RowIndex r = row_index(heads, seqlen, rows, first + k);
    oa[k] = row_offset(a, r);
    ob[k] = row_offset(b, r);
  }
}
// The first of the kRows rows of this warp. (A grid capped at 4096 blocks striding over the rows
// measured slower for delta, 2.1 against 2.55 TB/s on an H200, and faster for convert, 3.46
// against 3.20: docs/KERNELS.md, "Row kernels".)
template <int kRows> __device__ int64_t warp_first_row() {
  return (int64_t(blockIdx.x) * kRowWarps + threadIdx.x / 32) * kRows;
}

// A lane's part of a row: kV consecutive elements as floats. kV = 4 is one 8-byte (16-bit types)
// or 16-byte (fp32) access, for rows whose every start is 4-element aligned (rows_aligned4).
template <class T, int kV> __device__ __forceinline__ void load_part(const void* base, int64_t off, float (&x)[kV]) {
  const T* p = static_cast<const T*>(base) + off;
  if constexpr (kV == 1) {
    x[0] = float(p[0]);
  } else if constexpr (std::is_same_v<T, float>) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
  } else if constexpr (sizeof(T) == 1) { // FP8: four codes, each pair to halves exactly
    const uint32_t v = *reinterpret_cast<const uint32_t*>(p);
    constexpr __nv_fp8_interpretation_t kind = std::is_same_v<T, __nv_fp8_e4m3> ? __NV_E4M3 : __NV_E5M2;
    const float2 lo = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(v & 0xffff), kind)));
    const float2 hi = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(v >> 16), kind)));
    x[0] = lo.x, x[1] = lo.y, x[2] = hi.x, x[3] = hi.y;
  } else {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    const float2 lo = unpack2<T>(v.x), hi = unpack2<T>(v.y);
    x[0] = lo.x, x[1] = lo.y, x[2] = hi.x, x[3] = hi.y;
  }
}
template <class T, int kV> __device__ __forceinline__ void store_part(void* base, int64_t off, const float (&x)[kV]) {
  T* p = static_cast<T*>(base) + off;
  if constexpr (kV == 1) {
    if constexpr (std::is_same_v<T, float>) p[0] = x[0];
    else if constexpr (std::is_same_v<T, __nv_bfloat16>) p[0] = __float2bfloat16_rn(x[0]);
    else p[0] = __float2half_rn(x[0]);
  } else if constexpr (std::is_same_v<T, float>) {
    *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
  } else {
    *reinterpret_cast<uint2*>(p) = make_uint2(pack2<T>(x[0], x[1]), pack2<T>(x[2], x[3]));
  }
}

// kParts parts of kV elements a lane cover a chunk of 128 elements of a row (D = 256: two chunks).
template <int kV> constexpr int kParts = 4 / kV;

// delta = rowsum(dO * O) for kWarpRows rows a warp, every load of the rows issued before the first
// product. With heads fastest and 32-bit row indices: 2.55 TB/s on an H200, against 2.25 for one
// row a warp in scalar loads (docs/KERNELS.md, "Row kernels"); what holds it there is not known.
template <class T, class TO, int kV>
__global__ void __launch_bounds__(kRowWarps * 32, 4) delta_kernel(const __grid_constant__ DeltaParams p, int64_t rows) {
  constexpr int kP = kParts<kV>;
  const int lane = threadIdx.x % 32;
  const int64_t first = warp_first_row<kWarpRows>();
  int64_t oo[kWarpRows], od[kWarpRows];
  warp_row_offsets(p.o, p.d_o, p.heads, p.seqlen, rows, first, oo, od);
  float sum[kWarpRows] = {};
  for (int c = 0; c < p.head_dim; c += 32 * kV * kP) {
    float o[kWarpRows][kP][kV], g[kWarpRows][kP][kV];
#pragma unroll
    for (int k = 0; k < kWarpRows; ++k)
#pragma unroll
      for (int q = 0; q < kP; ++q) {
        const int d = c + kV * (lane + 32 * q);
        if (first + k < rows && d < p.head_dim) {
          load_part<TO, kV>(p.o.data, oo[k] + d, o[k][q]);
          load_part<T, kV>(p.d_o.data, od[k] + d, g[k][q]);
        } else {
#pragma unroll
          for (int e = 0; e < kV; ++e) o[k][q][e] = g[k][q][e] = 0.f;
        }
      }
#pragma unroll
    for (int k = 0; k < kWarpRows; ++k)
#pragma unroll
      for (int q = 0; q < kP; ++q)
#pragma unroll
        for (int e = 0; e < kV; ++e) sum[k] += o[k][q][e] * g[k][q][e];
  }
  // This warp's share of the buffer to clear (p.zero: 16-byte units, split evenly over the grid's
  // warps), stored while its loads are in flight.
  if (p.zero_bytes > 0) {
    const uint64_t units = p.zero_bytes / 16, warps = uint64_t(gridDim.x) * kRowWarps;
    const uint64_t per = (units + warps - 1) / warps, w = uint64_t(blockIdx.x) * kRowWarps + threadIdx.x / 32;
    const uint64_t end = min(units, (w + 1) * per);
    for (uint64_t u = w * per + uint64_t(lane); u < end; u += 32) static_cast<uint4*>(p.zero)[u] = make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int k = 0; k < kWarpRows; ++k)
#pragma unroll
    for (int x = 16; x > 0; x >>= 1) sum[k] += __shfl_xor_sync(kFullMask, sum[k], x);
  if (lane < kWarpRows) { // lane k writes row k
    const RowIndex r = row_index(p.heads, p.seqlen, rows, first + lane);
    float x = sum[0];
#pragma unroll
    for (int k = 1; k < kWarpRows; ++k) x = lane == k ? sum[k] : x;
    if (r.valid) p.delta.data[r.b * p.delta.batch_stride + r.h * p.delta.head_stride + r.i] = x * p.descale_do;
  }
}

// TO: float merges back into o_acc; bf16 or half writes the rounded result into o_out.
template <class TO, int kV> __device__ void merge_row(const MergeParams& p, const RowIndex& r) {
  const int lane = threadIdx.x % 32;
  float* lse_acc = p.lse_acc.data + r.b * p.lse_acc.batch_stride + r.h * p.lse_acc.head_stride + r.i;
  const float la = *lse_acc;
  const float lp = p.lse_part.data[r.b * p.lse_part.batch_stride + r.h * p.lse_part.head_stride + r.i];
  const int64_t oa = row_offset(p.o_acc, r), op = row_offset(p.o_part, r);
  const int64_t oo = std::is_same_v<TO, float> ? oa : row_offset(p.o_out, r);
  const float hi = fmaxf(la, lp);
  float lse = -INFINITY, wa = 0.f, wp = 0.f; // neither side saw a key: (0, -inf)
  if (hi != -INFINITY) {
    lse = hi + log1pf(expf(fminf(la, lp) - hi)); // logaddexp, the smaller side through log1p
    wa = la == -INFINITY ? 0.f : expf(la - lse);
    wp = lp == -INFINITY ? 0.f : expf(lp - lse);
  }
#pragma unroll 2
  for (int d = kV * lane; d < p.head_dim; d += 32 * kV) {
    float a[kV], b[kV];
    load_part<float, kV>(p.o_acc.data, oa + d, a);
    load_part<float, kV>(p.o_part.data, op + d, b);
#pragma unroll
    for (int e = 0; e < kV; ++e) a[e] = wa * a[e] + wp * b[e];
    if constexpr (std::is_same_v<TO, float>) store_part<float, kV>(p.o_acc.data, oa + d, a);
    else store_part<TO, kV>(p.o_out.data, oo + d, a);
  }
  __syncwarp(); // every lane has read lse_acc before it is replaced
  if (lane == 0) *lse_acc = lse;
}

template <class TO, int kV> __global__ void merge_kernel(const __grid_constant__ MergeParams p, int64_t rows) {
  const RowIndex r = row_index(p.heads, p.seqlen, rows, warp_first_row<1>());
  if (r.valid) merge_row<TO, kV>(p, r);
}

// dst = src (+ add) in TD, kWarpRows rows a warp, their loads issued together (as delta's). 78
// registers and three blocks an SM: capped at 64 registers (four blocks), the 16-bit outputs
// spilled 40 bytes and ran at 3.53 TB/s against 3.69 (a dense ring's fwd+bwd: docs/KERNELS.md,
// "Row kernels").
template <class TD, int kV, bool kAdd>
__global__ void __launch_bounds__(kRowWarps * 32) convert_kernel(const __grid_constant__ ConvertParams p, int64_t rows) {
  constexpr int kP = kParts<kV>;
  const int lane = threadIdx.x % 32;
  const int64_t first = warp_first_row<kWarpRows>();
  int64_t os[kWarpRows], od[kWarpRows], oa[kWarpRows];
  warp_row_offsets(p.src, p.dst, p.heads, p.seqlen, rows, first, os, od);
  if constexpr (kAdd) warp_row_offsets(p.add, p.dst, p.heads, p.seqlen, rows, first, oa, od);
  for (int c = 0; c < p.head_dim; c += 32 * kV * kP) {
    float x[kWarpRows][kP][kV];
#pragma unroll
    for (int k = 0; k < kWarpRows; ++k)
#pragma unroll
      for (int q = 0; q < kP; ++q) {
        const int d = c + kV * (lane + 32 * q);
        if (first + k < rows && d < p.head_dim) load_part<float, kV>(p.src.data, os[k] + d, x[k][q]);
      }
    if constexpr (kAdd) {
#pragma unroll
      for (int k = 0; k < kWarpRows; ++k)
#pragma unroll
        for (int q = 0; q < kP; ++q) {
          const int d = c + kV * (lane + 32 * q);
          float y[kV];
          if (first + k < rows && d < p.head_dim) {
            load_part<float, kV>(p.add.data, oa[k] + d, y);
#pragma unroll
            for (int e = 0; e < kV; ++e) x[k][q][e] += y[e];
          }
        }
    }
#pragma unroll
    for (int k = 0; k < kWarpRows; ++k)
#pragma unroll
      for (int q = 0; q < kP; ++q) {
        const int d = c + kV * (lane + 32 * q);
        if (first + k < rows && d < p.head_dim) store_part<TD, kV>(p.dst.data, od[k] + d, x[k][q]);
      }
  }
}

// max |x| into *amax: warps stride over groups of kWarpRows rows, a block takes the largest of its
// warps', and one integer atomic max a block (non-negative floats order as their bits) adds it.
// One atomic a warp, 524K on one address for a bf16 [4, 16384, 32, 128] tensor, took 0.52 ms; one
// a block, 0.28 (still under a third of the bytes' rate: docs/KERNELS.md, "FP8 backward"). fmaxf
// drops a NaN operand, so rows a caller never wrote do not count.
constexpr int kAmaxBlocks = 1024;
template <class T, int kV>
__global__ void __launch_bounds__(kRowWarps * 32) amax_kernel(const __grid_constant__ AmaxParams p, int64_t rows) {
  constexpr int kP = kParts<kV>;
  __shared__ float warp_max[kRowWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t stride = int64_t(gridDim.x) * kRowWarps * kWarpRows;
  float most = 0.f;
  for (int64_t first = warp_first_row<kWarpRows>(); first < rows; first += stride) {
    int64_t ox[kWarpRows], same[kWarpRows];
    warp_row_offsets(p.x, p.x, p.heads, p.seqlen, rows, first, ox, same);
    for (int c = 0; c < p.head_dim; c += 32 * kV * kP)
#pragma unroll
      for (int k = 0; k < kWarpRows; ++k)
#pragma unroll
        for (int q = 0; q < kP; ++q) {
          const int d = c + kV * (lane + 32 * q);
          if (first + k >= rows || d >= p.head_dim) continue;
          float x[kV];
          load_part<T, kV>(p.x.data, ox[k] + d, x);
#pragma unroll
          for (int e = 0; e < kV; ++e) most = fmaxf(most, fabsf(x[e]));
        }
  }
#pragma unroll
  for (int x = 16; x > 0; x >>= 1) most = fmaxf(most, __shfl_xor_sync(kFullMask, most, x));
  if (lane == 0) warp_max[warp] = most;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kRowWarps; ++w) most = fmaxf(most, warp_max[w]);
    if (most > 0.f) atomicMax(reinterpret_cast<unsigned*>(p.amax), __float_as_uint(most));
  }
}

// The same over a packed tensor (rows back to back) as one run of 16-byte words, four in flight a
// thread: the row walk above reached about 1 TB/s on an H200 (docs/KERNELS.md, "FP8 backward").
template <class T>
__global__ void __launch_bounds__(256) amax_packed_kernel(const uint4* x, int64_t words, float* amax) {
  constexpr int kUnroll = 4, kPerWord = 16 / int(sizeof(T));
  __shared__ float warp_max[8];
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  float most = 0.f;
  for (int64_t w = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; w < words; w += kUnroll * step) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = w + u * step < words ? x[w + u * step] : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const T* e = reinterpret_cast<const T*>(&v[u]);
#pragma unroll
      for (int i = 0; i < kPerWord; ++i) most = fmaxf(most, fabsf(float(e[i])));
    }
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) most = fmaxf(most, __shfl_xor_sync(kFullMask, most, o));
  if (lane == 0) warp_max[warp] = most;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < int(blockDim.x) / 32; ++i) most = fmaxf(most, warp_max[i]);
    if (most > 0.f) atomicMax(reinterpret_cast<unsigned*>(amax), __float_as_uint(most));
  }
}

// Whether t's rows lie back to back from a 16-byte boundary, a whole number of 16-byte words.
bool packed_words(const TensorRef& t, int32_t heads, int32_t head_dim, int64_t seqlen, int32_t batch, size_t bytes) {
  const int64_t row = int64_t(heads) * head_dim;
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && t.head_stride == head_dim && t.token_stride == row &&
         (batch == 1 || t.batch_stride == seqlen * row) && (int64_t(batch) * seqlen * row * int64_t(bytes)) % 16 == 0;
}

dim3 row_grid(int64_t rows, int rows_per_warp) {
  const int64_t per_block = int64_t(kRowWarps) * rows_per_warp;
  return dim3(unsigned((rows + per_block - 1) / per_block));
}

void check_rows(int32_t batch, int32_t heads, int32_t head_dim, int64_t seqlen, const char* op) {
  if (batch < 1 || heads < 1 || head_dim < 1 || seqlen < 0)
    fail(std::string(op) + ": batch, heads and head_dim must be positive, seqlen non-negative");
}

// Whether every row of these tensors starts on a 4-element boundary (bytes: an element's size),
// so that a lane may take 4 elements in one access.
bool rows_aligned4(const TensorRef& t, size_t bytes) {
  return reinterpret_cast<uintptr_t>(t.data) % (4 * bytes) == 0 && t.batch_stride % 4 == 0 &&
         t.token_stride % 4 == 0 && t.head_stride % 4 == 0;
}

// Launches kernel<4> where every row is 4-element aligned, else kernel<1>; rows_per_warp: the
// kernels' (kWarpRows, or 1 for merge).
template <class K4, class K1, class... Args>
void launch_rows(bool aligned, K4 k4, K1 k1, int64_t rows, int rows_per_warp, cudaStream_t s, const Args&... args) {
  const dim3 grid = row_grid(rows, rows_per_warp);
  if (aligned) k4<<<grid, kRowWarps * 32, 0, s>>>(args..., rows);
  else k1<<<grid, kRowWarps * 32, 0, s>>>(args..., rows);
}

} // namespace
} // namespace cuda

using namespace cuda;

void forward_cuda(const ForwardParams& params, void* stream) {
  ForwardParams p = params;
  p.softmax_scale = resolve_scale(p.softmax_scale, p.head_dim);
  check_shape(p.dtype, p.batch, p.heads_q, p.heads_kv, p.head_dim, p.seqlen_q, p.seqlen_kv, p.softmax_scale,
              p.segments, p.num_segments, p.blocks, false);
  if (p.seqlen_q == 0) return;
  check_tensor(p.q, false, "q");
  check_tensor(p.k, false, "k");
  check_tensor(p.v, false, "v");
  check_tensor(p.o, p.o_fp32, "o");
  if (!p.lse.data) fail("lse is null");
  if (p.o_prior.data) {
    check_tensor(p.o_prior, true, "o_prior");
    if (!p.lse_prior.data) fail("lse_prior is null where o_prior is given");
    if (p.o.data == p.o_prior.data && !p.o_fp32) fail("o may be o_prior itself only in fp32 (o_fp32)");
  }
  const auto s = static_cast<cudaStream_t>(stream);
  if (is_fp8(p.dtype)) dispatch_forward_fp8(p, s);
  else if (p.dtype == DType::bf16) dispatch_forward<__nv_bfloat16>(p, s);
  else dispatch_forward<__half>(p, s);
}

void backward_cuda(const BackwardParams& params, void* stream) {
  BackwardParams p = params;
  p.softmax_scale = resolve_scale(p.softmax_scale, p.head_dim);
  check_shape(p.dtype, p.batch, p.heads_q, p.heads_kv, p.head_dim, p.seqlen_q, p.seqlen_kv, p.softmax_scale,
              p.segments, p.num_segments, p.blocks, true);
  if (p.write_grads) fail("backward: the native kernels add into fp32 accumulators (write_grads is the cuDNN engine's)");
  if (p.write_dkdv && p.seqlen_q == 0)
    fail("backward: write_dkdv needs a call with queries (it writes its keys' dK and dV)");
  if (p.write_dkdv_fp32 && !p.write_dkdv) fail("backward: write_dkdv_fp32 goes with write_dkdv");
  if (std::string why = check_supported_do(p.dtype, p.dtype_do); !why.empty()) throw Error(why);  // (prefixed)
  if (std::string why = check_grad_addend(p); !why.empty()) throw Error(why);
  if (p.seqlen_q == 0) return;
  if (p.seqlen_kv == 0) { // no adds: dq_out is dq as it was
    if (p.dq_out.data) convert_cuda(dq_out_conversion(p), stream);
    return;
  }
  if (is_fp8(p.dtype)) check_fp8_inputs({&p.q, &p.k, &p.v, &p.d_o}, "FP8 q, k, v and d_o");
  if (p.dk_add.data) {
    check_tensor(p.dk_add, true, "dk_add");
    check_tensor(p.dv_add, true, "dv_add");
  }
  check_tensor(p.q, false, "q");
  check_tensor(p.k, false, "k");
  check_tensor(p.v, false, "v");
  check_tensor(p.d_o, false, "d_o");
  check_tensor(p.dq, true, "dq");
  if (p.dq_out.data) check_tensor(p.dq_out, false, "dq_out");
  check_tensor(p.dk, !p.write_dkdv || p.write_dkdv_fp32, "dk");
  check_tensor(p.dv, !p.write_dkdv || p.write_dkdv_fp32, "dv");
  if (!p.lse.data || !p.delta.data) fail("lse or delta is null");
  const auto s = static_cast<cudaStream_t>(stream);
  bool dq_written = false;
#if ATTNCORE_HAVE_SM90
  // e4m3 products where they serve (Q widened for the two bf16 products, K in the kernel, dO^T in dO's slot).
  if (is_fp8(p.dtype) && sm90::hopper_path_enabled() && sm90::fp8_products_serve(p))
    dq_written = sm90::launch_backward_sm90_fp8<128>(p, widened_backward(p, s, WidenFor::fp8_products), s);
  else
#endif
  if (is_fp8(p.dtype)) dq_written = dispatch_backward<__nv_bfloat16>(widened_backward(p, s), s);
  else if (p.dtype == DType::bf16) dq_written = dispatch_backward<__nv_bfloat16>(p, s);
  else dq_written = dispatch_backward<__half>(p, s);
  if (p.dq_out.data && !dq_written) convert_cuda(dq_out_conversion(p), stream);
}

const char* native_kernels() {
#if ATTNCORE_HAVE_SM90
  if (sm90::hopper_path_enabled()) return "wgmma";
#endif
  return "mma.sync";
}

void compute_delta_cuda(const DeltaParams& p, void* stream) {
  if (p.dtype != DType::bf16 && p.dtype != DType::fp16 && !is_fp8(p.dtype))
    fail("compute_delta: dtype must be bf16, fp16 or FP8");
  check_rows(p.batch, p.heads, p.head_dim, p.seqlen, "compute_delta");
  if (p.zero_bytes > 0 && !p.zero) fail("compute_delta: zero is null");
  const auto s = static_cast<cudaStream_t>(stream);
  DeltaParams call = p;
  // What the kernel cannot clear in 16-byte stores (or a call without rows) is cleared apart.
  const bool whole_units = call.zero_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(call.zero) % 16 == 0;
  if (call.zero_bytes > 0 && (p.seqlen == 0 || !whole_units)) {
    const cudaError_t e = cudaMemsetAsync(call.zero, 0, call.zero_bytes, s);
    if (e != cudaSuccess) fail(std::string("compute_delta: clearing zero failed: ") + cudaGetErrorString(e));
    call.zero = nullptr;
    call.zero_bytes = 0;
  }
  if (p.seqlen == 0) return;
  if (!p.o.data || !p.d_o.data || !p.delta.data) fail("compute_delta: a pointer is null");
  const int64_t rows = int64_t(p.batch) * p.heads * p.seqlen;
  const bool v4 = p.head_dim % 4 == 0 && rows_aligned4(p.o, p.o_fp32 ? 4 : 2) && rows_aligned4(p.d_o, dtype_bytes(p.dtype));
  // (The dO element type, then O's: fp32 for a ring's partial; an FP8 call's O is bf16.)
  const auto launch = [&](auto k4, auto k1) { launch_rows(v4, k4, k1, rows, kWarpRows, s, call); };
  using bf16 = __nv_bfloat16;
  using e4m3 = __nv_fp8_e4m3;
  using e5m2 = __nv_fp8_e5m2;
  if (p.dtype == DType::fp8_e4m3 && p.o_fp32) launch(delta_kernel<e4m3, float, 4>, delta_kernel<e4m3, float, 1>);
  else if (p.dtype == DType::fp8_e4m3) launch(delta_kernel<e4m3, bf16, 4>, delta_kernel<e4m3, bf16, 1>);
  else if (p.dtype == DType::fp8_e5m2 && p.o_fp32) launch(delta_kernel<e5m2, float, 4>, delta_kernel<e5m2, float, 1>);
  else if (p.dtype == DType::fp8_e5m2) launch(delta_kernel<e5m2, bf16, 4>, delta_kernel<e5m2, bf16, 1>);
  else if (p.dtype == DType::bf16 && p.o_fp32) launch(delta_kernel<bf16, float, 4>, delta_kernel<bf16, float, 1>);
  else if (p.dtype == DType::bf16) launch(delta_kernel<bf16, bf16, 4>, delta_kernel<bf16, bf16, 1>);
  else if (p.o_fp32) launch(delta_kernel<__half, float, 4>, delta_kernel<__half, float, 1>);
  else launch(delta_kernel<__half, __half, 4>, delta_kernel<__half, __half, 1>);
  check_launch("compute_delta");
}

void merge_partial_cuda(const MergeParams& p, void* stream) {
  check_rows(p.batch, p.heads, p.head_dim, p.seqlen, "merge_partial");
  if (p.seqlen == 0) return;
  if (!p.o_acc.data || !p.o_part.data || !p.lse_acc.data || !p.lse_part.data) fail("merge_partial: a pointer is null");
  if (p.o_out.data && p.out_dtype != DType::bf16 && p.out_dtype != DType::fp16)
    fail("merge_partial: out_dtype must be bf16 or fp16");
  const int64_t rows = int64_t(p.batch) * p.heads * p.seqlen;
  const bool v4 = p.head_dim % 4 == 0 && rows_aligned4(p.o_acc, 4) && rows_aligned4(p.o_part, 4) &&
                  (!p.o_out.data || rows_aligned4(p.o_out, 2));
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (!p.o_out.data) launch_rows(v4, merge_kernel<float, 4>, merge_kernel<float, 1>, rows, 1, s, p);
  else if (p.out_dtype == DType::bf16)
    launch_rows(v4, merge_kernel<__nv_bfloat16, 4>, merge_kernel<__nv_bfloat16, 1>, rows, 1, s, p);
  else launch_rows(v4, merge_kernel<__half, 4>, merge_kernel<__half, 1>, rows, 1, s, p);
  check_launch("merge_partial");
}

void amax_cuda(const AmaxParams& p, void* stream) {
  if (p.dtype != DType::bf16 && p.dtype != DType::fp16 && p.dtype != DType::fp32)
    fail("amax: dtype must be bf16, fp16 or fp32");
  check_rows(p.batch, p.heads, p.head_dim, p.seqlen, "amax");
  if (!p.amax || (p.seqlen > 0 && !p.x.data)) fail("amax: a pointer is null");
  const auto s = static_cast<cudaStream_t>(stream);
  if (const cudaError_t e = cudaMemsetAsync(p.amax, 0, sizeof(float), s); e != cudaSuccess)
    fail(std::string("amax: clearing the result failed: ") + cudaGetErrorString(e));
  if (p.seqlen == 0) return;
  const int64_t rows = int64_t(p.batch) * p.heads * p.seqlen;
  if (packed_words(p.x, p.heads, p.head_dim, p.seqlen, p.batch, dtype_bytes(p.dtype))) {
    const int64_t words = rows * p.head_dim * dtype_bytes(p.dtype) / 16;
    const unsigned blocks = unsigned(std::min<int64_t>((words + 4 * 256 - 1) / (4 * 256), 2 * kAmaxBlocks));
    const auto x = static_cast<const uint4*>(p.x.data);
    if (p.dtype == DType::bf16) amax_packed_kernel<__nv_bfloat16><<<blocks, 256, 0, s>>>(x, words, p.amax);
    else if (p.dtype == DType::fp16) amax_packed_kernel<__half><<<blocks, 256, 0, s>>>(x, words, p.amax);
    else amax_packed_kernel<float><<<blocks, 256, 0, s>>>(x, words, p.amax);
    return check_launch("amax");
  }
  const bool v4 = p.head_dim % 4 == 0 && rows_aligned4(p.x, dtype_bytes(p.dtype));
  const dim3 grid(std::min(row_grid(rows, kWarpRows).x, unsigned(kAmaxBlocks)));
  const auto launch = [&](auto k4, auto k1) {
    if (v4) k4<<<grid, kRowWarps * 32, 0, s>>>(p, rows);
    else k1<<<grid, kRowWarps * 32, 0, s>>>(p, rows);
  };
  switch (p.dtype) {
  case DType::bf16: launch(amax_kernel<__nv_bfloat16, 4>, amax_kernel<__nv_bfloat16, 1>); break;
  case DType::fp16: launch(amax_kernel<__half, 4>, amax_kernel<__half, 1>); break;
  default: launch(amax_kernel<float, 4>, amax_kernel<float, 1>); break;
  }
  check_launch("amax");
}

void convert_cuda(const ConvertParams& p, void* stream) {
  check_rows(p.batch, p.heads, p.head_dim, p.seqlen, "convert");
  if (p.seqlen == 0) return;
  if (!p.src.data || !p.dst.data) fail("convert: a pointer is null");
  const int64_t rows = int64_t(p.batch) * p.heads * p.seqlen;
  const auto s = static_cast<cudaStream_t>(stream);
  const bool add = p.add.data != nullptr;
  const bool v4 = p.head_dim % 4 == 0 && rows_aligned4(p.src, 4) && (!add || rows_aligned4(p.add, 4)) &&
                  rows_aligned4(p.dst, p.dtype == DType::fp32 ? 4 : 2);
  const auto launch = [&](auto type) {
    using T = decltype(type);
    if (add) launch_rows(v4, convert_kernel<T, 4, true>, convert_kernel<T, 1, true>, rows, kWarpRows, s, p);
    else launch_rows(v4, convert_kernel<T, 4, false>, convert_kernel<T, 1, false>, rows, kWarpRows, s, p);
  };
  switch (p.dtype) {
  case DType::bf16: launch(__nv_bfloat16{}); break;
  case DType::fp16: launch(__half{}); break;
  case DType::fp32: launch(float{}); break;
  default: fail("convert: dtype must be bf16, fp16 or fp32");
  }
  check_launch("convert");
}

} // namespace attncore
