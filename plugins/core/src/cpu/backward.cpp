// CPU backward (and delta): FlashAttention-2's backward on the same tiles as the forward, using the
// final LSE and delta, so P = exp(scale q.k - LSE) is recomputed exactly as the forward saw it.
//   dP = dO V^T,  dS = P * (dP - delta),  dQ += scale dS K,  dK += scale dS^T Q,  dV += P^T dO.
// Gradients of one (batch, kv head) are summed in Acc over every query head of its group and added
// to the fp32 accumulators once (or, for dK and dV with write_dkdv, written in the output dtype).
#include "attncore/cpu.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common.h"

namespace attncore::cpu {

using namespace detail;

template <class Acc> void compute_delta(const DeltaParams& p) {
  if (p.dtype != DType::bf16 && p.dtype != DType::fp16 && p.dtype != DType::fp32 && !is_fp8(p.dtype))
    fail("compute_delta: dtype must be bf16, fp16, fp32 or FP8");
  if (p.batch < 1 || p.heads < 1 || p.head_dim < 1 || p.seqlen < 0) fail("compute_delta: bad shape");
  if (p.zero_bytes > 0) {
    if (!p.zero) fail("compute_delta: zero is null");
    std::memset(p.zero, 0, p.zero_bytes);
  }
  if (p.seqlen == 0) return;
  if (!p.o.data || !p.d_o.data || !p.delta.data) fail("compute_delta: a pointer is null");
  const int D = p.head_dim;
  std::vector<Acc> o(static_cast<size_t>(D)), d_o(static_cast<size_t>(D));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int32_t h = 0; h < p.heads; ++h) {
      float* delta = stat_ptr(p.delta, b, h);
      for (int64_t i = 0; i < p.seqlen; ++i) {
        load(p.o_fp32 ? DType::fp32 : output_dtype(p.dtype), p.o.data, offset(p.o, b, i, h), D, o.data());
        load(p.dtype, p.d_o.data, offset(p.d_o, b, i, h), D, d_o.data(), p.descale_do);
        Acc sum = 0;
        for (int d = 0; d < D; ++d) sum += o[d] * d_o[d];
        delta[i] = float(sum);
      }
    }
}

namespace {

// Adds `n` Acc values, times `factor`, into fp32 memory.
template <class Acc> void add_into(float* dst, const Acc* src, int n, Acc factor) {
  for (int i = 0; i < n; ++i) dst[i] = float(Acc(dst[i]) + factor * src[i]);
}

} // namespace

