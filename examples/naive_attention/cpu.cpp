// The CPU back end: the same loops as the CUDA one, in float or double.
#include "naive_attention.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace naive {

namespace {

float load(const void* p, int32_t dtype, int64_t i) {
  if (dtype == 3) return static_cast<const float*>(p)[i];
  if (dtype == 8 || dtype == 9) return fp8_to_float(static_cast<const uint8_t*>(p)[i], dtype);
  uint16_t h = static_cast<const uint16_t*>(p)[i];
  uint32_t bits;
  if (dtype == 1) {
    bits = static_cast<uint32_t>(h) << 16;
  } else {  // fp16 -> fp32
    uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) bits = sign | 0x7f800000u | (man << 13);
    else if (exp == 0) {
      float v = std::ldexp(static_cast<float>(man), -24);
      return sign ? -v : v;
    } else bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// An input element times its tensor's descale.
float load(const void* p, int32_t dtype, float descale, int64_t i) { return load(p, dtype, i) * descale; }

void store(void* p, int32_t dtype, int64_t i, float f) {
  if (dtype == 3) {
    static_cast<float*>(p)[i] = f;
    return;
  }
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t out;
  if (dtype == 1) {
    out = std::isnan(f) ? 0x7fc0 : static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
  } else {  // fp32 -> fp16, round to nearest even, through the exact scaling trick
    uint32_t sign = (u >> 16) & 0x8000, a = u & 0x7fffffff;
    if (a > 0x7f800000) out = static_cast<uint16_t>(sign | 0x7e00);
    else if (a >= 0x477ff000) out = static_cast<uint16_t>(sign | 0x7c00);
    else if (a < 0x38800000) out = static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(std::fabs(f) * 16777216.0f)));
    else {
      uint32_t r = a - 0x38000000;
      r += 0xfff + ((r >> 13) & 1);
      out = static_cast<uint16_t>(sign | (r >> 13));
    }
  }
  static_cast<uint16_t*>(p)[i] = out;
}

int64_t local_row(const Geometry& g, int64_t b, int64_t slot, int32_t h, int32_t heads, int64_t chunk) {
  return ((b * chunk + slot) * heads + h) * g.head_dim;
}

template <class Acc>
void forward_rows(const Geometry& g, const Types& ty, const void* q, const void* k, const void* v, void* o, float* lse) {
  const int D = g.head_dim;
  std::vector<Acc> qv(D), acc(D);
  for (int64_t b = 0; b < g.batch; ++b)
    for (int32_t h = 0; h < g.heads_q; ++h)
      for (int64_t slot = 0; slot < g.chunk_q; ++slot) {
        const int64_t i = g.q_begin() + slot;
        const int64_t row = local_row(g, b, slot, h, g.heads_q, g.chunk_q);
        float* lse_out = &lse[(b * g.heads_q + h) * g.chunk_q + slot];
        Interval keys = i < g.seqlen_q ? keys_of(g, i) : Interval{0, 0};
        for (int d = 0; d < D; ++d) {
          qv[d] = static_cast<Acc>(load(q, ty.in, ty.descale_q, row + d));
          acc[d] = 0;
        }
        Acc m = -std::numeric_limits<Acc>::infinity(), l = 0;
        for (int64_t j = keys.lo; j < keys.hi; ++j) {  // online softmax
          const int64_t kr = gathered_row(g, b, j, g.kv_head(h));
          Acc s = 0;
          for (int d = 0; d < D; ++d) s += qv[d] * static_cast<Acc>(load(k, ty.in, ty.descale_k, kr + d));
          s *= static_cast<Acc>(g.scale);
          Acc m_new = std::max(m, s);
          Acc correction = std::exp(m - m_new), p = std::exp(s - m_new);
          l = l * correction + p;
          for (int d = 0; d < D; ++d) acc[d] = acc[d] * correction + p * static_cast<Acc>(load(v, ty.in, ty.descale_v, kr + d));
          m = m_new;
        }
        for (int d = 0; d < D; ++d) store(o, ty.out, row + d, l > 0 ? static_cast<float>(acc[d] / l) : 0.f);
        *lse_out = l > 0 ? static_cast<float>(m + std::log(l)) : -std::numeric_limits<float>::infinity();
      }
}

