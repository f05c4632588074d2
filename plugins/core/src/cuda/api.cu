// The public CUDA entry points (attncore/cuda.h): validation on the host, dispatch to the
// per-head-dim launchers, and the small row-wise kernels (delta, merge, convert).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "attncore/cuda.h"
#include "device.cuh"
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
  if (std::string e = check_supported(dtype, head_dim); !e.empty()) throw Error(e);
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
template <class T> void dispatch_backward(const BackwardParams& p, cudaStream_t s) {
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
  case 64: return launch_backward<T, 64>(p, s);
  case 80: return launch_backward<T, 80>(p, s);
  case 96: return launch_backward<T, 96>(p, s);
  case 128: return launch_backward<T, 128>(p, s);
  case 256: return launch_backward<T, 256>(p, s);
  }
}

// ---- row-wise kernels: one warp per (batch, head, row) ------------------------------------------

constexpr int kRowWarps = 8;

struct RowIndex {
  int64_t b, h, i;
  bool valid;
};
__device__ RowIndex row_index(int32_t heads, int64_t seqlen, int64_t rows) {
  const int64_t row = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  const int64_t bh = row / seqlen;
  return RowIndex{bh / heads, bh % heads, row % seqlen, row < rows};
}

template <class T> __device__ __forceinline__ float load_elem(const void* base, int64_t off) {
  if constexpr (std::is_same_v<T, float>) return static_cast<const float*>(base)[off];
  else return float(static_cast<const T*>(base)[off]);
}

template <class T, class TO>
__global__ void delta_kernel(const __grid_constant__ DeltaParams p, int64_t rows) {
  const RowIndex r = row_index(p.heads, p.seqlen, rows);
  if (!r.valid) return;
  const int lane = threadIdx.x % 32;
  const int64_t oo = r.b * p.o.batch_stride + r.i * p.o.token_stride + r.h * p.o.head_stride;
  const int64_t od = r.b * p.d_o.batch_stride + r.i * p.d_o.token_stride + r.h * p.d_o.head_stride;
  float sum = 0.f;
  for (int d = lane; d < p.head_dim; d += 32) sum += load_elem<TO>(p.o.data, oo + d) * load_elem<T>(p.d_o.data, od + d);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kFullMask, sum, o);
  if (lane == 0) p.delta.data[r.b * p.delta.batch_stride + r.h * p.delta.head_stride + r.i] = sum;
}

__global__ void merge_kernel(const __grid_constant__ MergeParams p, int64_t rows) {
  const RowIndex r = row_index(p.heads, p.seqlen, rows);
  if (!r.valid) return;
  const int lane = threadIdx.x % 32;
  float* lse_acc = p.lse_acc.data + r.b * p.lse_acc.batch_stride + r.h * p.lse_acc.head_stride + r.i;
  const float la = *lse_acc;
  const float lp = p.lse_part.data[r.b * p.lse_part.batch_stride + r.h * p.lse_part.head_stride + r.i];
  float* o = static_cast<float*>(p.o_acc.data) + r.b * p.o_acc.batch_stride + r.i * p.o_acc.token_stride +
             r.h * p.o_acc.head_stride;
  const float* op = static_cast<const float*>(p.o_part.data) + r.b * p.o_part.batch_stride +
                    r.i * p.o_part.token_stride + r.h * p.o_part.head_stride;
  const float hi = fmaxf(la, lp);
  float lse = -INFINITY, wa = 0.f, wp = 0.f; // neither side saw a key: (0, -inf)
  if (hi != -INFINITY) {
    lse = hi + log1pf(expf(fminf(la, lp) - hi)); // logaddexp, the smaller side through log1p
    wa = la == -INFINITY ? 0.f : expf(la - lse);
    wp = lp == -INFINITY ? 0.f : expf(lp - lse);
  }
  for (int d = lane; d < p.head_dim; d += 32) o[d] = wa * o[d] + wp * op[d];
  __syncwarp(); // every lane has read lse_acc before it is replaced
  if (lane == 0) *lse_acc = lse;
}

template <class TD> __global__ void convert_kernel(const __grid_constant__ ConvertParams p, int64_t rows) {
  const RowIndex r = row_index(p.heads, p.seqlen, rows);
  if (!r.valid) return;
  const int lane = threadIdx.x % 32;
  const float* src = static_cast<const float*>(p.src.data) + r.b * p.src.batch_stride + r.i * p.src.token_stride +
                     r.h * p.src.head_stride;
  TD* dst = static_cast<TD*>(p.dst.data) + r.b * p.dst.batch_stride + r.i * p.dst.token_stride + r.h * p.dst.head_stride;
  for (int d = lane; d < p.head_dim; d += 32) {
    if constexpr (std::is_same_v<TD, float>) dst[d] = src[d];
    else if constexpr (std::is_same_v<TD, __nv_bfloat16>) dst[d] = __float2bfloat16_rn(src[d]);
    else dst[d] = __float2half_rn(src[d]);
  }
}

