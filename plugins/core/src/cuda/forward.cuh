// Flash-attention forward (FlashAttention-2's algorithm) on mma.sync m16n8k16.
//
// A CTA of 4 warps owns kBlockM query rows of one (batch, head); each warp owns kWarpRows of them
// (two m16 tiles for D <= 128: every K/V fragment read from shared memory feeds two products).
// It walks the key tiles its rows can see (KvWalk), double-buffered with cp.async:
//     S = Q K^T;  the online-softmax step (softmax.cuh);  O += P V.
#pragma once

#include "args.h"
#include "device.cuh"
#include "launch.h"
#include "softmax.cuh"
#include "tiles.cuh"

namespace attncore::cuda {

// A shape: kWarps warps (of two m16 tiles up to D = 128, one at D = 256, for the registers of O)
// and key tiles of kBlockN columns. launch_forward picks, per head dim, the first of its shapes
// whose shared memory the device allows:
//  - D <= 128: 4 warps, 64-key tiles (98,432 bytes at D = 128: within the 99 KB of an sm_86, sm_89
//    or sm_120 since its rows are unpadded; the 32-key shape remains for a device with less);
//  - D = 256: 8 warps of 16 rows and 64-key tiles where a CTA may hold 203 KB (sm_90),
//    FlashAttention-2's shape there, 15-17% faster on an H200 (docs/KERNELS.md, "Shapes by shared-memory budget")
//    than the 4 warps and 32-key tiles (exactly 99 KB) that every other device takes.
template <class T, int D, int kBlockN_, int kWarps_ = 4> struct ForwardConfig {
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kCtasPerSm = kWarps == 8 ? 1 : 2;
  static constexpr int kMTiles = D <= 128 ? 2 : 1; // m16 tiles per warp (register budget at D = 256)
  static constexpr int kWarpRows = 16 * kMTiles;
  static constexpr int kBlockM = kWarps * kWarpRows;
  static constexpr int kBlockN = kBlockN_;
  using Tile = HeadTile<T, D>; // Q, K and V (smem_tile.h)
  static constexpr int kSTiles = kBlockN / 8; // score n-tiles
  static constexpr int kOTiles = D / 8;       // output n-tiles
  static constexpr uint32_t kKBytes = Tile::bytes(kBlockN); // a K or V buffer
  static constexpr size_t kSmemBytes = kSmemAlign + Tile::bytes(kBlockM) + 2 * 2 * kKBytes;
  static_assert(D % 16 == 0, "head dim must be a multiple of 16");
  static_assert(kBlockM <= 128, "a row tile spans at most two query blocks of a block list");
  static_assert(64 % kBlockN == 0, "key tiles must divide the block-list block sizes");
  static_assert(kSmemBytes <= 227 * 1024, "must fit an sm_90 CTA");
};

// The warp's online-softmax state (softmax.cuh) and its two products on mma.sync.
template <class T, int D, int kBlockN, int kWarps, class C = ForwardConfig<T, D, kBlockN, kWarps>>
struct ForwardWarp : OnlineSoftmax<C::kMTiles, C::kOTiles> {
  using OnlineSoftmax<C::kMTiles, C::kOTiles>::o;

  // S = Q K^T for this warp's rows (this lane's Q fragment address `q`, lane_a) and the key tile
  // (`k`, lane_nk). The first k-step's products start from zero rather than from cleared registers.
  __device__ void scores(float (&s)[C::kMTiles][C::kSTiles][4], uint32_t q, uint32_t k) {
    score_step<true>(s, q, k, 0);
    // Four k-steps per unrolled iteration: enough loads in flight without hoisting all of them
    // (ptxas, sm_90a, D = 128: full unroll spills 44 bytes, 4 spills 32). D = 256, one m16 tile a
    // warp, unrolls fully without spills: +4% (docs/KERNELS.md, "Tiles per head dim").
#pragma unroll(D == 256 ? 16 : 4)
    for (int k0 = 16; k0 < D; k0 += 16) score_step<false>(s, q, k, k0);
  }
  template <bool kFirst>
  __device__ void score_step(float (&s)[C::kMTiles][C::kSTiles][4], uint32_t q, uint32_t k, int k0) {
    uint32_t a[C::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < C::kMTiles; ++mt) ldmatrix_x4(a[mt], C::Tile::at(q, mt * 16, k0));
#pragma unroll
    for (int n0 = 0; n0 < C::kBlockN; n0 += 16) {
      uint32_t b[4];
      ldmatrix_x4(b, C::Tile::at(k, n0, k0));
#pragma unroll
      for (int mt = 0; mt < C::kMTiles; ++mt) {
        mma_16x8x16<T, kFirst>(s[mt][n0 / 8], a[mt], b[0], b[1]);
        mma_16x8x16<T, kFirst>(s[mt][n0 / 8 + 1], a[mt], b[2], b[3]);
      }
    }
  }

