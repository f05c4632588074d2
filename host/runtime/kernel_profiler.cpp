#include "runtime/kernel_profiler.h"

#include "common/errors.h"

#include <attnhost/plugin.h>

#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

namespace attnhost {

// The few CUPTI entry points used, resolved from the library at run time.
struct KernelProfiler::Api {
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
};

namespace {

KernelProfiler::Api g_api;
std::mutex g_mutex;
int g_active = 0;
std::vector<KernelRecord> g_records;
constexpr size_t kBufferBytes = 8 << 20;

std::string short_name(const char* mangled) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = kernel_display_name(status == 0 && demangled ? demangled : mangled);
  std::free(demangled);
  return name;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard lock(g_mutex);
  while (g_api.next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(record);
    g_records.push_back({short_name(k->name), k->deviceId, k->start, k->end});
  }
  std::free(buffer);
}

}  // namespace

KernelProfiler& KernelProfiler::instance() {
  static KernelProfiler p;
  return p;
}

KernelProfiler::KernelProfiler() {
  void* lib = nullptr;
  for (const char* name : {"libcupti.so.13", "libcupti.so"})
    if ((lib = ::dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
  if (!lib) {
    unavailable_ = "CUPTI (libcupti.so.13) not found: add the CUDA toolkit's lib64 to LD_LIBRARY_PATH";
    return;
  }
  auto get = [&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, symbol));
    if (!fn && unavailable_.empty()) unavailable_ = std::string("CUPTI lacks ") + symbol;
  };
  get(g_api.register_callbacks, "cuptiActivityRegisterCallbacks");
  get(g_api.enable, "cuptiActivityEnable");
  get(g_api.disable, "cuptiActivityDisable");
  get(g_api.flush_all, "cuptiActivityFlushAll");
  get(g_api.next_record, "cuptiActivityGetNextRecord");
  if (unavailable_.empty() && g_api.register_callbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS)
    unavailable_ = "CUPTI refused to register its activity buffers (is another profiler attached?)";
}

void KernelProfiler::begin() {
  if (!unavailable_.empty()) throw RuntimeFailure(ATTNHOST_ERR_UNSUPPORTED, unavailable_);
  std::lock_guard lock(g_mutex);
  if (g_active++ == 0) {
    g_records.clear();
    if (g_api.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS)
      throw RuntimeFailure(ATTNHOST_ERR_DEVICE, "CUPTI: cannot enable kernel activity records");
  }
}

void KernelProfiler::end() {
  std::unique_lock lock(g_mutex);
  if (--g_active > 0) return;
  lock.unlock();  // flushing calls buffer_completed, which takes the lock
  g_api.flush_all(0);
  g_api.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  g_api.flush_all(0);
}

std::vector<KernelRecord> KernelProfiler::take(int device) {
  std::lock_guard lock(g_mutex);
  std::vector<KernelRecord> mine, rest;
  for (KernelRecord& r : g_records) (static_cast<int>(r.device) == device ? mine : rest).push_back(std::move(r));
  g_records = std::move(rest);
  return mine;
}

}  // namespace attnhost
