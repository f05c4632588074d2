// What a GPU's board reports while it works: its SM clock and its power draw, through NVML (the
// driver's management library, loaded at run time: without it nothing is read). Under sustained
// load an H200 holds its power limit by lowering its clock, and two boards of one host settle tens
// of MHz apart; a pass's time per rank says which rank set the pace, these say whether its board did.
#pragma once

#include <optional>

namespace attnhost {

struct GpuReading {
  double sm_clock_mhz = 0, power_w = 0;
};

class GpuBoard {
 public:
  explicit GpuBoard(int cuda_ordinal);  // the board of that CUDA device, found by its PCI bus id
  // Now; nullopt without NVML, or where the board does not answer.
  std::optional<GpuReading> read() const;

 private:
  void* handle_ = nullptr;  // nvmlDevice_t
};

}  // namespace attnhost
