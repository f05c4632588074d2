// A rank's device: memory (accounted), streams, timers, and the few kernels the host itself
// needs (data generation, poisoning, non-finite scans). One implementation for the CPU, one for
// CUDA (cuda_device.cu); the runner is written once against this interface.
#pragma once

#include "runtime/data.h"
#include "runtime/gpu_board.h"

#include <attnhost/plugin.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace attnhost {

enum class DeviceKind { cpu, cuda };

const char* device_kind_name(DeviceKind kind);

// Thrown by Device::alloc: the case ends as OOM with both sizes.
struct OutOfMemory : std::exception {
  OutOfMemory(size_t asked, size_t free, int rank);
  const char* what() const noexcept override { return message.c_str(); }
  size_t asked, free;
  std::string message;
};

// A point in a stream's timeline (a CUDA event, or a steady-clock reading on the CPU).
class Marker {
 public:
  virtual ~Marker() = default;
  virtual void record(void* stream) = 0;
  // Milliseconds from `start` to this marker; both recorded, this one complete.
  virtual double since(const Marker& start) const = 0;
};

// FP8 problems (ABI 1.4): the inputs (Q, K, V, dO) in the problem's FP8 dtype, each scaled by
// data::fp8_scale; the outputs (O, dQ, dK, dV) in bf16.
ATTNHOST_HD bool is_fp8(int32_t dtype) { return dtype == ATTNHOST_DTYPE_FP8_E4M3 || dtype == ATTNHOST_DTYPE_FP8_E5M2; }
ATTNHOST_HD data::Fp8Format fp8_format(int32_t dtype) {
  return dtype == ATTNHOST_DTYPE_FP8_E5M2 ? data::e5m2() : data::e4m3();
}
inline int32_t output_dtype(int32_t dtype) { return is_fp8(dtype) ? ATTNHOST_DTYPE_BF16 : dtype; }
// The dtype of an input (data::kQ, kK, kV, kDO): the problem's, but dO's is grad_dtype where that is
// set (ABI 1.6: e5m2 beside e4m3 inputs, the hybrid FP8 recipe).
inline int32_t input_dtype(const attnhost_problem& p, uint32_t tensor) {
  return tensor == data::kDO && p.grad_dtype != 0 ? p.grad_dtype : p.dtype;
}
// What an input element stands for per unit of its storage: 1 / its FP8 scale, or 1.
inline double input_descale(const data::Params& params, int32_t dtype) {
  return is_fp8(dtype) ? 1.0 / data::fp8_scale(params, fp8_format(dtype)) : 1.0;
}

// Where generated data goes: a local [B, tokens, H, D] (or LSE-like [B, H, tokens]) tensor.
struct GenerateSpec {
  data::Params params;
  uint32_t tensor = data::kQ;
  int32_t dtype = ATTNHOST_DTYPE_BF16;
  int64_t batch = 1, local_tokens = 0;
  int32_t heads = 1, head_dim = 1;
  std::vector<attnhost_token_range> ranges; // global token of each local slot
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  virtual int ordinal() const = 0;
  virtual std::string name() const = 0;

  // Memory, accounted per rank. alloc throws OutOfMemory; free(nullptr) is a no-op.
  void* alloc(size_t bytes);
  void free(void* ptr);
  size_t current_bytes() const { return current_; }
  size_t peak_bytes() const { return peak_; }
  void reset_peak() { peak_ = current_; }
  size_t live_allocations() const { return sizes_.size(); }

  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill_bytes(void* dst, int value, size_t bytes) = 0;

  virtual void* stream(int index) = 0; // 0 timed; 1 and 2 auxiliary at the greatest priority, 3 at 0's; NULL on the CPU
  virtual void synchronize() = 0;      // waits for every stream
  virtual std::unique_ptr<Marker> marker() = 0;
  virtual void flush_l2() = 0;         // evicts caches between timed samples
  // The board's SM clock and power now (gpu_board.h); nullopt on the CPU or without NVML.
  virtual std::optional<GpuReading> read_board() const { return std::nullopt; }

  // Host kernels: fill a local tensor with generated data (padding slots get zero); fill it with
  // NaN so unwritten results show; count non-finite elements of real tokens (NaN, +/-inf; with
  // allow_neg_inf, -inf does not count).
  virtual void generate(void* dst, const GenerateSpec& spec) = 0;
  virtual void poison(void* dst, int32_t dtype, size_t count) = 0;
  virtual int64_t count_nonfinite(const void* src, int32_t dtype, size_t count, bool allow_neg_inf) = 0;

  int rank = 0; // for messages

 protected:
  virtual void* raw_alloc(size_t bytes) = 0;       // nullptr when out of memory
  virtual void raw_free(void* ptr) = 0;
  virtual size_t free_memory() const = 0;

 private:
  size_t current_ = 0, peak_ = 0;
  std::vector<std::pair<void*, size_t>> sizes_;
};

std::unique_ptr<Device> make_cpu_device();
#if ATTNHOST_HAVE_CUDA
std::unique_ptr<Device> make_cuda_device(int ordinal);
int cuda_device_count();          // 0 when no driver or no GPU
#endif

// Fill on the CPU: shared by the CPU device and the reference check.
void generate_cpu(void* dst, const GenerateSpec& spec);
// One element as the plugin sees it (rounded to dtype; an FP8 one times its descale), widened to
// double.
double generated_element(const data::Params& params, uint32_t tensor, int32_t dtype, int64_t batch,
                         int64_t token, int32_t head, int32_t dim);
// Element i of a buffer of dtype, widened to double (an FP8 element as stored, not descaled).
double load_element(const void* base, int32_t dtype, size_t i);

}  // namespace attnhost
