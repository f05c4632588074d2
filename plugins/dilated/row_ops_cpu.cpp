#include "row_ops.h"

#include "attncore/numeric.h"

#include <attnhost/plugin.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace dilated {

namespace {

class CpuRowOps final : public RowOps {
 public:
  void copy(const std::vector<RowCopy>& jobs, int32_t batch, void*) override {
    for (const RowCopy& c : jobs)
      for (int32_t b = 0; b < batch; ++b) {
        char* dst = static_cast<char*>(c.dst) + b * c.dst_batch_bytes;
        const char* src = static_cast<const char*>(c.src) + b * c.src_batch_bytes;
        for (int64_t j = 0; j < c.rows; ++j) {
          const int64_t d = c.dst_rows ? c.dst_rows[j] : j, s = c.src_rows ? c.src_rows[j] : j;
          if (d >= 0 && s >= 0) std::memcpy(dst + d * c.row_bytes, src + s * c.row_bytes, c.row_bytes);
        }
      }
  }

  void sum(const RowSum& a, int32_t batch, void*) override {
    const int32_t n = a.row_floats;
    std::vector<float> acc(n);
    for (int32_t b = 0; b < batch; ++b)
      for (int64_t j = 0; j < a.rows; ++j) {
        const float* base = a.base + b * a.batch + j * n;
        std::copy(base, base + n, acc.begin());
        for (const SumPart& p : a.parts)
          for (int32_t f = 0; f < p.fan; ++f) {
            const int64_t s = p.rows[j * p.fan + f];
            if (s < 0) continue;
            const float* src = p.src + b * p.batch + s * n;
            for (int32_t d = 0; d < n; ++d) acc[d] += src[d];
          }
        store(a.dst, a.dtype, b * a.batch + j * n, acc.data(), n);
      }
  }

  void scatter_add(const RowScatterAdd& a, int32_t batch, void*) override {
    for (int32_t b = 0; b < batch; ++b)
      for (int64_t j = 0; j < a.rows; ++j) {
        const int64_t d = a.dst_rows[j];
        if (d < 0) continue;
        float* dst = a.dst + b * a.dst_batch + d * a.row_floats;
        const float* src = a.src + b * a.src_batch + j * a.row_floats;
        for (int32_t i = 0; i < a.row_floats; ++i) dst[i] += src[i];
      }
  }

  void combine(const Combine& c, int32_t batch, void*) override {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    const int32_t D = c.head_dim;
    std::vector<float> acc(D);
    for (int32_t b = 0; b < batch; ++b)
      for (int64_t t = 0; t < c.tokens; ++t)
        for (int32_t h = 0; h < c.heads; ++h) {
          const int64_t j = t * c.heads + h;
          float hi = kNegInf;
          for (const CombinePart& p : c.parts)
            if (p.rows[j] >= 0) hi = std::max(hi, p.lse[b * p.lse_batch + p.rows[j]]);
          float lse = kNegInf;
          std::fill(acc.begin(), acc.end(), 0.f);
          if (hi != kNegInf) {
            float sum = 0.f;
            for (const CombinePart& p : c.parts)
              if (p.rows[j] >= 0) sum += std::exp(p.lse[b * p.lse_batch + p.rows[j]] - hi);
            lse = hi + std::log(sum);
            for (const CombinePart& p : c.parts) {
              if (p.rows[j] < 0) continue;
              const float l = p.lse[b * p.lse_batch + p.rows[j]];
              if (l == kNegInf) continue;
              const float weight = std::exp(l - lse);
              const float* o = p.o + b * p.o_batch + p.rows[j] * D;
              for (int32_t d = 0; d < D; ++d) acc[d] += weight * o[d];
            }
          }
          c.lse[(int64_t(b) * c.heads + h) * c.tokens + t] = lse;
          store(c.o, c.dtype, (int64_t(b) * c.tokens * c.heads + j) * D, acc.data(), D);
        }
  }

 private:
  static void store(void* dst, int32_t dtype, int64_t at, const float* v, int32_t n) {
    switch (dtype) {
      case ATTNHOST_DTYPE_BF16:
        for (int32_t d = 0; d < n; ++d) static_cast<uint16_t*>(dst)[at + d] = attncore::float_to_bf16(v[d]);
        break;
      case ATTNHOST_DTYPE_FP16:
        for (int32_t d = 0; d < n; ++d) static_cast<uint16_t*>(dst)[at + d] = attncore::float_to_fp16(v[d]);
        break;
      case ATTNHOST_DTYPE_FP32: std::memcpy(static_cast<float*>(dst) + at, v, n * sizeof(float)); break;
      default: attnhost::fail(ATTNHOST_ERR_INTERNAL, "dilated: outputs are bf16, fp16 or fp32");
    }
  }
};

}  // namespace

#if ATTNCORE_HAVE_CUDA
std::unique_ptr<RowOps> make_cuda_row_ops();  // row_ops_cuda.cu
#endif

std::unique_ptr<RowOps> RowOps::make(bool cuda) {
  if (cuda) {
#if ATTNCORE_HAVE_CUDA
    return make_cuda_row_ops();
#else
    attnhost::fail(ATTNHOST_ERR_UNSUPPORTED, "the dilated plugin was built without CUDA");
#endif
  }
  return std::make_unique<CpuRowOps>();
}

}  // namespace dilated
