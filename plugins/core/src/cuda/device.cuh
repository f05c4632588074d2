// The device vocabulary of the native kernels: element types, async copies, ldmatrix, the
// m16n8k16 tensor-core product, and the warp reductions of the online softmax. Each kernel is
// written in these words so that it reads as its algorithm.
//
// Fragment layouts (PTX ISA, mma.m16n8k16, 32 lanes; g = lane / 4, t = lane % 4):
//   A 16x16 (4 regs of 2 halves): a0 (g, 2t..), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B 16x8  (2 regs):             b0 (k 2t.., n g), b1 (k 2t+8.., n g)
//   C 16x8  (4 floats):           c0,c1 (g, 2t, 2t+1), c2,c3 (g+8, 2t, 2t+1)
// Two adjacent C tiles (columns 0-7 and 8-15) hold exactly an A fragment of those 16 columns, so a
// score tile becomes the A operand of the next product without leaving registers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "attncore/attention.h"
#include "smem_tile.h"

namespace attncore::cuda {

constexpr float kLog2e = 1.4426950408889634f; // exp(x) = exp2(x log2 e): ex2 is one instruction
constexpr float kLn2 = 0.6931471805599453f;
constexpr unsigned kFullMask = 0xffffffffu;

// ---- element types -------------------------------------------------------------------------

// Two floats rounded (nearest even) into one 32-bit register of two 16-bit elements, lo first.
template <class T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Two consecutive floats added atomically (one vector atomic on sm_90, two scalar ones before).
__device__ __forceinline__ void atomic_add2(float* p, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(x, y));
#else
  atomicAdd(p, x);
  atomicAdd(p + 1, y);
#endif
}

// How a backward puts dK and dV out: added into fp32 accumulators, or written (in the input dtype
// or in fp32) where the call alone makes its keys' gradients.
enum class GradOut : uint8_t { add_fp32, write_dtype, write_fp32 };

// A lane's part of an m16 tile of a key block's dK or dV, in the mma accumulator layout (x[j][2 hh + e]
// is row `row` + 8 hh, column `col` + 8 j + e of head `head` of `g`; rows from `row_end` on are not
// the region's): added into fp32 accumulators, or written (in T or fp32) where the call owns them
// (GradOut, BackwardParams::write_dkdv). The mode is decided once a tile and each pair is read from
// the accumulators themselves (scale them in place first). Decided at every pair, nvcc branched at
// every pair and passed each through the same two registers, so each atomic waited for the one
// before it to read its operands: 8.7% of the Hopper backward's stall samples on 2048-row causal
// calls (ncu; docs/KERNELS.md, "dK and dV stores").
template <class T, int kTiles>
__device__ __forceinline__ void put_grad_tile(const TensorRef& g, int batch, int head, int32_t row,
                                              int32_t row_end, int col, const float (&x)[kTiles][4], GradOut out) {
  int64_t at[2]; // the element offsets of the two rows' first columns
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
    at[hh] = batch * g.batch_stride + head * g.head_stride + int64_t(row + 8 * hh) * g.token_stride + col;
  const auto each = [&](auto put) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
      if (row + 8 * hh < row_end)
#pragma unroll
        for (int j = 0; j < kTiles; ++j) put(at[hh] + j * 8, x[j][2 * hh], x[j][2 * hh + 1]);
  };
  if (out == GradOut::add_fp32)
    each([&](int64_t off, float a, float b) { atomic_add2(static_cast<float*>(g.data) + off, a, b); });
  else if (out == GradOut::write_fp32)
    each([&](int64_t off, float a, float b) {
      *reinterpret_cast<float2*>(static_cast<float*>(g.data) + off) = make_float2(a, b);
    });
  else
    each([&](int64_t off, float a, float b) { *reinterpret_cast<uint32_t*>(static_cast<T*>(g.data) + off) = pack2<T>(a, b); });
}

// Adds rows [lo, hi) of `add` (fp32, laid out as the gradient) to a lane's part of an m16 tile, in
// put_grad_tile's layout, before it is written: the shares of these keys that other calls made
// (BackwardParams::dk_add). Null data: nothing.
template <int kTiles>
__device__ __forceinline__ void add_grad_tile(const TensorRef& add, int batch, int head, int32_t row, int32_t lo,
                                              int32_t hi, int col, float (&x)[kTiles][4]) {
  if (!add.data) return;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int32_t r = row + 8 * hh;
    if (r < lo || r >= hi) continue;
    const float* at = static_cast<const float*>(add.data) + batch * add.batch_stride + head * add.head_stride +
                      int64_t(r) * add.token_stride + col;
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const float2 v = *reinterpret_cast<const float2*>(at + j * 8);
      x[j][2 * hh] += v.x;
      x[j][2 * hh + 1] += v.y;
    }
  }
}

template <class T> __device__ __forceinline__ float2 unpack2(uint32_t x);
template <> __device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t x) {
  return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&x));
}
template <> __device__ __forceinline__ float2 unpack2<__half>(uint32_t x) {
  return __half22float2(*reinterpret_cast<__half2*>(&x));
}

