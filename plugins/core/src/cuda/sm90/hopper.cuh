// The device vocabulary of the Hopper (sm_90a) kernels: transaction barriers, bulk tensor copies
// (TMA), shared-memory matrix descriptors, the warpgroup matrix fences, and register reallocation.
// With wgmma_ops.cuh (the matrix instructions themselves) each kernel reads as its algorithm.
//
// Shared tiles. Every operand tile is stored as column blocks of kSwizzleCols elements: a
// [rows x cols] tile is cols / W blocks, each [rows x W] with rows of W * 2 bytes, swizzled the way
// the copy engine writes them and the matrix instructions read them (the 16-byte chunk index of a
// row XORed with the row's position in its group of 8). W is 64 (128-byte rows) when the head dim
// allows, else 32 or 16; each tile starts on a 1024-byte boundary.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "../device.cuh"
#include "wgmma_ops.cuh"

namespace attncore::cuda::sm90 {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ATTNCORE_SM90_DEVICE 1
#else
#define ATTNCORE_SM90_DEVICE 0
#endif

// ---- shared tile geometry ------------------------------------------------------------------------

// Elements per swizzled row of a column block for a head dim.
__host__ __device__ constexpr int swizzle_cols(int d) { return d % 64 == 0 ? 64 : d % 32 == 0 ? 32 : 16; }

// The copy engine's swizzle mode and the descriptor's layout type for W columns of 16-bit elements.
constexpr CUtensorMapSwizzle tma_swizzle(int w) {
  return w == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : w == 32 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_32B;
}
__host__ __device__ constexpr uint64_t desc_layout(int w) { return w == 64 ? 1 : w == 32 ? 2 : 3; }

// Byte offset of 16-byte chunk `chunk` of row `row` in a column block of W columns, swizzled as the
// copy engine lays it (the chunk index XORed with address bits 7 and up: the row's position in its
// group of 8 for 128-byte rows, of 4 pairs for 64-byte rows, of 2 quads for 32-byte rows).
template <int W> __host__ __device__ constexpr uint32_t swizzled_offset(int row, int chunk) {
  return uint32_t(row * W * 2 + ((chunk ^ ((row * W * 2 >> 7) & (W / 8 - 1))) * 16));
}

// A shared-memory matrix descriptor (PTX ISA, "matrix descriptor"): start address, leading and
// stride byte offsets (all in 16-byte units), layout type in bits 62-63.
__device__ __forceinline__ uint64_t make_desc(uint32_t smem_addr, uint32_t lead_bytes, uint32_t stride_bytes,
                                              uint64_t layout) {
  return uint64_t((smem_addr & 0x3FFFF) >> 4) | (uint64_t(lead_bytes >> 4) << 16) |
         (uint64_t(stride_bytes >> 4) << 32) | (layout << 62);
}

// Descriptors of a tile are made once and stepped by adding constants: the start address is the
// low field, in 16-byte units, and no step carries out of it (shared memory is under 256 KiB).
__host__ __device__ constexpr uint32_t desc_offset(uint32_t bytes) { return bytes >> 4; }

// K-major operand: rows of the tile are the M or N index, the W columns of a block the K index.
// The descriptor of rows [row0, row0 + 64 or N) at k = 0 of a tile of `rows` rows; k_major_step
// moves it to K columns [k0, k0 + 16).
template <int W> __device__ __forceinline__ uint64_t desc_k_major(const void* tile, int rows, int row0) {
  return make_desc(smem_addr(tile) + uint32_t(row0 * W * 2), 16, 8 * W * 2, desc_layout(W));
}
template <int W> __host__ __device__ constexpr uint32_t k_major_step(int rows, int k0) {
  return desc_offset(uint32_t((k0 / W) * rows * W * 2 + (k0 % W) * 2));
}

// MN-major operand (V in P V): rows of the tile are the K index, the columns N. The descriptor of
// K rows [0, 16) and every column of a tile of `rows` rows (column blocks lie rows * W * 2 apart);
// mn_major_step moves it to K rows [k0, k0 + 16).
template <int W> __device__ __forceinline__ uint64_t desc_mn_major(const void* tile, int rows) {
  return make_desc(smem_addr(tile), uint32_t(rows * W * 2), 8 * W * 2, desc_layout(W));
}
template <int W> __host__ __device__ constexpr uint32_t mn_major_step(int k0) { return desc_offset(uint32_t(k0 * W * 2)); }

// ---- transaction barriers (mbarrier) ---------------------------------------------------------------

__device__ __forceinline__ void barrier_init(uint64_t* bar, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals));
}
// Makes initialized barriers visible to the copy engine; then a __syncthreads.
__device__ __forceinline__ void barrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void barrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Arrives and says how many bytes the copies that complete this phase will bring.
__device__ __forceinline__ void barrier_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
// Says how many bytes the copies of this phase will bring, without arriving: the arrive may then
// come after the copies are issued (and the phase completes when both have happened).
__device__ __forceinline__ void barrier_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
// Waits until the phase of parity `phase` has completed.
__device__ __forceinline__ void barrier_wait(uint64_t* bar, uint32_t phase) {
  asm volatile("{\n"
               ".reg .pred done;\n"
               "wait_%=:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra wait_%=;\n"
               "}\n" ::"r"(smem_addr(bar)),
               "r"(phase)
               : "memory");
}

