// The core's operations on an instance's device: the CPU reference, or the CUDA kernels on the
// host's streams. A variant's schedule is written once against this and runs on both.
#pragma once

#include "attncore/attention.h"

#include <attnhost/plugin.hpp>

#include <cstddef>
#include <memory>

namespace attncore::plugin {

class Engine {
 public:
  virtual ~Engine() = default;
  // cuda: the CUDA kernels (throws when attncore was built without CUDA); else the CPU
  // reference with float (or double, fp64) accumulation.
  static std::unique_ptr<Engine> make(bool cuda, bool fp64);

  virtual bool on_device() const = 0;
  virtual void forward(const ForwardParams& p, void* stream) = 0;
  virtual void compute_delta(const DeltaParams& p, void* stream) = 0;
  virtual void backward(const BackwardParams& p, void* stream) = 0;
  virtual void merge(const MergeParams& p, void* stream) = 0;
  virtual void convert(const ConvertParams& p, void* stream) = 0;
  virtual void zero(void* dst, size_t bytes, void* stream) = 0;
  virtual void fill(float* dst, float value, size_t count, void* stream) = 0;
  // dst[i] += src[i] for i < count, fp32: gradient partials sent home by other ranks.
  virtual void add(float* dst, const float* src, size_t count, void* stream) = 0;
  virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;  // waits until done
  // `to` waits for everything enqueued on `from` so far (an event on the GPU; nothing on the CPU,
  // where every operation has finished when it returns).
  virtual void wait(void* to, void* from) = 0;
};

// The core's dtype for the ABI's.
DType core_dtype(int32_t attnhost_dtype);

}  // namespace attncore::plugin