template <class Acc>
void backward_rows(const Geometry& g, const Types& ty, const void* q, const void* k, const void* v, const void* o,
                   const float* lse, const void* d_o, void* dq, float* dk_part, float* dv_part) {
  const int D = g.head_dim;
  std::vector<Acc> qv(D), dov(D), dqv(D);
  for (int64_t b = 0; b < g.batch; ++b)
    for (int32_t h = 0; h < g.heads_q; ++h)
      for (int64_t slot = 0; slot < g.chunk_q; ++slot) {
        const int64_t i = g.q_begin() + slot;
        const int64_t row = local_row(g, b, slot, h, g.heads_q, g.chunk_q);
        Interval keys = i < g.seqlen_q ? keys_of(g, i) : Interval{0, 0};
        const Acc row_lse = lse[(b * g.heads_q + h) * g.chunk_q + slot];
        Acc delta = 0;
        for (int d = 0; d < D; ++d) {
          qv[d] = static_cast<Acc>(load(q, ty.in, ty.descale_q, row + d));
          dov[d] = static_cast<Acc>(load(d_o, ty.in, ty.descale_do, row + d));
          delta += dov[d] * static_cast<Acc>(load(o, ty.out, 1.f, row + d));
          dqv[d] = 0;
        }
        for (int64_t j = keys.lo; j < keys.hi; ++j) {
          const int64_t kr = gathered_row(g, b, j, g.kv_head(h));
          Acc s = 0, dp = 0;
          for (int d = 0; d < D; ++d) {
            s += qv[d] * static_cast<Acc>(load(k, ty.in, ty.descale_k, kr + d));
            dp += dov[d] * static_cast<Acc>(load(v, ty.in, ty.descale_v, kr + d));
          }
          const Acc p = std::exp(s * static_cast<Acc>(g.scale) - row_lse);
          const Acc ds = p * (dp - delta) * static_cast<Acc>(g.scale);
          for (int d = 0; d < D; ++d) {
            dqv[d] += ds * static_cast<Acc>(load(k, ty.in, ty.descale_k, kr + d));
            dk_part[kr + d] += static_cast<float>(ds * qv[d]);
            dv_part[kr + d] += static_cast<float>(p * dov[d]);
          }
        }
        for (int d = 0; d < D; ++d) store(dq, ty.out, row + d, static_cast<float>(dqv[d]));
      }
}

}  // namespace

void forward_cpu(const Geometry& g, const Types& ty, const void* q, const void* k, const void* v, void* o, float* lse,
                 bool fp64) {
  if (fp64) forward_rows<double>(g, ty, q, k, v, o, lse);
  else forward_rows<float>(g, ty, q, k, v, o, lse);
}

void backward_cpu(const Geometry& g, const Types& ty, const void* q, const void* k, const void* v, const void* o,
                  const float* lse, const void* d_o, void* dq, float* dk_part, float* dv_part, bool fp64) {
  const int64_t n = static_cast<int64_t>(g.world_size) * g.batch * g.chunk_kv * g.heads_kv * g.head_dim;
  std::memset(dk_part, 0, n * sizeof(float));
  std::memset(dv_part, 0, n * sizeof(float));
  if (fp64) backward_rows<double>(g, ty, q, k, v, o, lse, d_o, dq, dk_part, dv_part);
  else backward_rows<float>(g, ty, q, k, v, o, lse, d_o, dq, dk_part, dv_part);
}

void convert_cpu(const float* in, void* out, int32_t dtype, int64_t n) {
  for (int64_t i = 0; i < n; ++i) store(out, dtype, i, in[i]);
}

}  // namespace naive