// ---- bulk tensor copies (TMA) ----------------------------------------------------------------------

// The box at coordinates (c0 innermost .. c3) of a 4-d tensor map into shared memory; completes
// its bytes on `bar`. Coordinates past the tensor read zeros.
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int32_t c0, int32_t c1,
                                            int32_t c2, int32_t c3) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(smem_addr(dst)),
               "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// The box at coordinates (c0 .. c3) of an fp32 tensor map, from shared memory laid out as a load
// of that box lays it, added element by element into the tensor by the copy engine (in L2; rows
// past the tensor are dropped). One instruction for what would be box / 4 vector atomics; joins
// the issuing thread's open bulk group.
__device__ __forceinline__ void tma_reduce_add_4d(const CUtensorMap* map, const void* src, int32_t c0, int32_t c1,
                                                  int32_t c2, int32_t c3) {
  asm volatile("cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
// The box at coordinates (c0 .. c3) of a 4-d tensor map, written from shared memory laid out as a
// load of that box lays it (rows past the tensor are dropped); joins the thread's open bulk group.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* src, int32_t c0, int32_t c1,
                                             int32_t c2, int32_t c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until the thread's committed bulk groups have read their shared memory (it may be written again).
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// Until they have completed (their global writes done).
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// ---- registers -> shared ------------------------------------------------------------------------

// Four 8x8 matrices of 16-bit elements from an mma A fragment (register i holds matrix i: rows
// lane / 4, columns 2 (lane % 4)..); lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
// The same, each matrix stored transposed: lanes 8i..8i+7 give the addresses of its rows as stored
// (the fragment's columns).
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t x) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(x) : "memory");
}
__device__ __forceinline__ void st_shared_v2(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

// Orders this thread's ordinary shared-memory stores before later reads by the tensor cores or the
// copy engine (the async proxy); a barrier among the threads involved follows.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- operand tiles in registers ---------------------------------------------------------------------

// Rows of an array of A fragments for kSteps k-steps (at least one: C++ has no empty arrays).
__host__ __device__ constexpr int a_steps(int k_steps) { return k_steps > 0 ? k_steps : 1; }

// A fragments (the mma.sync A fragment of a warp's 16 rows, which wgmma takes from registers) of
// the first kSteps k-steps (16 columns each) of rows row0 .. row0 + 15 of a [kRows][D] shared tile
// as the copy engine lays it (column blocks of W, swizzled rows): the A pattern of smem_tile.h's
// SmemTile (lane_a) on that tile, lanes 0-15 addressing the rows at column 16 kk, lanes 16-31 at 16 kk + 8.
template <int W, int kRows, int kSteps, class T>
__device__ __forceinline__ void load_a_fragments(uint32_t (&a)[a_steps(kSteps)][4], const T* tile, int row0, int lane) {
  const int row = row0 + (lane & 15);
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const int k0 = 16 * kk + 8 * (lane >> 4);
    ldmatrix_x4(a[kk], smem_addr(tile) + uint32_t((k0 / W) * kRows * W * 2) + swizzled_offset<W>(row, (k0 % W) / 8));
  }
}

