#include "runtime/device.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>

namespace attnhost {

const char* device_kind_name(DeviceKind kind) { return kind == DeviceKind::cuda ? "cuda" : "cpu"; }

namespace {
std::string gib(size_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}
}  // namespace

OutOfMemory::OutOfMemory(size_t asked, size_t free, int rank) : asked(asked), free(free) {
  message = "out of memory on rank " + std::to_string(rank) + ": asked " + gib(asked) + ", " + gib(free) + " free";
}

void* Device::alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = raw_alloc(bytes);
  if (!p) throw OutOfMemory(bytes, free_memory(), rank);
  sizes_.emplace_back(p, bytes);
  current_ += bytes;
  peak_ = std::max(peak_, current_);
  return p;
}

void Device::free(void* ptr) {
  if (!ptr) return;
  auto it = std::find_if(sizes_.begin(), sizes_.end(), [&](const auto& e) { return e.first == ptr; });
  if (it == sizes_.end()) return;  // not ours: never free what we did not allocate
  current_ -= it->second;
  sizes_.erase(it);
  raw_free(ptr);
}

double load_element(const void* base, int32_t dtype, size_t i) {
  switch (dtype) {
    case ATTNHOST_DTYPE_BF16: return data::from_bf16(static_cast<const uint16_t*>(base)[i]);
    case ATTNHOST_DTYPE_FP16: return data::from_fp16(static_cast<const uint16_t*>(base)[i]);
    case ATTNHOST_DTYPE_FP32: return static_cast<const float*>(base)[i];
    case ATTNHOST_DTYPE_FP64: return static_cast<const double*>(base)[i];
    case ATTNHOST_DTYPE_FP8_E4M3:
    case ATTNHOST_DTYPE_FP8_E5M2: return data::from_fp8(static_cast<const uint8_t*>(base)[i], fp8_format(dtype));
    default: return std::numeric_limits<double>::quiet_NaN();
  }
}

double generated_element(const data::Params& params, uint32_t tensor, int32_t dtype, int64_t batch,
                         int64_t token, int32_t head, int32_t dim) {
  float v = data::element_value(params, tensor, batch, token, head, dim);
  if (dtype == ATTNHOST_DTYPE_BF16) return data::from_bf16(data::to_bf16(v));
  if (dtype == ATTNHOST_DTYPE_FP16) return data::from_fp16(data::to_fp16(v));
  if (is_fp8(dtype)) {
    const float scale = data::fp8_scale(params, fp8_format(dtype));
    return static_cast<double>(data::from_fp8(data::to_fp8(v * scale, fp8_format(dtype)), fp8_format(dtype))) / scale;
  }
  return v;
}

void generate_cpu(void* dst, const GenerateSpec& s) {
  const size_t row = static_cast<size_t>(s.heads) * s.head_dim;
  const size_t elem = s.dtype == ATTNHOST_DTYPE_FP32 ? 4 : is_fp8(s.dtype) ? 1 : 2;
  const float fp8_scale = is_fp8(s.dtype) ? data::fp8_scale(s.params, fp8_format(s.dtype)) : 1.f;
  std::memset(dst, 0, static_cast<size_t>(s.batch) * s.local_tokens * row * elem);
  for (int64_t b = 0; b < s.batch; ++b)
    for (const attnhost_token_range& r : s.ranges)
      for (int64_t t = 0; t < r.length; ++t) {
        size_t base = (static_cast<size_t>(b) * s.local_tokens + r.local_begin + t) * row;
        for (int32_t h = 0; h < s.heads; ++h)
          for (int32_t d = 0; d < s.head_dim; ++d) {
            float v = data::element_value(s.params, s.tensor, b, r.global_begin + t, h, d);
            size_t i = base + static_cast<size_t>(h) * s.head_dim + d;
            if (s.dtype == ATTNHOST_DTYPE_BF16) static_cast<uint16_t*>(dst)[i] = data::to_bf16(v);
            else if (s.dtype == ATTNHOST_DTYPE_FP16) static_cast<uint16_t*>(dst)[i] = data::to_fp16(v);
            else if (is_fp8(s.dtype)) static_cast<uint8_t*>(dst)[i] = data::to_fp8(v * fp8_scale, fp8_format(s.dtype));
            else static_cast<float*>(dst)[i] = v;
          }
      }
}

namespace {

class CpuMarker final : public Marker {
 public:
  void record(void*) override { at_ = std::chrono::steady_clock::now(); }
  double since(const Marker& start) const override {
    auto& s = static_cast<const CpuMarker&>(start);
    return std::chrono::duration<double, std::milli>(at_ - s.at_).count();
  }

 private:
  std::chrono::steady_clock::time_point at_{};
};

class CpuDevice final : public Device {
 public:
  DeviceKind kind() const override { return DeviceKind::cpu; }
  int ordinal() const override { return 0; }
  std::string name() const override { return "cpu"; }

  void copy_to_host(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void copy_from_host(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void fill_bytes(void* dst, int v, size_t n) override { std::memset(dst, v, n); }
  void* stream(int) override { return nullptr; }
  void synchronize() override {}
  std::unique_ptr<Marker> marker() override { return std::make_unique<CpuMarker>(); }
  void flush_l2() override {}  // CPU timings are of a whole pass; a cache flush adds only noise

  void generate(void* dst, const GenerateSpec& spec) override { generate_cpu(dst, spec); }
  void poison(void* dst, int32_t dtype, size_t count) override {
    if (dtype == ATTNHOST_DTYPE_BF16 || dtype == ATTNHOST_DTYPE_FP16)
      std::fill_n(static_cast<uint16_t*>(dst), count, dtype == ATTNHOST_DTYPE_BF16 ? 0x7fc0 : 0x7e00);
    else if (dtype == ATTNHOST_DTYPE_FP32)
      std::fill_n(static_cast<float*>(dst), count, std::numeric_limits<float>::quiet_NaN());
  }
  int64_t count_nonfinite(const void* src, int32_t dtype, size_t count, bool allow_neg_inf) override {
    int64_t bad = 0;
    for (size_t i = 0; i < count; ++i) {
      double v = load_element(src, dtype, i);
      if (std::isnan(v) || (std::isinf(v) && !(allow_neg_inf && v < 0))) ++bad;
    }
    return bad;
  }

 protected:
  void* raw_alloc(size_t bytes) override { return std::malloc(bytes); }
  void raw_free(void* p) override { std::free(p); }
  size_t free_memory() const override {
    std::ifstream meminfo("/proc/meminfo");
    std::string key;
    size_t kb = 0;
    while (meminfo >> key >> kb) {
      if (key == "MemAvailable:") return kb * 1024;
      meminfo.ignore(64, '\n');
    }
    return 0;
  }
};

}  // namespace

std::unique_ptr<Device> make_cpu_device() { return std::make_unique<CpuDevice>(); }

}  // namespace attnhost