namespace {

// The call's adds into dq, dk and dv (or dK and dV written, write_dkdv).
template <class Acc> void add_gradients(const BackwardParams& p) {
  check_call(p.dtype, p.batch, p.heads_q, p.heads_kv, p.head_dim, p.seqlen_q, p.seqlen_kv,
             p.segments, p.num_segments, p.blocks);
  if (p.softmax_scale < 0.f) fail("softmax_scale must be positive (0 means 1/sqrt(head_dim))");
  if (p.write_grads) fail("backward: the CPU reference adds into fp32 accumulators (write_grads is the cuDNN engine's)");
  if (p.write_dkdv && p.seqlen_q == 0)
    fail("backward: write_dkdv needs a call with queries (it writes its keys' dK and dV)");
  if (p.write_dkdv_fp32 && !p.write_dkdv) fail("backward: write_dkdv_fp32 goes with write_dkdv");
  if (std::string why = check_supported_do(p.dtype, p.dtype_do); !why.empty()) throw Error(why);  // (prefixed)
  if (std::string why = check_grad_addend(p); !why.empty()) throw Error(why);
  if (p.seqlen_q == 0 || p.seqlen_kv == 0) return;
  if (!p.q.data || !p.k.data || !p.v.data || !p.d_o.data || !p.lse.data || !p.delta.data ||
      !p.dq.data || !p.dk.data || !p.dv.data)
    fail("backward: a pointer is null");
  const int D = p.head_dim;
  const int group = p.heads_q / p.heads_kv;
  const Acc scale = resolve_scale(p.softmax_scale, D);
  const int64_t S = p.seqlen_kv;
  const std::vector<Region> regs = regions(p.seqlen_q, S, p.mask, p.segments, p.num_segments);
  constexpr Acc kNegInf = -std::numeric_limits<Acc>::infinity();
  // The keys write_dkdv writes: all of them, or those of a segment.
  std::vector<char> owned(size_t(S), p.num_segments > 0 ? 0 : 1);
  for (const Region& reg : regs)
    std::fill(owned.begin() + reg.col_begin, owned.begin() + reg.col_end, 1);

  // Keys and values both ways: [key][dim] for dQ's update, [dim][key] for the score loops.
  std::vector<Acc> k(size_t(S) * D), kt(size_t(S) * D), vt(size_t(S) * D), row(static_cast<size_t>(D));
  std::vector<Acc> dk(size_t(S) * D), dv(size_t(S) * D);
  std::vector<Acc> q(size_t(kRowTile) * D), d_o(size_t(kRowTile) * D), dq(size_t(kRowTile) * D);
  std::vector<Acc> pr(size_t(kRowTile) * kColTile), ds(size_t(kRowTile) * kColTile);
  Acc lse[kRowTile], delta[kRowTile];
  std::vector<KvTile> tiles;

  for (int64_t b = 0; b < p.batch; ++b) {
    for (int32_t hk = 0; hk < p.heads_kv; ++hk) {
      for (int64_t j = 0; j < S; ++j) {
        load(p.dtype, p.k.data, offset(p.k, b, j, hk), D, &k[size_t(j) * D], p.descale_k);
        for (int d = 0; d < D; ++d) kt[size_t(d) * S + j] = k[size_t(j) * D + d];
        load(p.dtype, p.v.data, offset(p.v, b, j, hk), D, row.data(), p.descale_v);
        for (int d = 0; d < D; ++d) vt[size_t(d) * S + j] = row[d];
      }
      std::fill(dk.begin(), dk.end(), Acc(0));
      std::fill(dv.begin(), dv.end(), Acc(0));
      for (int32_t hq = hk * group; hq < (hk + 1) * group; ++hq) {
        const float* lse_h = stat_ptr(p.lse, b, hq);
        const float* delta_h = stat_ptr(p.delta, b, hq);
        for (const Region& reg : regs) {
          for (int64_t r0 = reg.row_begin; r0 < reg.row_end; r0 += kRowTile) {
            const int rows = int(std::min<int64_t>(kRowTile, reg.row_end - r0));
            for (int r = 0; r < rows; ++r) {
              load(p.dtype, p.q.data, offset(p.q, b, r0 + r, hq), D, &q[size_t(r) * D], p.descale_q);
              load(do_dtype(p), p.d_o.data, offset(p.d_o, b, r0 + r, hq), D, &d_o[size_t(r) * D], p.descale_do);
              lse[r] = Acc(lse_h[r0 + r]);
              delta[r] = Acc(delta_h[r0 + r]);
            }
            std::fill(dq.begin(), dq.begin() + int64_t(rows) * D, Acc(0));
            kv_tiles(p.mask, p.blocks, reg, r0, r0 + rows, hq, S, tiles);
            for (const KvTile& kv : tiles) {
              const int cols = int(kv.c1 - kv.c0);
              // pr = q . k, ds = dO . v, both along keys.
              for (int r = 0; r < rows; ++r) {
                std::fill_n(&pr[size_t(r) * kColTile], cols, Acc(0));
                std::fill_n(&ds[size_t(r) * kColTile], cols, Acc(0));
              }
              for (int d = 0; d < D; ++d) {
                const Acc* krow = &kt[size_t(d) * S + kv.c0];
                const Acc* vrow = &vt[size_t(d) * S + kv.c0];
                for (int r = 0; r < rows; ++r) {
                  const Acc qd = q[size_t(r) * D + d], gd = d_o[size_t(r) * D + d];
                  Acc* pr_r = &pr[size_t(r) * kColTile];
                  Acc* ds_r = &ds[size_t(r) * kColTile];
                  for (int c = 0; c < cols; ++c) {
                    pr_r[c] += qd * krow[c];
                    ds_r[c] += gd * vrow[c];
                  }
                }
              }
              // P and dS; a row without keys (LSE = -inf) and masked pairs contribute nothing.
              for (int r = 0; r < rows; ++r) {
                Acc* pr_r = &pr[size_t(r) * kColTile];
                Acc* ds_r = &ds[size_t(r) * kColTile];
                for (int c = 0; c < cols; ++c) {
                  const bool on = lse[r] != kNegInf &&
                                  (!kv.masked || visible(p.mask, reg.row_pos(r0 + r),
                                                         reg.col_pos(kv.c0 + c)));
                  const Acc pv = on ? std::exp(scale * pr_r[c] - lse[r]) : Acc(0);
                  pr_r[c] = pv;
                  ds_r[c] = pv * (ds_r[c] - delta[r]);
                }
              }
              // dQ += dS K, dK += dS^T Q, dV += P^T dO (scale applied when added out).
              for (int r = 0; r < rows; ++r) {
                Acc* dq_r = &dq[size_t(r) * D];
                const Acc* q_r = &q[size_t(r) * D];
                const Acc* g_r = &d_o[size_t(r) * D];
                for (int c = 0; c < cols; ++c) {
                  const Acc dsv = ds[size_t(r) * kColTile + c], pv = pr[size_t(r) * kColTile + c];
                  if (pv == Acc(0)) continue; // dS is 0 where P is 0
                  const int64_t j = kv.c0 + c;
                  const Acc* k_j = &k[size_t(j) * D];
                  Acc* dk_j = &dk[size_t(j) * D];
                  Acc* dv_j = &dv[size_t(j) * D];
                  for (int d = 0; d < D; ++d) {
                    dq_r[d] += dsv * k_j[d];
                    dk_j[d] += dsv * q_r[d];
                    dv_j[d] += pv * g_r[d];
                  }
                }
              }
            }
            for (int r = 0; r < rows; ++r)
              add_into(static_cast<float*>(p.dq.data) + offset(p.dq, b, r0 + r, hq),
                       &dq[size_t(r) * D], D, scale);
          }
        }
      }
      for (int64_t j = 0; j < S; ++j) {
        if (p.write_dkdv) { // written: every key a call owns, zeros where no query sees it
          if (!owned[j]) continue;
          const DType out = p.write_dkdv_fp32 ? DType::fp32 : output_dtype(p.dtype);
          for (int d = 0; d < D; ++d) dk[size_t(j) * D + d] *= scale;
          if (p.dk_add.data && j >= p.add_begin && j < p.add_end)  // in fp32, as the kernels' registers
            for (auto [x, add] : {std::pair{&dk[size_t(j) * D], p.dk_add}, std::pair{&dv[size_t(j) * D], p.dv_add}}) {
              const float* from = static_cast<const float*>(add.data) + offset(add, b, j, hk);
              for (int d = 0; d < D; ++d) x[d] = Acc(float(x[d]) + from[d]);
            }
          store(out, p.dk.data, offset(p.dk, b, j, hk), D, &dk[size_t(j) * D]);
          store(out, p.dv.data, offset(p.dv, b, j, hk), D, &dv[size_t(j) * D]);
          continue;
        }
        add_into(static_cast<float*>(p.dk.data) + offset(p.dk, b, j, hk), &dk[size_t(j) * D], D,
                 scale);
        add_into(static_cast<float*>(p.dv.data) + offset(p.dv, b, j, hk), &dv[size_t(j) * D], D,
                 Acc(1));
      }
    }
  }
}

} // namespace

template <class Acc> void backward(const BackwardParams& p) {
  add_gradients<Acc>(p);
  if (p.dq_out.data && p.seqlen_q > 0) convert(dq_out_conversion(p));
}

template void compute_delta<float>(const DeltaParams&);
template void compute_delta<double>(const DeltaParams&);
template void backward<float>(const BackwardParams&);
template void backward<double>(const BackwardParams&);

} // namespace attncore::cpu