// k-step k0 of D (64 x N) = A B over the k-steps so far (k0 = 0 overwrites D), both operands
// K-major: A from the registers `a` (load_a_fragments) for the first kSteps k-steps, from shared
// memory (a_desc) after them; B from shared memory. Each k-step taken from registers is one read of
// A from shared memory less. (The index is clamped only for the k-steps that take the other branch.)
template <class T, int N, int kSteps>
__device__ __forceinline__ void wgmma_step(float (&d)[N / 8][4], const uint32_t (&a)[a_steps(kSteps)][4], uint64_t a_desc,
                                           uint64_t b_desc, int k0) {
  if (k0 / 16 < kSteps) Wgmma<T, N>::template rs<0>(d, a[k0 / 16 < kSteps ? k0 / 16 : 0], b_desc, k0 > 0);
  else Wgmma<T, N>::template ss<0, 0>(d, a_desc, b_desc, k0 > 0);
}

// ---- rows past a segment's end ----------------------------------------------------------------------

// Zeroes rows [valid, kRows) of a tile laid out as the copy engine lays it ([D / W][kRows][W],
// swizzled within a row only, so whole rows are the same rows), by `threads` threads, and makes the
// zeros visible to the tensor cores of those threads once they pass a barrier together. For tiles
// that run past a segment's end inside the tensor: the copy engine zero-fills past the tensor's end
// only, and rows past a segment may hold anything, NaN included, which a product spreads (0 x NaN).
template <int W, int D, int kRows, class T>
__device__ void zero_rows_past(T* tile, int32_t valid, int thread, int threads) {
  constexpr int kRowChunks = W / 8; // 16-byte chunks of a row of a column block
  const int rows = kRows - max(valid, 0);
  uint4* base = reinterpret_cast<uint4*>(tile);
  for (int c = thread; c < (D / W) * rows * kRowChunks; c += threads) {
    const int cb = c / (rows * kRowChunks), r = valid + (c / kRowChunks) % rows, chunk = c % kRowChunks;
    base[(cb * kRows + r) * kRowChunks + chunk] = make_uint4(0, 0, 0, 0);
  }
  fence_async_shared();
}

// ---- warpgroup matrix fences ----------------------------------------------------------------------

#if ATTNCORE_SM90_DEVICE
// Before the first wgmma of a batch, once registers it reads or accumulates were written otherwise.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed batches of this warpgroup are still running.
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Register budget of the calling warpgroup: producers give registers back, consumers take them.
template <int R> __device__ __forceinline__ void regs_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R> __device__ __forceinline__ void regs_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
#else
__device__ __forceinline__ void wgmma_fence() {}
__device__ __forceinline__ void wgmma_commit() {}
template <int N> __device__ __forceinline__ void wgmma_wait() {}
template <int R> __device__ __forceinline__ void regs_dealloc() {}
template <int R> __device__ __forceinline__ void regs_alloc() {}
#endif

// Keeps the compiler from moving reads or writes of accumulator registers across an async matrix
// instruction: the registers are the hardware's from issue to wgmma_wait.
template <int N> __device__ __forceinline__ void fence_registers(float (&d)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}

// A value the compiler can prove equal across the warp (a broadcast from lane 0). Every branch
// around a wgmma must be on such values: ptxas otherwise waits after each one (warning C7518).
__device__ __forceinline__ bool warp_uniform(bool x) { return __shfl_sync(kFullMask, x, 0); }
__device__ __forceinline__ int warp_uniform(int x) { return __shfl_sync(kFullMask, x, 0); }

