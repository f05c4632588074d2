// The host services of plugin.h for one rank: the plugin's allocations go to the rank's Device
// (and so are accounted), its communication to the rank's Communicator, its named ranges to the
// Tracer. Every entry catches everything: nothing thrown here may cross into a plugin.
#pragma once

#include "results/records.h"
#include "runtime/comm.h"
#include "runtime/device.h"

#include <attnhost/plugin.h>

#include <memory>
#include <string>
#include <vector>

namespace attnhost {

// Named ranges of one traced iteration, timed with the rank's markers.
class Tracer {
 public:
  Tracer(Device& device, int rank) : device_(device), rank_(rank) {}
  void start(void* stream);           // begins a traced iteration; ranges are recorded until stop
  bool active() const { return active_; }
  int32_t begin(const std::string& name, const std::string& category, void* stream);
  void end(int32_t id, void* stream);
  std::vector<TraceEvent> stop();     // synchronizes the device and resolves the times

 private:
  struct Range {
    std::string name, category;
    std::unique_ptr<Marker> begin, end;
  };
  Device& device_;
  int rank_;
  bool active_ = false;
  std::unique_ptr<Marker> origin_;
  std::vector<Range> ranges_;
};

class RankServices {
 public:
  RankServices(Device& device, Communicator& comm, Tracer& tracer, int rank);
  const attnhost_host_api* api() const { return &api_; }
  // The last failure a service reported to the plugin, for the case's error line.
  const std::string& last_failure() const { return last_failure_; }
  int32_t last_status() const { return last_status_; }
  // The plugin's last "engine: ..." line (which kernels served it), recorded with the result.
  const std::string& engine_note() const { return engine_note_; }

 private:
  template <class F> int32_t guarded(const char* what, F f);

  Device& device_;
  Communicator& comm_;
  Tracer& tracer_;
  int rank_;
  attnhost_host_api api_{};
  std::string last_failure_;
  std::string engine_note_;
  int32_t last_status_ = ATTNHOST_OK;
};

}  // namespace attnhost
