// The core's operations on an instance's device: the CPU reference, or the CUDA kernels on the
// host's streams. A variant's schedule is written once against this and runs on both.
#pragma once

#include "attncore/attention.h"

#include <attnhost/plugin.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace attncore::plugin {

// Which implementation serves the attention calls (forward, backward) on a GPU; the operations
// around them (delta, merge, convert, add, ...) are always the core's own kernels.
//   native: the core's mma.sync kernels (attncore/cuda.h).
//   cudnn:  cuDNN (attncore/cudnn.h) for every call it serves, native for the rest.
//   auto:   cuDNN for the calls it serves where it measured faster, per pass, head dim and
//           length (native_measured_faster), native for the rest and for FP8 (auto_keeps_fp8).
// The choice is made per call and cached per shape; the CPU path ignores it.
enum class EngineChoice : int32_t { native = 0, cudnn = 1, automatic = 2 };
// "native", "cudnn", "auto"; anything else fails with ATTNHOST_ERR_INVALID_ARGUMENT.
EngineChoice engine_choice(const std::string& name);
const char* engine_choice_name(EngineChoice choice);
// auto's choice for one call on a GPU of compute capability sm_major.x, whose rows reach at most
// row_keys keys (a window's span; else seqlen_kv), under a causal mask or not: "" where cuDNN
// measured the faster, else the reason the native kernels serve it ("auto: the native backward
// measured faster or level for head_dim 128, 8192 x 8192"), which the engine's result line carries.
std::string native_measured_faster(bool forward, int sm_major, int32_t head_dim, int64_t seqlen_q, int64_t seqlen_kv,
                                   int64_t row_keys, bool causal);
// Why auto keeps a call of this dtype native whatever the speed ("" where it does not): FP8, since
// cuDNN's Hopper FP8 graph writes O in FP8 (3-4% more relative error in O).
std::string auto_keeps_fp8(DType dtype);
// The most keys a row of a call with this mask reaches: the window's span, or all of them.
int64_t row_keys(const Mask& mask, int64_t seqlen_kv);

struct EngineOptions {
  EngineChoice choice = EngineChoice::native;
  // The cuDNN engine's workspace comes from the host's allocator, and the line saying which engine
  // served how many calls goes to the host's log (at INFO, once, when the engine is destroyed).
  attnhost::Host host;
  // A call whose outputs are fp32 partials (a forward's O to merge, a backward's gradients to add)
  // is one cuDNN does not serve on the libraries measured (docs/KERNELS.md, "cuDNN engine"). With this
  // set, the engine lets cuDNN write such a call's outputs in the problem's dtype into scratch and
  // widens them into the fp32 ones: every partial is rounded once, as PyTorch's context parallelism
  // does, in exchange for cuDNN's speed. Off: partials stay exact (native kernels).
  bool dtype_partials = false;
};

// dst (fp32) = src (in `dtype`), or dst += src when `add`: [batch, token, head, dim] views.
struct WidenParams {
  DType dtype = DType::bf16;  // of src
  int32_t batch = 1, heads = 1, head_dim = 128;
  int64_t seqlen = 0;
  TensorRef src, dst;
  bool add = false;
};

class Engine {
 public:
  virtual ~Engine() = default;
  // cuda: the CUDA kernels (throws when attncore was built without CUDA); else the CPU
  // reference with float (or double, fp64) accumulation.
  static std::unique_ptr<Engine> make(bool cuda, bool fp64);
  // The same with an engine choice for the GPU's attention calls.
  static std::unique_ptr<Engine> make(bool cuda, bool fp64, const EngineOptions& options);