// The same for registers an async matrix instruction reads (A fragments): live, and unchanged,
// until its wgmma_wait returns.
template <int N> __device__ __forceinline__ void fence_registers(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[j][e])::"memory");
}

// fp32 accumulator fragments staged in shared memory for the copy engine, in rows of 128 bytes (32
// floats) with its 128-byte swizzle: 16-byte unit u of row r holds columns 4 (u ^ (r % 8)) ... A
// lane holds 2 floats (8 bytes) of row r = lane / 4 (+ 8, + 16 ...) in each n8 tile, and a half
// warp's 8-byte stores are one wavefront only when its 16 lanes hit 16 distinct bank pairs. Its
// rows are r .. r + 3 (mod 8), and the swizzle maps each aligned four units onto themselves for
// rows r and r ^ 1: stored tile by tile, two lanes share every bank pair. Stored in the order
// tile t ^ (r % 4) within each four tiles, the half warp covers all eight units. stage_rotation is
// that lane's r % 4, stage_unit the unit of its q-th store; rotate_tiles reorders a fragment so
// that slot t holds tile t ^ rot, with selects (a lane-dependent index would put the fragment in
// local memory).
__host__ __device__ constexpr int stage_rotation(int lane) { return (lane >> 2) & 3; }
__host__ __device__ constexpr int stage_unit(int lane, int q) {
  return (2 * (q ^ stage_rotation(lane)) + ((lane & 3) >> 1)) ^ ((lane >> 2) & 7);
}
// Every store of every half warp hits 16 distinct 8-byte slots of a row's 32 banks, and over its
// four stores a lane writes each of its four tiles once, where the swizzle puts that tile's columns.
constexpr bool stage_order_is_conflict_free() {
  for (int q = 0; q < 4; ++q)
    for (int half = 0; half < 2; ++half) {
      bool taken[16] = {};
      for (int lane = 16 * half; lane < 16 * half + 16; ++lane) {
        const int slot = 2 * stage_unit(lane, q) + (lane & 1);
        if (taken[slot]) return false;
        taken[slot] = true;
      }
    }
  for (int lane = 0; lane < 32; ++lane) {
    bool stored[4] = {};
    for (int q = 0; q < 4; ++q) {
      const int tile = q ^ stage_rotation(lane);
      if (stored[tile] || (stage_unit(lane, q) ^ ((lane >> 2) & 7)) != 2 * tile + ((lane & 3) >> 1)) return false;
      stored[tile] = true;
    }
  }
  return true;
}
static_assert(stage_order_is_conflict_free(), "the staged fp32 stores must be one wavefront a half warp");
template <int N> __device__ __forceinline__ void rotate_tiles(float (&x)[N][4], int rot) {
  static_assert(N % 4 == 0, "whole groups of four n8 tiles");
#pragma unroll
  for (int g = 0; g < N; g += 4)
#pragma unroll
    for (int bit = 1; bit <= 2; bit <<= 1)
#pragma unroll
      for (int t = 0; t < 4; ++t)
        if (!(t & bit))
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float lo = x[g + t][e], hi = x[g + (t | bit)][e];
            x[g + t][e] = (rot & bit) ? hi : lo;
            x[g + (t | bit)][e] = (rot & bit) ? lo : hi;
          }
}

// A barrier among `threads` threads (whole warps) of the CTA, by id (0 is __syncthreads').
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrives at barrier `id` of `threads` threads without waiting for it (its waiters are the others).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// The same barrier, and whether `x` holds on every one of its threads (one reduction, no vote).
__device__ __forceinline__ bool named_barrier_all(int id, int threads, bool x) {
  uint32_t all;
  asm volatile("{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.and.pred q, %2, %3, p;\nselp.u32 %0, 1, 0, q;\n}\n"
               : "=r"(all)
               : "r"(uint32_t(x)), "r"(id), "r"(threads)
               : "memory");
  return all != 0;
}

} // namespace attncore::cuda::sm90
