#include "runtime/environment.h"

#include <dlfcn.h>
#include <unistd.h>

#include <ctime>

#if ATTNHOST_HAVE_CUDA
#include <cuda_runtime.h>
#endif
#if ATTNHOST_HAVE_NCCL
#include <nccl.h>
#endif

#ifndef ATTNHOST_VERSION
#define ATTNHOST_VERSION "0.0.0"
#endif
#ifndef ATTNHOST_GIT_REVISION
#define ATTNHOST_GIT_REVISION "unknown"
#endif

namespace attnhost {

namespace {

std::string dotted(int v, int major_div, int minor_div) {
  return std::to_string(v / major_div) + "." + std::to_string((v % major_div) / minor_div);
}

// cuDNN is the plugins' dependency, not the host's: ask the library the loader would find.
std::string cudnn_version() {
  for (const char* name : {"libcudnn.so.9", "libcudnn.so"}) {
    void* lib = ::dlopen(name, RTLD_LAZY | RTLD_LOCAL);
    if (!lib) continue;
    using Fn = size_t (*)();
    auto fn = reinterpret_cast<Fn>(::dlsym(lib, "cudnnGetVersion"));
    std::string out;
    if (fn) {
      size_t v = fn();  // 9.14.0 -> 91400
      out = std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." + std::to_string(v % 100);
    }
    ::dlclose(lib);
    if (!out.empty()) return out;
  }
  return "not found";
}

std::string stamp(const char* format) {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

}  // namespace

std::string now_iso8601() { return stamp("%Y-%m-%dT%H:%M:%S%z"); }
std::string now_compact() { return stamp("%Y%m%d-%H%M%S"); }

Environment probe_environment(const Backend& backend) {
  Environment e;
  e.attnhost_version = ATTNHOST_VERSION;
  e.git_revision = ATTNHOST_GIT_REVISION;
  e.date = now_iso8601();
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  e.host = host;
  e.device = backend.describe();
  e.driver = e.cuda = e.nccl = "none";
  e.cudnn = cudnn_version();
#if ATTNHOST_HAVE_CUDA
  int driver = 0, runtime = 0, count = 0;
  if (cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0) e.driver = "CUDA " + dotted(driver, 1000, 10);
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) e.cuda = dotted(runtime, 1000, 10);
  if (backend.device_kind() == DeviceKind::cuda && cudaGetDeviceCount(&count) == cudaSuccess) {
    e.gpus = count;
    cudaDeviceProp prop{};
    if (count > 0 && cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
      e.device += ": " + std::to_string(count) + " x " + prop.name;
  }
  cudaGetLastError();
#endif
#if ATTNHOST_HAVE_NCCL
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess) e.nccl = std::to_string(nccl / 10000) + "." + std::to_string((nccl % 10000) / 100) + "." + std::to_string(nccl % 100);
#endif
  return e;
}

}  // namespace attnhost
