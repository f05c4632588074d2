// CPU forward: flash attention on tiles of kRowTile rows x kColTile keys with an online softmax,
// in Acc. K is kept transposed ([dim][key]) so the score loop runs along keys and vectorizes
// without reassociating a sum; V stays [key][dim] so the output update runs along dim.
#include "attncore/cpu.h"

#include <algorithm>
#include <vector>

#include "common.h"

namespace attncore::cpu {

using namespace detail;

namespace {

template <class Acc> struct ForwardTile {
  int D = 0;
  std::vector<Acc> q, s, acc, m, l; // q pre-multiplied by the softmax scale

  explicit ForwardTile(int d)
      : D(d), q(size_t(kRowTile) * d), s(size_t(kRowTile) * kColTile), acc(size_t(kRowTile) * d),
        m(kRowTile), l(kRowTile) {}

  void reset(int rows) {
    std::fill(acc.begin(), acc.begin() + int64_t(rows) * D, Acc(0));
    std::fill(m.begin(), m.end(), -std::numeric_limits<Acc>::infinity());
    std::fill(l.begin(), l.end(), Acc(0));
  }

  // A partial of the same rows over other keys (its LSE, and O in fp32 by prior_row(r)) as one more
  // term of the sums: weight e^(LSE' - m), the larger side the new maximum.
  template <class Row> void merge_prior(int rows, const float* lse_prior, Row prior_row) {
    for (int r = 0; r < rows; ++r) {
      const Acc lp = lse_prior[r];
      if (lp == -std::numeric_limits<Acc>::infinity()) continue;
      const Acc m_new = std::max(m[r], lp);
      const Acc keep = std::exp(m[r] - m_new), c = std::exp(lp - m_new); // keep is 0 when m was -inf
      const float* o = prior_row(r);
      Acc* ar = &acc[size_t(r) * D];
      for (int d = 0; d < D; ++d) ar[d] = ar[d] * keep + c * Acc(o[d]);
      l[r] = l[r] * keep + c;
      m[r] = m_new;
    }
  }

  // s = q . K[c0:c1]^T for `rows` rows; kt is [D][ld] (transposed keys).
  void scores(int rows, const Acc* kt, int64_t ld, int64_t c0, int cols) {
    for (int r = 0; r < rows; ++r) std::fill_n(&s[size_t(r) * kColTile], cols, Acc(0));
    for (int d = 0; d < D; ++d) {
      const Acc* krow = kt + int64_t(d) * ld + c0;
      for (int r = 0; r < rows; ++r) {
        const Acc qd = q[size_t(r) * D + d];
        Acc* sr = &s[size_t(r) * kColTile];
        for (int c = 0; c < cols; ++c) sr[c] += qd * krow[c];
      }
    }
  }

  // One online-softmax step: rescale what was accumulated, then add P . V[c0:c1].
  void softmax_step(int rows, const Acc* v, int64_t c0, int cols) {
    for (int r = 0; r < rows; ++r) {
      Acc* sr = &s[size_t(r) * kColTile];
      Acc mt = -std::numeric_limits<Acc>::infinity();
      for (int c = 0; c < cols; ++c) mt = std::max(mt, sr[c]);
      const Acc m_new = std::max(m[r], mt);
      if (m_new == -std::numeric_limits<Acc>::infinity()) continue; // nothing visible yet
      const Acc alpha = std::exp(m[r] - m_new);                     // 0 when m was -inf
      Acc* ar = &acc[size_t(r) * D];
      if (alpha != Acc(1))
        for (int d = 0; d < D; ++d) ar[d] *= alpha;
      Acc sum = 0;
      for (int c = 0; c < cols; ++c) {
        sr[c] = std::exp(sr[c] - m_new);
        sum += sr[c];
      }
      l[r] = l[r] * alpha + sum;
      m[r] = m_new;
      for (int c = 0; c < cols; ++c) {
        const Acc pc = sr[c];
        if (pc == Acc(0)) continue;
        const Acc* vr = v + (c0 + c) * D;
        for (int d = 0; d < D; ++d) ar[d] += pc * vr[d];
      }
    }
  }
};

} // namespace

template <class Acc> void forward(const ForwardParams& p) {
  check_call(p.dtype, p.batch, p.heads_q, p.heads_kv, p.head_dim, p.seqlen_q, p.seqlen_kv,
             p.segments, p.num_segments, p.blocks);
  if (p.softmax_scale < 0.f) fail("softmax_scale must be positive (0 means 1/sqrt(head_dim))");
  if (p.seqlen_q == 0) return;
  if (!p.q.data || !p.o.data || !p.lse.data || (p.seqlen_kv > 0 && (!p.k.data || !p.v.data)))
    fail("forward: a tensor pointer is null");
  if (p.o_prior.data && !p.lse_prior.data) fail("forward: lse_prior is null where o_prior is given");
  if (p.o_prior.data && p.o.data == p.o_prior.data && !p.o_fp32)
    fail("forward: o may be o_prior itself only in fp32 (o_fp32)");
  const int D = p.head_dim;
  const int group = p.heads_q / p.heads_kv;
  const Acc scale = resolve_scale(p.softmax_scale, D);
  const int64_t S = p.seqlen_kv;
  const DType out_type = p.o_fp32 ? DType::fp32 : output_dtype(p.dtype);
  const std::vector<Region> regs = regions(p.seqlen_q, S, p.mask, p.segments, p.num_segments);

  std::vector<Acc> kt(size_t(S) * D), v(size_t(S) * D), row(static_cast<size_t>(D));
  std::vector<KvTile> tiles;
  ForwardTile<Acc> t(D);
  std::vector<Acc> out(static_cast<size_t>(D));

  for (int64_t b = 0; b < p.batch; ++b) {
    for (int32_t hk = 0; hk < p.heads_kv; ++hk) {
      for (int64_t j = 0; j < S; ++j) {
        load(p.dtype, p.k.data, offset(p.k, b, j, hk), D, row.data(), p.descale_k);
        for (int d = 0; d < D; ++d) kt[size_t(d) * S + j] = row[d];
        load(p.dtype, p.v.data, offset(p.v, b, j, hk), D, &v[size_t(j) * D], p.descale_v);
      }
      for (int32_t hq = hk * group; hq < (hk + 1) * group; ++hq) {
        float* lse = stat_ptr(p.lse, b, hq);
        for (const Region& reg : regs) {
          for (int64_t r0 = reg.row_begin; r0 < reg.row_end; r0 += kRowTile) {
            const int rows = int(std::min<int64_t>(kRowTile, reg.row_end - r0));
            for (int r = 0; r < rows; ++r) {
              Acc* qr = &t.q[size_t(r) * D];
              load(p.dtype, p.q.data, offset(p.q, b, r0 + r, hq), D, qr, p.descale_q);
              for (int d = 0; d < D; ++d) qr[d] *= scale;
            }
            t.reset(rows);
            kv_tiles(p.mask, p.blocks, reg, r0, r0 + rows, hq, S, tiles);
            for (const KvTile& kv : tiles) {
              const int cols = int(kv.c1 - kv.c0);
              t.scores(rows, kt.data(), S, kv.c0, cols);
              if (kv.masked)
                for (int r = 0; r < rows; ++r)
                  for (int c = 0; c < cols; ++c)
                    if (!visible(p.mask, reg.row_pos(r0 + r), reg.col_pos(kv.c0 + c)))
                      t.s[size_t(r) * kColTile + c] = -std::numeric_limits<Acc>::infinity();
              t.softmax_step(rows, v.data(), kv.c0, cols);
            }
            if (p.o_prior.data)
              t.merge_prior(rows, stat_ptr(p.lse_prior, b, hq) + r0, [&](int r) {
                return static_cast<const float*>(p.o_prior.data) + offset(p.o_prior, b, r0 + r, hq);
              });
            for (int r = 0; r < rows; ++r) {
              const Acc l = t.l[r];
              const Acc inv = l > Acc(0) ? Acc(1) / l : Acc(0);
              for (int d = 0; d < D; ++d) out[d] = t.acc[size_t(r) * D + d] * inv;
              store(out_type, p.o.data, offset(p.o, b, r0 + r, hq), D, out.data());
              lse[r0 + r] = l > Acc(0) ? float(t.m[r] + std::log(l))
                                       : -std::numeric_limits<float>::infinity();
            }
          }
        }
      }
    }
  }
}

template void forward<float>(const ForwardParams&);
template void forward<double>(const ForwardParams&);

} // namespace attncore::cpu
