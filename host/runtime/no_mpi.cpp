// Built when MPI was not found: say so when started under mpirun.
#include "common/errors.h"
#include "runtime/comm_factory.h"

namespace attnhost {
std::unique_ptr<Backend> make_mpi_backend(DeviceKind, std::chrono::milliseconds) {
  throw UsageError("started under mpirun, but this attnhost was built without MPI (install libopenmpi-dev and rebuild)");
}
}  // namespace attnhost