dim3 row_grid(int64_t rows) { return dim3(unsigned((rows + kRowWarps - 1) / kRowWarps)); }

void check_rows(int32_t batch, int32_t heads, int32_t head_dim, int64_t seqlen, const char* op) {
  if (batch < 1 || heads < 1 || head_dim < 1 || seqlen < 0)
    fail(std::string(op) + ": batch, heads and head_dim must be positive, seqlen non-negative");
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
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::bf16) dispatch_forward<__nv_bfloat16>(p, s);
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
  if (p.seqlen_q == 0 || p.seqlen_kv == 0) return;
  check_tensor(p.q, false, "q");
  check_tensor(p.k, false, "k");
  check_tensor(p.v, false, "v");
  check_tensor(p.d_o, false, "d_o");
  check_tensor(p.dq, true, "dq");
  check_tensor(p.dk, !p.write_dkdv || p.write_dkdv_fp32, "dk");
  check_tensor(p.dv, !p.write_dkdv || p.write_dkdv_fp32, "dv");
  if (!p.lse.data || !p.delta.data) fail("lse or delta is null");
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.dtype == DType::bf16) dispatch_backward<__nv_bfloat16>(p, s);
  else dispatch_backward<__half>(p, s);
}

const char* native_kernels() {
#if ATTNCORE_HAVE_SM90
  if (sm90::hopper_path_enabled()) return "wgmma";
#endif
  return "mma.sync";
}

void compute_delta_cuda(const DeltaParams& p, void* stream) {
  if (p.dtype != DType::bf16 && p.dtype != DType::fp16) fail("compute_delta: dtype must be bf16 or fp16");
  check_rows(p.batch, p.heads, p.head_dim, p.seqlen, "compute_delta");
  if (p.seqlen == 0) return;
  if (!p.o.data || !p.d_o.data || !p.delta.data) fail("compute_delta: a pointer is null");
  const int64_t rows = int64_t(p.batch) * p.heads * p.seqlen;
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid = row_grid(rows);
  if (p.dtype == DType::bf16) {
    if (p.o_fp32) delta_kernel<__nv_bfloat16, float><<<grid, kRowWarps * 32, 0, s>>>(p, rows);
    else delta_kernel<__nv_bfloat16, __nv_bfloat16><<<grid, kRowWarps * 32, 0, s>>>(p, rows);
  } else {
    if (p.o_fp32) delta_kernel<__half, float><<<grid, kRowWarps * 32, 0, s>>>(p, rows);
    else delta_kernel<__half, __half><<<grid, kRowWarps * 32, 0, s>>>(p, rows);
  }
  check_launch("compute_delta");
}

void merge_partial_cuda(const MergeParams& p, void* stream) {
  check_rows(p.batch, p.heads, p.head_dim, p.seqlen, "merge_partial");
  if (p.seqlen == 0) return;
  if (!p.o_acc.data || !p.o_part.data || !p.lse_acc.data || !p.lse_part.data) fail("merge_partial: a pointer is null");
  const int64_t rows = int64_t(p.batch) * p.heads * p.seqlen;
  merge_kernel<<<row_grid(rows), kRowWarps * 32, 0, static_cast<cudaStream_t>(stream)>>>(p, rows);
  check_launch("merge_partial");
}

void convert_cuda(const ConvertParams& p, void* stream) {
  check_rows(p.batch, p.heads, p.head_dim, p.seqlen, "convert");
  if (p.seqlen == 0) return;
  if (!p.src.data || !p.dst.data) fail("convert: a pointer is null");
  const int64_t rows = int64_t(p.batch) * p.heads * p.seqlen;
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid = row_grid(rows);
  switch (p.dtype) {
  case DType::bf16: convert_kernel<__nv_bfloat16><<<grid, kRowWarps * 32, 0, s>>>(p, rows); break;
  case DType::fp16: convert_kernel<__half><<<grid, kRowWarps * 32, 0, s>>>(p, rows); break;
  case DType::fp32: convert_kernel<float><<<grid, kRowWarps * 32, 0, s>>>(p, rows); break;
  default: fail("convert: dtype must be bf16, fp16 or fp32");
  }
  check_launch("convert");
}

} // namespace attncore
