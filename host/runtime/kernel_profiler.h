// Per-kernel times of a pass (timing method "profiler") from CUPTI's activity records. CUPTI is
// opened at first use (libcupti.so.13, beside the CUDA runtime), so attnhost runs where it is
// missing and says so only when asked to profile.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attnhost {

struct KernelRecord {
  std::string name;   // demangled, without parameters
  uint32_t device = 0;
  uint64_t start_ns = 0, end_ns = 0;
};

// A demangled kernel name as the breakdown shows it: no return type, no parameter list, no
// "(anonymous namespace)::" (kernels in one are named by what follows it), at most 96 characters.
std::string kernel_display_name(std::string demangled);

class KernelProfiler {
 public:
  static KernelProfiler& instance();
  // "" when CUPTI can be used, else why not (one line).
  const std::string& unavailable() const { return unavailable_; }
  // Rank threads call begin() before their work and end() after it (with a host barrier around
  // both); the first begin enables the activity records, the last end flushes them.
  void begin();
  void end();
  std::vector<KernelRecord> take(int device);  // this device's records since begin

  struct Api;

 private:
  KernelProfiler();
  std::string unavailable_;
};

}  // namespace attnhost