// ---- tensor cores ----------------------------------------------------------------------------

// c += a (16x16, row) * b (16x8, col), fp32 accumulate. kFirst: c = a b, the first product of a
// sum, on a zero accumulator that needs no registers cleared.
template <class T, bool kFirst = false>
__device__ __forceinline__ void mma_16x8x16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma_16x8x16<__nv_bfloat16, false>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                                  uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16x8x16<__half, false>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                           uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16x8x16<__nv_bfloat16, true>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                                 uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%10,%10,%10,%10};\n"
               : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));
}
template <>
__device__ __forceinline__ void mma_16x8x16<__half, true>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                          uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%10,%10,%10,%10};\n"
               : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));
}

// The same, c = a b where from_zero, for a choice that unrolling makes constant (the first k-step
// of a fully unrolled loop).
template <class T>
__device__ __forceinline__ void mma_16x8x16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                            bool from_zero) {
  if (from_zero) mma_16x8x16<T, true>(c, a, b0, b1);
  else mma_16x8x16<T, false>(c, a, b0, b1);
}

// ---- shared memory -> registers ----------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

// Four 8x8 matrices; lanes 8i..8i+7 give the row addresses of matrix i (32-bit shared addresses),
// register i receives it.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

// The base of a kernel's dynamic shared memory rounded up to kAlign bytes, which its launch asks for
// beyond its tiles: 128 for the mma.sync kernels' swizzled tiles (smem_tile.h), 1024 for the copy
// engine's 128-byte swizzle (sm90).
constexpr uint32_t kSmemAlign = 128;
template <uint32_t kAlign = kSmemAlign> __device__ __forceinline__ unsigned char* align_smem(unsigned char* p) {
  const uint32_t a = smem_addr(p);
  return p + ((kAlign - a % kAlign) % kAlign);
}

// A fragment (16 x 16 over columns 16j..16j+15) from two C tiles of scores 2j and 2j+1.
template <class T>
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack2<T>(c0[0], c0[1]);
  a[1] = pack2<T>(c0[2], c0[3]);
  a[2] = pack2<T>(c1[0], c1[1]);
  a[3] = pack2<T>(c1[2], c1[3]);
}

// ---- global -> shared, asynchronous ------------------------------------------------------------

// 16 bytes; when !valid nothing is read and the destination is zero-filled.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
// 4 bytes (through L1: .cg copies only 16); when !valid the destination is zero-filled.
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Rows [0, kRows) of a strided global tile into a shared tile (Tile: SmemTile); rows >= valid are
// zero-filled (no NaN from beyond a tensor can reach a product).
template <int kRows, class Tile, int kThreads, class T>
__device__ __forceinline__ void load_tile_async(T* smem, const T* gmem, int64_t row_stride, int valid, int tid) {
  // Each thread copies the same 16-byte column of every kPass-th row: one 64-bit step a chunk, and
  // no row tests on a full tile. (Chunk c = tid + i kThreads, divided per chunk, cost the mma.sync
  // forward 10% of its issued instructions in address arithmetic: ncu.) Where the
  // chunks of a row do not divide the threads (D = 80, 96), the threads past the last whole row idle.
  // Swizzled, the row kPass further has its chunk XOR moved by kPass % 8 (0, or 4 at D = 256 with
  // 128 threads), so every pass is still the first one's offset plus constants.
  constexpr int kChunksPerRow = Tile::kWidth / 8;
  constexpr int kPass = kThreads / kChunksPerRow;
  constexpr int kPasses = (kRows + kPass - 1) / kPass;
  static_assert(kPass > 0, "at least one row a pass");
  static_assert(!Tile::kXor || kPass % 4 == 0, "a pass moves a swizzled row's XOR by 0 or 4");
  const int row = tid / kChunksPerRow, col = (tid % kChunksPerRow) * 8;
  if (kThreads % kChunksPerRow != 0 && row >= kPass) return;
  const T* src = gmem + row * row_stride + col;
  const uint32_t dst = smem_addr(smem) + Tile::offset(row, col);
  const auto copy = [&](auto check_rows) {
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int r = row + i * kPass;
      if (kRows % kPass != 0 && i == kPasses - 1 && r >= kRows) break;
      const bool ok = !decltype(check_rows)::value || r < valid;
      cp_async_16(Tile::pass_offset(dst, i * kPass), ok ? src + i * kPass * row_stride : gmem, ok);
    }
  };
  if (valid >= kRows) copy(std::false_type{});
  else copy(std::true_type{});
}

// ---- arithmetic --------------------------------------------------------------------------------

__device__ __forceinline__ float fast_exp2(float x) { // ex2.approx: exp2(-inf) = +0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Reductions over the 4 lanes (t = 0..3) that share a row of a C fragment.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(kFullMask, x, 1));
  return fmaxf(x, __shfl_xor_sync(kFullMask, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(kFullMask, x, 1);
  return x + __shfl_xor_sync(kFullMask, x, 2);
}

} // namespace attncore::cuda