  virtual bool on_device() const = 0;
  virtual void forward(const ForwardParams& p, void* stream) = 0;
  virtual void compute_delta(const DeltaParams& p, void* stream) = 0;
  virtual void backward(const BackwardParams& p, void* stream) = 0;
  virtual void merge(const MergeParams& p, void* stream) = 0;
  virtual void convert(const ConvertParams& p, void* stream) = 0;
  virtual void zero(void* dst, size_t bytes, void* stream) = 0;
  // `rows` rows of `width` bytes from src (rows `src_pitch` bytes apart) to dst (`dst_pitch` apart):
  // a slice of heads packed into a buffer of its own, or unpacked.
  virtual void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows,
                         void* stream) = 0;
  virtual void fill(float* dst, float value, size_t count, void* stream) = 0;
  // dst[i] += src[i] for i < count, fp32: gradient partials sent home by other ranks.
  virtual void add(float* dst, const float* src, size_t count, void* stream) = 0;
  virtual void widen(const WidenParams& p, void* stream) = 0;
  using Event = std::shared_ptr<void>;  // a point in a stream's work (a CUDA event; null on the CPU)
  virtual Event record(void* stream) = 0;
  virtual void wait(void* stream, const Event& event) = 0;  // nothing for a null event
  virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;  // waits until done
  // Appended (3.1; after the others, so that their slots stay where 3.0 put them): max |x| of an
  // output (attention.h, AmaxParams).
  virtual void amax(const AmaxParams& p, void* stream) = 0;
  // Appended (8.2): whether backward call `p` adds its dK and dV into their fp32 accumulators by
  // atomics, so that another call may add into the same keys at the same time on another stream
  // (the native kernels do; a call cuDNN serves is added by a pass that reads and writes). An engine
  // that does not say is taken not to.
  virtual bool adds_atomically(const BackwardParams& p) {
    (void)p;
    return false;
  }
  // Appended (10.0): whether forward call `p`, a partial of rows an earlier call wrote (o_fp32, no
  // prior), is served with that earlier output merged in as its prior (ForwardParams::o_prior): the
  // native kernels and the CPU merge so; a call cuDNN would serve (partials in dtype) is made as a
  // partial and merged by a pass. An engine that does not say is taken not to.
  virtual bool merges_prior(const ForwardParams& p) {
    (void)p;
    return false;
  }
  // Appended (10.1): whether backward call `p` adds its dQ into the fp32 accumulator by atomics
  // (the native kernels do, but for reproducible calls; a call cuDNN serves is added by a pass that
  // reads and writes), so that a call over other keys may add into the same rows at the same time
  // on another stream. An engine that does not say is taken not to.
  virtual bool adds_dq_atomically(const BackwardParams& p) {
    (void)p;
    return false;
  }
  // Appended (10.2): copy_rows over `slices` slices, slice s of each `*_slice_pitch` bytes on from
  // the first: a block of a sharded tensor whose batch entries do not follow on at its row pitch
  // (plugin/blocks.h). The CUDA engine copies it in one launch; by default, one copy_rows a slice.
  virtual void copy_slices(void* dst, size_t dst_pitch, size_t dst_slice_pitch, const void* src, size_t src_pitch,
                           size_t src_slice_pitch, size_t width, size_t rows, size_t slices, void* stream) {
    for (size_t i = 0; i < slices; ++i)
      copy_rows(static_cast<char*>(dst) + i * dst_slice_pitch, dst_pitch,
                static_cast<const char*>(src) + i * src_slice_pitch, src_pitch, width, rows, stream);
  }

  // `to` waits for everything enqueued on `from` so far (an event on the GPU; nothing on the CPU,
  // where every operation has finished when it returns).
  void wait(void* to, void* from) {
    if (to != from) wait(to, record(from));
  }
};

// The core's dtype for the ABI's.
DType core_dtype(int32_t attnhost_dtype);

// The FP8 scaling a pass's arguments carry (ABI 1.4), or null: absent from an older host's
// arguments, and null for any problem but an FP8 one.
template <class Args> const attnhost_fp8_scaling* fp8_scaling(const Args& a) {
  return ATTNHOST_HAS_FIELD(&a, Args, fp8) ? a.fp8 : nullptr;
}
// Where the host asks for an FP8 problem's outputs' amax (ABI 1.5), or null.
template <class Args> attnhost_fp8_amax* fp8_amax(const Args& a) {
  return ATTNHOST_HAS_FIELD(&a, Args, amax) ? a.amax : nullptr;
}

}  // namespace attncore::plugin
