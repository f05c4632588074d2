#include "attncore/cpu.h"
#include "attncore/numeric.h"
#include "attncore/plugin/engine.h"

#include <algorithm>
#include <cstring>

namespace attncore::plugin {

DType core_dtype(int32_t d) {
  switch (d) {
    case ATTNHOST_DTYPE_BF16: return DType::bf16;
    case ATTNHOST_DTYPE_FP16: return DType::fp16;
    case ATTNHOST_DTYPE_FP32: return DType::fp32;
    case ATTNHOST_DTYPE_FP8_E4M3: return DType::fp8_e4m3;
    case ATTNHOST_DTYPE_FP8_E5M2: return DType::fp8_e5m2;
    default: attnhost::fail(ATTNHOST_ERR_UNSUPPORTED, std::string("dtype ") + attnhost::dtype_name(d) + " is not supported");
  }
}

namespace {

template <class Acc>
class CpuEngine final : public Engine {
 public:
  bool on_device() const override { return false; }
  void forward(const ForwardParams& p, void*) override { cpu::forward<Acc>(p); }
  bool merges_prior(const ForwardParams&) override { return true; }
  void compute_delta(const DeltaParams& p, void*) override { cpu::compute_delta<Acc>(p); }
  void backward(const BackwardParams& p, void*) override { cpu::backward<Acc>(p); }
  void merge(const MergeParams& p, void*) override { cpu::merge_partial(p); }
  void convert(const ConvertParams& p, void*) override { cpu::convert(p); }
  void amax(const AmaxParams& p, void*) override { cpu::amax(p); }
  void zero(void* dst, size_t bytes, void*) override { std::memset(dst, 0, bytes); }
  void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows,
                 void*) override {
    for (size_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, width);
  }
  void fill(float* dst, float value, size_t count, void*) override { std::fill_n(dst, count, value); }
  void add(float* dst, const float* src, size_t count, void*) override {
    for (size_t i = 0; i < count; ++i) dst[i] += src[i];
  }
  void widen(const WidenParams& p, void*) override {
    for (int32_t b = 0; b < p.batch; ++b)
      for (int64_t t = 0; t < p.seqlen; ++t)
        for (int32_t h = 0; h < p.heads; ++h) {
          const int64_t s = b * p.src.batch_stride + t * p.src.token_stride + h * p.src.head_stride;
          float* dst = static_cast<float*>(p.dst.data) + b * p.dst.batch_stride + t * p.dst.token_stride +
                       h * p.dst.head_stride;
          for (int32_t d = 0; d < p.head_dim; ++d) {
            const float x = widened(p, s + d);
            dst[d] = p.add ? dst[d] + x : x;
          }
        }
  }
  Event record(void*) override { return nullptr; }
  void wait(void*, const Event&) override {}
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }

 private:
  static float widened(const WidenParams& p, int64_t i) {
    switch (p.dtype) {
      case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(p.src.data)[i]);
      case DType::fp16: return fp16_to_float(static_cast<const uint16_t*>(p.src.data)[i]);
      default: return static_cast<const float*>(p.src.data)[i];
    }
  }
};

}  // namespace

#if ATTNCORE_HAVE_CUDA
std::unique_ptr<Engine> make_cuda_engine();  // engine_cuda.cu
std::unique_ptr<Engine> make_selecting_engine(std::unique_ptr<Engine> native, const EngineOptions& options);  // engine_select.cpp
#endif

EngineChoice engine_choice(const std::string& name) {
  if (name == "native") return EngineChoice::native;
  if (name == "cudnn") return EngineChoice::cudnn;
  if (name == "auto") return EngineChoice::automatic;
  attnhost::fail(ATTNHOST_ERR_INVALID_ARGUMENT, "engine \"" + name + "\": expected auto, native or cudnn");
}