  // O += P V, P straight from the score registers, V's tile at `v` (lane_kn).
  __device__ void accumulate_pv(const float (&p)[C::kMTiles][C::kSTiles][4], uint32_t v) {
#pragma unroll
    for (int k0 = 0; k0 < C::kBlockN; k0 += 16) {
      uint32_t a[C::kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < C::kMTiles; ++mt) c_to_a<T>(a[mt], p[mt][k0 / 8], p[mt][k0 / 8 + 1]);
#pragma unroll
      for (int n0 = 0; n0 < D; n0 += 16) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, C::Tile::at(v, k0, n0));
#pragma unroll
        for (int mt = 0; mt < C::kMTiles; ++mt) {
          mma_16x8x16<T>(o[mt][n0 / 8], a[mt], b[0], b[1]);
          mma_16x8x16<T>(o[mt][n0 / 8 + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }
};

template <class T, int D, int kBlockN, int kWarps>
__global__ void __launch_bounds__(ForwardConfig<T, D, kBlockN, kWarps>::kThreads,
                                  ForwardConfig<T, D, kBlockN, kWarps>::kCtasPerSm)
    flash_forward_kernel(const __grid_constant__ AttnArgs a) {
  using C = ForwardConfig<T, D, kBlockN, kWarps>;
  using Tile = typename C::Tile;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem = align_smem(smem_raw);
  T* sQ = reinterpret_cast<T*>(smem);
  unsigned char* sK = smem + Tile::bytes(C::kBlockM); // two buffers
  unsigned char* sV = sK + 2 * C::kKBytes;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int head = blockIdx.y, batch = blockIdx.z, kv_head = head / a.group;
  const int32_t x = int32_t(gridDim.x - 1 - blockIdx.x); // last tiles first: causal ones are heaviest

  Region reg;
  int32_t m0;
  if (a.nseg > 0) {
    int32_t seg, tile;
    if (!locate_tile(a.segs, a.nseg, x, C::kBlockM, true, seg, tile)) return;
    reg = segment_region(a.segs[seg]);
    m0 = reg.row_begin + tile * C::kBlockM;
  } else {
    reg = whole_call(a.mask, a.seqlen_q, a.seqlen_kv);
    m0 = x * C::kBlockM;
  }
  const int32_t m1 = min(m0 + C::kBlockM, reg.row_end);
  const int32_t warp_row0 = warp * C::kWarpRows;

  const T* q = static_cast<const T*>(a.q.data) + batch * a.q.batch_stride + head * a.q.head_stride;
  const T* k = static_cast<const T*>(a.k.data) + batch * a.k.batch_stride + kv_head * a.k.head_stride;
  const T* v = static_cast<const T*>(a.v.data) + batch * a.v.batch_stride + kv_head * a.v.head_stride;
  load_tile_async<C::kBlockM, Tile, C::kThreads>(sQ, q + int64_t(m0) * a.q.token_stride, a.q.token_stride, m1 - m0,
                                                 tid);

  KvWalk<C::kBlockN> walk;
  int list = 0; // which of the (at most two) query blocks of a block list this warp's rows are in
  if (a.blocks.heads > 0) {
    const int32_t row = (a.blocks.heads == 1 ? 0 : head) * a.blocks.num_q_blocks;
    const int32_t qb0 = m0 / a.blocks.block_q, qb1 = (m1 - 1) / a.blocks.block_q;
    walk.init_blocks(a.blocks, row + qb0, row + qb1);
    list = (m0 + warp_row0) / a.blocks.block_q == qb0 ? 0 : 1;
  } else {
    walk.init_interval(a.mask, reg, m0, m1);
  }

  const auto load_kv = [&](int buf, int32_t c0) {
    load_tile_async<C::kBlockN, Tile, C::kThreads>(reinterpret_cast<T*>(sK + buf * C::kKBytes),
                                                   k + int64_t(c0) * a.k.token_stride, a.k.token_stride,
                                                   reg.col_end - c0, tid);
    load_tile_async<C::kBlockN, Tile, C::kThreads>(reinterpret_cast<T*>(sV + buf * C::kKBytes),
                                                   v + int64_t(c0) * a.v.token_stride, a.v.token_stride,
                                                   reg.col_end - c0, tid);
  };

  // This lane's fragment addresses (smem_tile.h), made once; buffer `buf` adds buf x kKBytes.
  const uint32_t q_frag = smem_addr(sQ) + Tile::bytes(warp_row0) + Tile::lane_a(lane);
  const uint32_t k_frag = smem_addr(sK) + Tile::lane_nk(lane), v_frag = smem_addr(sV) + Tile::lane_kn(lane);

  ForwardWarp<T, D, kBlockN, kWarps> w;
  w.init();
  KvStep cur;
  bool have = walk.next(cur, a.mask, reg, m0, m1, a.blocks);
  if (have) load_kv(0, cur.c0);
  cp_async_commit();
  int buf = 0;
  // Where the next tile's copies are issued: before the barrier that opens this tile (a barrier
  // closes each tile, so that no warp refills a buffer another still reads), or under this tile's
  // scores, which a barrier that opens the tile alone allows: +1-3.5% at D = 64, 96 and 256, but
  // 10-17% slower at D = 80 and 128, where ptxas then spills (docs/KERNELS.md, "Order of work in a step").
  constexpr bool kCopiesUnderScores = D == 64 || D == 96 || D == 256;
  while (have) {
    KvStep nxt;
    const bool have_next = walk.next(nxt, a.mask, reg, m0, m1, a.blocks);
    const auto prefetch = [&] { // the next tile streams in while this one is used
      if (have_next) load_kv(buf ^ 1, nxt.c0);
      cp_async_commit();
    };
    if constexpr (kCopiesUnderScores) {
      cp_async_wait<0>();
    } else {
      prefetch();
      cp_async_wait<1>();
    }
    __syncthreads();
    // (selects, not cur.active[list]: a run-time index would put the step in local memory)
    const bool active = list ? cur.active[1] : cur.active[0];
    const bool masked = list ? cur.masked[1] : cur.masked[0];
    if (active) {
      float s[C::kMTiles][C::kSTiles][4];
      w.scores(s, q_frag, k_frag + buf * C::kKBytes);
      if constexpr (kCopiesUnderScores) prefetch();
      if (masked || cur.cross) w.mask_scores(s, a.mask, reg, m0 + warp_row0, cur.c0, masked, lane);
      w.step(s, a.scale_log2);
      w.accumulate_pv(s, v_frag + buf * C::kKBytes);
    } else if constexpr (kCopiesUnderScores) {
      prefetch();
    }
    if constexpr (!kCopiesUnderScores) __syncthreads(); // everyone is done with `buf` before it is refilled
    cur = nxt;
    have = have_next;
    buf ^= 1;
  }
  cp_async_wait<0>();
  if (a.o_prior.data) w.merge_prior(a, batch, head, m0 + warp_row0, m1, lane);
  w.template store<T>(a, batch, head, m0 + warp_row0, m1, lane);
}

template <class T, int D, int kBlockN, int kWarps = 4>
void launch_forward_shape(const ForwardParams& p, size_t smem_allowed, cudaStream_t stream) {
  using C = ForwardConfig<T, D, kBlockN, kWarps>;
  require_smem(C::kSmemBytes, smem_allowed, "flash forward", D);
  const AttnArgs a = forward_args(p);
  const auto kernel = flash_forward_kernel<T, D, kBlockN, kWarps>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kSmemBytes));
  const dim3 grid(unsigned(tile_grid(p.seqlen_q, C::kBlockM, p.num_segments)), unsigned(p.heads_q),
                  unsigned(p.batch));
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(a);
  check_launch("flash forward");
}

// The first shape of the head dim (ForwardConfig) whose shared memory the device allows.
template <class T, int D> void launch_forward(const ForwardParams& p, cudaStream_t stream) {
  const size_t smem = max_smem_per_block();
  if constexpr (D == 256) {
    if (smem >= ForwardConfig<T, D, 64, 8>::kSmemBytes) return launch_forward_shape<T, D, 64, 8>(p, smem, stream);
    return launch_forward_shape<T, D, 32>(p, smem, stream);
  } else {
    if constexpr (ForwardConfig<T, D, 64>::kSmemBytes > kSmallestSmem) { // (D = 128)
      if (smem < ForwardConfig<T, D, 64>::kSmemBytes) return launch_forward_shape<T, D, 32>(p, smem, stream);
    }
    return launch_forward_shape<T, D, 64>(p, smem, stream);
  }
}

} // namespace attncore::cuda
