// CPU merge of fp32 partial outputs by their LSE, the final fp32 -> dtype conversion, and the
// outputs' amax.
#include <algorithm>
#include <vector>

#include "attncore/cpu.h"
#include "common.h"

namespace attncore::cpu {

using namespace detail;

void merge_partial(const MergeParams& p) {
  if (p.batch < 1 || p.heads < 1 || p.head_dim < 1 || p.seqlen < 0) fail("merge_partial: bad shape");
  if (p.seqlen == 0) return;
  if (!p.o_acc.data || !p.o_part.data || !p.lse_acc.data || !p.lse_part.data)
    fail("merge_partial: a pointer is null");
  if (p.o_out.data && p.out_dtype != DType::bf16 && p.out_dtype != DType::fp16)
    fail("merge_partial: out_dtype must be bf16 or fp16");
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int D = p.head_dim;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int32_t h = 0; h < p.heads; ++h) {
      float* lse_acc = stat_ptr(p.lse_acc, b, h);
      const float* lse_part = stat_ptr(p.lse_part, b, h);
      for (int64_t i = 0; i < p.seqlen; ++i) {
        float* o = static_cast<float*>(p.o_acc.data) + offset(p.o_acc, b, i, h);
        const float* op = static_cast<const float*>(p.o_part.data) + offset(p.o_part, b, i, h);
        const float la = lse_acc[i], lp = lse_part[i];
        const float hi = std::max(la, lp);
        if (hi == kNegInf) { // neither side saw a key
          std::fill_n(o, D, 0.f);
          lse_acc[i] = kNegInf;
        } else {
          // logaddexp, stable: the larger side factors out, the smaller enters through log1p.
          const float lse = hi + std::log1p(std::exp(std::min(la, lp) - hi));
          const float wa = la == kNegInf ? 0.f : std::exp(la - lse);
          const float wp = lp == kNegInf ? 0.f : std::exp(lp - lse);
          for (int d = 0; d < D; ++d) o[d] = wa * o[d] + wp * op[d];
          lse_acc[i] = lse;
        }
        if (p.o_out.data) store(p.out_dtype, p.o_out.data, offset(p.o_out, b, i, h), D, o);
      }
    }
}

void convert(const ConvertParams& p) {
  if (p.dtype != DType::bf16 && p.dtype != DType::fp16 && p.dtype != DType::fp32)
    fail("convert: dtype must be bf16, fp16 or fp32");
  if (p.batch < 1 || p.heads < 1 || p.head_dim < 1 || p.seqlen < 0) fail("convert: bad shape");
  if (p.seqlen == 0) return;
  if (!p.src.data || !p.dst.data) fail("convert: a pointer is null");
  std::vector<float> sum(size_t(p.head_dim));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int32_t h = 0; h < p.heads; ++h)
      for (int64_t i = 0; i < p.seqlen; ++i) {
        const float* x = static_cast<const float*>(p.src.data) + offset(p.src, b, i, h);
        if (p.add.data) {
          const float* y = static_cast<const float*>(p.add.data) + offset(p.add, b, i, h);
          for (int32_t d = 0; d < p.head_dim; ++d) sum[size_t(d)] = x[d] + y[d];
          x = sum.data();
        }
        store(p.dtype, p.dst.data, offset(p.dst, b, i, h), p.head_dim, x);
      }
}

void amax(const AmaxParams& p) {
  if (p.dtype != DType::bf16 && p.dtype != DType::fp16 && p.dtype != DType::fp32)
    fail("amax: dtype must be bf16, fp16 or fp32");
  if (p.batch < 1 || p.heads < 1 || p.head_dim < 1 || p.seqlen < 0) fail("amax: bad shape");
  if (!p.amax || (p.seqlen > 0 && !p.x.data)) fail("amax: a pointer is null");
  float most = 0.f;
  std::vector<float> row(size_t(p.head_dim));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t i = 0; i < p.seqlen; ++i)
      for (int32_t h = 0; h < p.heads; ++h) {
        load(p.dtype, p.x.data, offset(p.x, b, i, h), p.head_dim, row.data());
        for (float x : row)
          if (!std::isnan(x)) most = std::max(most, std::abs(x));
      }
  *p.amax = most;
}

} // namespace attncore::cpu