// `auto`'s rule (engine.h), per pass: attncore's own cuDNN engine against the Hopper kernels on an
// H200, both writing the dtype (docs/KERNELS.md, "Which engine auto takes"). Forward: cuDNN at head
// dims 64 and 256 (7-13%), and at 128 where a row reaches up to 4096 keys (6-13%), or up to 12288
// under a causal mask (1-3%: 8192 x 8192, and 2048-4096 rows against 4096-12288 keys, the chunks of
// a context-parallel rank); native from 16384 keys, and from 8192 without a mask. Backward: cuDNN
// at 64, 96 and 256 (5-23%), and at 128 where a row reaches up to 2048 keys (4%; native 1-8% ahead
// from 4096). A sliding window's rows reach its span, not the block: 512-key windows at d128 ran
// 10% slower natively. Head dim 80 stays native both ways; other architectures and blocks under
// 2048 x 2048 stay native until measured. Empty when cuDNN is the faster; else why not.
std::string native_measured_faster(bool forward, int sm_major, int32_t head_dim, int64_t seqlen_q, int64_t seqlen_kv,
                                   int64_t row_keys, bool causal) {
  const std::string pass = forward ? "forward" : "backward";
  std::string shape = "head_dim " + std::to_string(head_dim) + ", " + std::to_string(seqlen_q) + " x " +
                      std::to_string(seqlen_kv) + (causal ? " causal" : "");
  if (row_keys < seqlen_kv) shape += " (rows of " + std::to_string(row_keys) + " keys)";
  if (sm_major != 9 || seqlen_q < 2048 || seqlen_kv < 2048)
    return "auto: cuDNN not measured faster for sm_" + std::to_string(sm_major) + "x, " + shape;
  const int64_t keys = std::min(row_keys, seqlen_kv);
  const int64_t d128_keys = forward ? (causal ? 12288 : 4096) : 2048;  // the most at which cuDNN wins
  const bool d128 = head_dim == 128 && keys <= d128_keys;
  const bool faster = forward ? head_dim == 64 || head_dim == 256 || d128
                              : head_dim == 64 || head_dim == 96 || head_dim == 256 || d128;
  if (faster) return "";
  return "auto: the native " + pass + " measured faster or level for " + shape;
}

// cuDNN's FP8 forward on Hopper writes O in e4m3, which a kernel widens: 3-4% relative error in O
// against the native forward's bf16 O (docs/KERNELS.md, "cuDNN engine"), a cost no speed pays for
// by default; engine=cudnn still takes it.
std::string auto_keeps_fp8(DType dtype) {
  return is_fp8(dtype) ? "auto: FP8 stays native (cuDNN's Hopper FP8 graph writes O in FP8: 3-4% more error)" : "";
}

int64_t row_keys(const Mask& mask, int64_t seqlen_kv) {
  if (mask.window_left < 0 || mask.window_right < 0) {
    // Unbounded on one side: a causal mask bounds the right at the row itself.
    if (mask.window_left >= 0 && mask.causal) return std::min(seqlen_kv, mask.window_left + 1);
    return seqlen_kv;
  }
  return std::min(seqlen_kv, mask.window_left + mask.window_right + 1);
}

const char* engine_choice_name(EngineChoice choice) {
  switch (choice) {
    case EngineChoice::cudnn: return "cudnn";
    case EngineChoice::automatic: return "auto";
    default: return "native";
  }
}

std::unique_ptr<Engine> Engine::make(bool cuda, bool fp64) {
  if (cuda) {
#if ATTNCORE_HAVE_CUDA
    return make_cuda_engine();
#else
    attnhost::fail(ATTNHOST_ERR_UNSUPPORTED, "this plugin was built without CUDA");
#endif
  }
  if (fp64) return std::make_unique<CpuEngine<double>>();
  return std::make_unique<CpuEngine<float>>();
}

std::unique_ptr<Engine> Engine::make(bool cuda, bool fp64, const EngineOptions& options) {
#if ATTNCORE_HAVE_CUDA
  if (cuda) return make_selecting_engine(make_cuda_engine(), options);
#endif
  return make(cuda, fp64);
}

}  // namespace attncore::plugin
