// Communicators that need a collective set-up (NCCL), and the MPI backend.
#pragma once

#include "runtime/backend.h"
#include "runtime/comm.h"

#include <memory>

namespace attnhost {

// Creates rank r's communicator of one world; every rank of the world calls create concurrently.
class CommFactory {
 public:
  virtual ~CommFactory() = default;
  virtual std::unique_ptr<Communicator> create(int rank) = 0;
};

// NCCL communicators for `world_size` threads of this process, one GPU each. Built once per world
// size and kept for the life of the process (initialization costs far more than a case). With
// `copy_engines`, sends and receives are peer copies instead of NCCL's kernels.
std::unique_ptr<CommFactory> nccl_factory(int world_size, bool copy_engines, std::chrono::milliseconds timeout);

// Communicators for ranks that share GPUs (--ranks-per-gpu), threads of this process: NCCL takes one
// rank a GPU, so sends are the copy engines' and collectives go through the host (`world`'s).
std::unique_ptr<CommFactory> shared_gpu_factory(InprocWorld& world, int gpus, std::chrono::milliseconds timeout);

// Whether each of the first `gpus` devices can reach every other's memory (NVLink or PCIe peers).
bool peer_access_among(int gpus);

// The MPI backend; throws UsageError when attnhost was built without MPI.
std::unique_ptr<Backend> make_mpi_backend(DeviceKind kind, std::chrono::milliseconds timeout);

}  // namespace attnhost
