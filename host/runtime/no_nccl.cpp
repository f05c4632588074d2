// Built when NCCL (or CUDA) is absent: GPU worlds cannot be made.
#include "common/errors.h"
#include "runtime/comm_factory.h"

namespace attnhost {
std::unique_ptr<CommFactory> nccl_factory(int, bool, std::chrono::milliseconds) {
  throw RuntimeFailure(ATTNHOST_ERR_UNSUPPORTED, "this attnhost was built without NCCL: GPU worlds are unavailable");
}
std::unique_ptr<CommFactory> shared_gpu_factory(InprocWorld&, int, std::chrono::milliseconds) {
  throw RuntimeFailure(ATTNHOST_ERR_UNSUPPORTED, "this attnhost was built without NCCL: GPU worlds are unavailable");
}
bool peer_access_among(int) { return false; }
}  // namespace attnhost
