#include "runtime/gpu_board.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

namespace attnhost {

namespace {

// The few NVML entry points used (NVML's C ABI: nvmlReturn_t is 0 on success, a device an opaque
// pointer, NVML_CLOCK_SM 1), resolved from the driver's library once.
struct Nvml {
  int (*init)() = nullptr;
  int (*by_bus_id)(const char*, void**) = nullptr;
  int (*clock)(void*, int, unsigned*) = nullptr;
  int (*power)(void*, unsigned*) = nullptr;  // milliwatts
  bool ready = false;

  Nvml() {
    void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    init = reinterpret_cast<int (*)()>(::dlsym(lib, "nvmlInit_v2"));
    by_bus_id = reinterpret_cast<int (*)(const char*, void**)>(::dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    clock = reinterpret_cast<int (*)(void*, int, unsigned*)>(::dlsym(lib, "nvmlDeviceGetClockInfo"));
    power = reinterpret_cast<int (*)(void*, unsigned*)>(::dlsym(lib, "nvmlDeviceGetPowerUsage"));
    ready = init && by_bus_id && clock && power && init() == 0;
  }
};

const Nvml& nvml() {
  static const Nvml n;
  return n;
}

constexpr int kClockSm = 1;

}  // namespace

GpuBoard::GpuBoard(int cuda_ordinal) {
  if (!nvml().ready) return;
  char bus[32] = {};
  void* handle = nullptr;
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, cuda_ordinal) == cudaSuccess && nvml().by_bus_id(bus, &handle) == 0)
    handle_ = handle;
}

std::optional<GpuReading> GpuBoard::read() const {
  unsigned mhz = 0, milliwatts = 0;
  if (!handle_ || nvml().clock(handle_, kClockSm, &mhz) != 0 || nvml().power(handle_, &milliwatts) != 0)
    return std::nullopt;
  return GpuReading{double(mhz), milliwatts / 1000.0};
}

}  // namespace attnhost
