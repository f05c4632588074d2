// The online softmax of the forward kernels (FlashAttention-2's), on score tiles laid out as
// mma.sync C fragments: what the mma.sync kernel's products and the Hopper kernel's warpgroup
// products both leave in a warp's registers. A warp owns kMTiles x 16 rows; a lane holds two of
// them (g and g + 8 of each m16 tile, g = lane / 4) and, of every n8 tile, columns 2t and 2t + 1.
//     mask (edge tiles only);  m' = max(m, rowmax S);  P = exp2(S c - m' c);
//     l = l e^(m - m') + rowsum P;  O = O e^(m - m')  (then O += P V, by the caller)
// and ends with O / l and LSE = ln 2 (m c + log2 l), c = scale log2(e). A row that sees no key has
// l = 0: O = 0, LSE = -inf.
#pragma once

#include "args.h"
#include "device.cuh"
#include "tiles.cuh"

namespace attncore::cuda {

// max and sum of the first Count of N values by a tree of depth ceil(log2 Count). (Recursion on
// the count, not a loop halving it: nvcc left that loop rolled, and the array went to local memory.)
template <int Count, int N, class Op> __device__ __forceinline__ float tree_reduce(float (&v)[N], Op op) {
  if constexpr (Count == 1) {
    return v[0];
  } else {
    constexpr int Half = (Count + 1) / 2;
#pragma unroll
    for (int j = 0; j < Count - Half; ++j) v[j] = op(v[j], v[j + Half]);
    return tree_reduce<Half>(v, op);
  }
}
template <int N> __device__ __forceinline__ float tree_max(float (&v)[N]) {
  return tree_reduce<N>(v, [](float x, float y) { return fmaxf(x, y); });
}
template <int N> __device__ __forceinline__ float tree_sum(float (&v)[N]) {
  return tree_reduce<N>(v, [](float x, float y) { return x + y; });
}

template <int kMTiles, int kOTiles> struct OnlineSoftmax {
  float o[kMTiles][kOTiles][4];
  float row_max[kMTiles][2]; // raw scores (unscaled); -inf until a key is seen
  float row_sum[kMTiles][2]; // this lane's share of l

  __device__ void init() {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int j = 0; j < kOTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][j][e] = 0.f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        row_max[mt][h] = -INFINITY;
        row_sum[mt][h] = 0.f;
      }
    }
  }

  // -inf for pairs the mask hides (when `masked`) and for columns past the region (when `cross`).
  template <int kSTiles>
  __device__ static void mask_scores(float (&s)[kMTiles][kSTiles][4], const MaskArgs& mask, const Region& reg,
                                     int32_t row0, int32_t c0, bool masked, int lane) {
    // Per row of the lane, a band of column offsets (tiles.cuh): element (row, 8 j + 2 (lane % 4) +
    // e % 2) is kept iff 8 j + e % 2 lies in its row's band.
    const int32_t base = reg.diff(row0, c0); // diff of (row0, c0); (row, col) adds col - row
    Band band[kMTiles][2];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        band[mt][h] = row_band(mask, masked, base, 16 * mt + 8 * h + (lane >> 2), reg.col_end - c0, lane);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int j = 0; j < kSTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (!in_band(band[mt][e >> 1], j * 8 + (e & 1))) s[mt][j][e] = -INFINITY;
  }

  // The online-softmax step: new maxima, rescale O and l, S becomes P.
  template <int kSTiles> __device__ void step(float (&s)[kMTiles][kSTiles][4], float scale_log2) {
    float alpha[kMTiles][2];
    update(s, scale_log2, alpha);
    rescale(alpha);
  }

  // Row (mt, h)'s new maximum: the tile's and the old one, over the row's four lanes. (Reductions
  // as trees, not chains: a consumer warp has little else to issue meanwhile.)
  template <int kSTiles> __device__ float new_max(const float (&s)[kMTiles][kSTiles][4], int mt, int h) const {
    float part[kSTiles];
#pragma unroll
    for (int j = 0; j < kSTiles; ++j) part[j] = fmaxf(s[mt][j][2 * h], s[mt][j][2 * h + 1]);
    return quad_max(fmaxf(row_max[mt][h], tree_max(part)));
  }

  // Row (mt, h)'s scores become P = exp2(S c - m_scaled); part[j]: this lane's sum of tile j's.
  template <int kSTiles>
  __device__ static void to_probabilities(float (&s)[kMTiles][kSTiles][4], int mt, int h, float scale_log2,
                                          float m_scaled, float (&part)[kSTiles]) {
#pragma unroll
    for (int j = 0; j < kSTiles; ++j) {
#pragma unroll
      for (int e = 2 * h; e < 2 * h + 2; ++e) s[mt][j][e] = fast_exp2(fmaf(s[mt][j][e], scale_log2, -m_scaled));
      part[j] = s[mt][j][2 * h] + s[mt][j][2 * h + 1];
    }
  }

  // A row that has seen nothing yet subtracts 0, not -inf: exp2(-inf - -inf) would be NaN.
  __device__ static float scaled_max(float m, float scale_log2) { return m == -INFINITY ? 0.f : m * scale_log2; }

  // The step without touching O (the Hopper kernel's P V product may still be writing it): new
  // maxima, l rescaled, S becomes P; alpha = e^(m - m') for rescale() once O is back.
  template <int kSTiles>
  __device__ void update(float (&s)[kMTiles][kSTiles][4], float scale_log2, float (&alpha)[kMTiles][2]) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float mx = new_max(s, mt, h);
        const float m_scaled = scaled_max(mx, scale_log2);
        alpha[mt][h] = fast_exp2(row_max[mt][h] * scale_log2 - m_scaled);
        row_max[mt][h] = mx;
        float part[kSTiles];
        to_probabilities(s, mt, h, scale_log2, m_scaled, part);
        row_sum[mt][h] = row_sum[mt][h] * alpha[mt][h] + tree_sum(part);
      }
  }

  // The step with each row's maximum kept while no row of the warp has grown by more than 2^kTau
  // in exp2 units (FlashAttention-4's): P then reaches at most 2^kTau, O and l keep their scale, and
  // O's rescale is skipped. The warp decides as one (a vote). True: O must be rescaled by alpha.
  template <int kTau, int kSTiles>
  __device__ bool update_lazy(float (&s)[kMTiles][kSTiles][4], float scale_log2, float (&alpha)[kMTiles][2]) {
    float mx[kMTiles][2];
    bool keep = true;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[mt][h] = new_max(s, mt, h);
        keep = keep && row_max[mt][h] != -INFINITY && (mx[mt][h] - row_max[mt][h]) * scale_log2 <= float(kTau);
      }
    keep = __all_sync(kFullMask, keep);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        alpha[mt][h] = 1.f;
        if (!keep) {
          const float m_new = mx[mt][h] == -INFINITY ? 0.f : mx[mt][h] * scale_log2;
          alpha[mt][h] = fast_exp2(row_max[mt][h] * scale_log2 - m_new);
          row_max[mt][h] = mx[mt][h];
        }
        const float m_scaled = row_max[mt][h] == -INFINITY ? 0.f : row_max[mt][h] * scale_log2;
        float part[kSTiles];
        to_probabilities(s, mt, h, scale_log2, m_scaled, part);
        row_sum[mt][h] = keep ? row_sum[mt][h] + tree_sum(part) : row_sum[mt][h] * alpha[mt][h] + tree_sum(part);
      }
    return !keep;
  }

  // The step against the kept maxima, the tile's own not looked for (the FP8 forward's): S becomes
  // P = exp2(S c - m_kept), and `sum` takes the lane's sums of the tile's P a row, for l once the
  // step stands (add_sums). False where a row has no maximum yet or a sum passes `limit`, so that
  // some P may exceed it: the caller then takes the step again from the scores (update_lazy or
  // update). A lane's sum bounds each of its P, as P >= 0.
  template <int kSTiles>
  __device__ bool update_kept(float (&s)[kMTiles][kSTiles][4], float scale_log2, float limit,
                              float (&sum)[kMTiles][2]) const {
    bool fits = true;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        fits = fits && row_max[mt][h] != -INFINITY;
        float part[kSTiles];
        to_probabilities(s, mt, h, scale_log2, scaled_max(row_max[mt][h], scale_log2), part);
        sum[mt][h] = tree_sum(part);
        fits = fits && sum[mt][h] <= limit;
      }
    return fits;
  }

  __device__ void add_sums(const float (&sum)[kMTiles][2]) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) row_sum[mt][h] += sum[mt][h];
  }

  __device__ void rescale(const float (&alpha)[kMTiles][2]) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int j = 0; j < kOTiles; ++j) {
        o[mt][j][0] *= alpha[mt][0];
        o[mt][j][1] *= alpha[mt][0];
        o[mt][j][2] *= alpha[mt][1];
        o[mt][j][3] *= alpha[mt][1];
      }
  }

  // A partial of the same rows over other keys (a.o_prior in fp32, a.lse_prior) enters as one more
  // term of the row's sums: l gains the partial's weight c = e^(LSE' - m) (on the quad's first
  // lane, as quad_sum adds the four), O gains c O', and finish() or store() then write the output
  // over both key sets. The largest side is the new maximum, so no weight overflows. Every read
  // comes before any write of the rows (o and lse may be the prior's own): the LSE is read by the
  // quad's first lane, which alone writes it, and the O pairs by the lane that writes them.
  __device__ void merge_prior(const AttnArgs& a, int b, int h, int32_t row0, int32_t row_end, int lane) {
    const float* lse = a.lse_prior.data + b * a.lse_prior.batch_stride + h * a.lse_prior.head_stride;
    const float* prior = static_cast<const float*>(a.o_prior.data) + b * a.o_prior.batch_stride + h * a.o_prior.head_stride;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int32_t r = row0 + mt * 16 + (lane >> 2) + hh * 8;
        float lse_prior = (lane & 3) == 0 && r < row_end ? lse[r] : -INFINITY;
        lse_prior = __shfl_sync(kFullMask, lse_prior, lane & ~3);
        if (lse_prior == -INFINITY) continue; // nothing to merge, or past the rows
        const float p2 = lse_prior * kLog2e, m2 = row_max[mt][hh] * a.scale_log2; // -inf: no key yet
        float keep = 1.f, c = 1.f;
        if (p2 > m2) {
          keep = exp2f(m2 - p2); // 0 where this call saw no key
          row_max[mt][hh] = p2 / a.scale_log2;
        } else {
          c = exp2f(p2 - m2);
        }
        row_sum[mt][hh] = row_sum[mt][hh] * keep + ((lane & 3) == 0 ? c : 0.f);
        const float* row = prior + int64_t(r) * a.o_prior.token_stride + (lane & 3) * 2;
#pragma unroll
        for (int j = 0; j < kOTiles; ++j) {
          const float2 x = *reinterpret_cast<const float2*>(row + j * 8);
          o[mt][j][2 * hh] = fmaf(c, x.x, o[mt][j][2 * hh] * keep);
          o[mt][j][2 * hh + 1] = fmaf(c, x.y, o[mt][j][2 * hh + 1] * keep);
        }
      }
  }

  // O / l and LSE of the warp's rows that lie in [.., row_end): writes each row's LSE and hands
  // the lane's normalized pairs to put(row, col, x0, x1) (columns col, col + 1 of O).
  template <class Put>
  __device__ void finish(const AttnArgs& a, int b, int h, int32_t row0, int32_t row_end, int lane, Put put) {
    float* lse = a.lse.data + b * a.lse.batch_stride + h * a.lse.head_stride;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int32_t r = row0 + mt * 16 + (lane >> 2) + hh * 8;
        const float l = quad_sum(row_sum[mt][hh]);
        if (r >= row_end) continue;
        const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
        for (int j = 0; j < kOTiles; ++j)
          put(r, j * 8 + (lane & 3) * 2, o[mt][j][2 * hh] * inv, o[mt][j][2 * hh + 1] * inv);
        if ((lane & 3) == 0)
          lse[r] = l > 0.f ? (row_max[mt][hh] * a.scale_log2 + __log2f(l)) * kLn2 : -INFINITY;
      }
  }

  // What finish() does, into O itself (in T or fp32). Not written through finish(): with the
  // store in its callback, ptxas allocated the mma.sync forward's registers otherwise, and it lost
  // 2-4% (docs/KERNELS.md, "mma.sync experiments not kept").
  template <class T> __device__ void store(const AttnArgs& a, int b, int h, int32_t row0, int32_t row_end, int lane) {
    float* lse = a.lse.data + b * a.lse.batch_stride + h * a.lse.head_stride;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int32_t r = row0 + mt * 16 + (lane >> 2) + hh * 8;
        const float l = quad_sum(row_sum[mt][hh]);
        if (r >= row_end) continue;
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const int64_t off = b * a.o.batch_stride + int64_t(r) * a.o.token_stride + h * a.o.head_stride;
#pragma unroll
        for (int j = 0; j < kOTiles; ++j) {
          const int col = j * 8 + (lane & 3) * 2;
          const float x0 = o[mt][j][2 * hh] * inv, x1 = o[mt][j][2 * hh + 1] * inv;
          if (a.o_fp32)
            *reinterpret_cast<float2*>(static_cast<float*>(a.o.data) + off + col) = make_float2(x0, x1);
          else
            *reinterpret_cast<uint32_t*>(static_cast<T*>(a.o.data) + off + col) = pack2<T>(x0, x1);
        }
        if ((lane & 3) == 0)
          lse[r] = l > 0.f ? (row_max[mt][hh] * a.scale_log2 + __log2f(l)) * kLn2 : -INFINITY;
      }
  }
};

} // namespace attncore::cuda
