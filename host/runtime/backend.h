// Where ranks run. A backend turns "world size N" into N ranks, each with a Device, a
// Communicator and a RankGroup, and runs the same function on every rank (SPMD). Threads in
// one process (CPU: in-process communicator; CUDA: one GPU per thread, NCCL), or MPI processes.
#pragma once

#include "results/records.h"
#include "runtime/comm.h"
#include "runtime/device.h"

#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace attnhost {

struct RankEnv {
  int rank = 0, world_size = 1;
  Device& device;
  Communicator& comm;
  RankGroup& group;
  int local_rank = 0, local_size = 1;  // among the ranks of this world on this rank's machine
};

// The most ranks the CPU runs, each a thread of one process.
inline constexpr int kMaxCpuRanks = 64;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceKind device_kind() const = 0;
  virtual int max_world_size() const = 0;     // GPUs visible, MPI processes, or kMaxCpuRanks threads
  virtual std::string describe() const = 0;   // "cpu (threads)", "cuda: 2 x NVIDIA H200 (NCCL)"
  virtual int process_rank() const { return 0; } // this process's rank under MPI, else 0
  virtual bool shares_gpus(int /*world_size*/) const { return false; }  // ranks share GPUs (--ranks-per-gpu)
  // Runs body on every rank of a world of `world_size`; returns rank 0's result (in MPI mode, on
  // world rank 0; other processes get an empty result). Exceptions from body are rank errors.
  virtual RunResult run_world(int world_size, const std::function<RunResult(RankEnv&)>& body) = 0;
  // Under MPI, every process must agree to skip or run a case: everything else is a no-op.
  virtual void sync_processes() {}
};

struct BackendOptions {
  std::string device = "auto";                 // auto | cpu | cuda
  int gpus = 0;                                // 0: all visible
  // GPU point-to-point: auto | copy-engine | nccl. auto takes the copy engines where the ranks are
  // threads of one process and every GPU reaches the others' memory.
  std::string transport = "auto";
  std::chrono::milliseconds comm_timeout{60000};
  // Ranks on each GPU: above 1, a world larger than the GPUs runs, rank r on GPU r % gpus, to check
  // a schedule's many-rank paths on few GPUs. Its timings are not those of that many GPUs.
  int ranks_per_gpu = 1;
};

// Picks the backend for the options and the environment (mpirun, visible GPUs); throws
// UsageError when the request cannot be met ("--device cuda" without a GPU).
std::unique_ptr<Backend> make_backend(const BackendOptions& options);
std::unique_ptr<Backend> make_thread_backend(DeviceKind kind, int gpus, std::chrono::milliseconds timeout,
                                             bool copy_engines = false, int ranks_per_gpu = 1);

bool started_under_mpi();

}  // namespace attnhost
