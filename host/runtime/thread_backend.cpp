// Ranks as threads of this process. Host-level coordination is in-process for both devices; the
// plugin's communicator is in-process on the CPU and NCCL on GPUs.
#include "common/errors.h"
#include "common/log.h"
#include "runtime/backend.h"
#include "runtime/comm_factory.h"

#include <cstdlib>
#include <thread>

namespace attnhost {

namespace {

class ThreadBackend final : public Backend {
 public:
  ThreadBackend(DeviceKind kind, int gpus, std::chrono::milliseconds timeout, bool copy_engines, int ranks_per_gpu)
      : kind_(kind), gpus_(gpus), timeout_(timeout), copy_engines_(copy_engines), ranks_per_gpu_(ranks_per_gpu) {}

  DeviceKind device_kind() const override { return kind_; }
  // On the CPU a rank is a thread of this process: a world past kMaxCpuRanks would take minutes to
  // start, and tell nothing a smaller one does not.
  int max_world_size() const override { return kind_ == DeviceKind::cpu ? kMaxCpuRanks : gpus_ * ranks_per_gpu_; }
  bool shares_gpus(int world_size) const override { return kind_ == DeviceKind::cuda && world_size > gpus_; }
  std::string describe() const override {
    if (kind_ == DeviceKind::cpu) return "cpu (one thread per rank, in-process communicator)";
    if (ranks_per_gpu_ > 1)
      return "cuda (" + std::to_string(gpus_) + " GPUs, up to " + std::to_string(ranks_per_gpu_) +
             " ranks each, one thread a rank; worlds larger than the GPUs share them, exchanging by copies, "
             "collectives through the host, and their timings are not those of more GPUs)";
    return "cuda (" + std::to_string(gpus_) + " GPUs, one thread each, NCCL" +
           (copy_engines_ ? "; point-to-point by the copy engines)" : ")");
  }

  RunResult run_world(int world_size, const std::function<RunResult(RankEnv&)>& body) override {
    InprocWorld world(world_size, timeout_);
    std::unique_ptr<CommFactory> comms;
    if (shares_gpus(world_size)) {
      log::warn("world size " + std::to_string(world_size) + " on " + std::to_string(gpus_) +
                   " GPUs: ranks share them (--ranks-per-gpu), so its timings are not those of " +
                   std::to_string(world_size) + " GPUs");
      comms = shared_gpu_factory(world, gpus_, timeout_);
    } else if (kind_ == DeviceKind::cuda) {
      comms = nccl_factory(world_size, copy_engines_, timeout_);
    }
    std::vector<RunResult> results(world_size);
    std::vector<std::thread> threads;
    for (int r = 0; r < world_size; ++r)
      threads.emplace_back([&, r] { results[r] = run_rank(world, comms.get(), r, world_size, body); });
    for (std::thread& t : threads) t.join();
    return results[0];
  }

 private:
  RunResult run_rank(InprocWorld& world, CommFactory* comms, int r, int ws,
                     const std::function<RunResult(RankEnv&)>& body) {
    try {
      std::unique_ptr<Device> device = make_device(r);
      device->rank = r;
      std::unique_ptr<Communicator> comm = comms ? comms->create(r) : world.communicator(r);
      std::unique_ptr<RankGroup> group = world.group(r);
      RankEnv env{r, ws, *device, *comm, *group, r, ws};  // one process: every rank on this machine
      return body(env);
    } catch (const std::exception& e) {
      RunResult failed;
      failed.world_size = ws;
      failed.status = "ERROR";
      failed.error = "rank " + std::to_string(r) + ": " + e.what();
      return failed;
    }
  }

  std::unique_ptr<Device> make_device(int rank) {
#if ATTNHOST_HAVE_CUDA
    if (kind_ == DeviceKind::cuda) return make_cuda_device(rank % gpus_);
#endif
    (void)rank;
    return make_cpu_device();
  }

  DeviceKind kind_;
  int gpus_;
  std::chrono::milliseconds timeout_;
  bool copy_engines_;
  int ranks_per_gpu_;
};

}  // namespace

std::unique_ptr<Backend> make_thread_backend(DeviceKind kind, int gpus, std::chrono::milliseconds timeout,
                                             bool copy_engines, int ranks_per_gpu) {
  return std::make_unique<ThreadBackend>(kind, gpus, timeout, copy_engines, ranks_per_gpu);
}

bool started_under_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

std::unique_ptr<Backend> make_backend(const BackendOptions& o) {
  int gpus = 0;
#if ATTNHOST_HAVE_CUDA
  gpus = cuda_device_count();
#endif
  DeviceKind kind;
  if (o.device == "cpu") {
    kind = DeviceKind::cpu;
  } else if (o.device == "cuda") {
#if !ATTNHOST_HAVE_CUDA
    throw UsageError("--device cuda: this attnhost was built without CUDA");
#endif
    if (gpus == 0) throw UsageError("--device cuda: no GPU is visible");
    kind = DeviceKind::cuda;
  } else if (o.device == "auto") {
    kind = gpus > 0 ? DeviceKind::cuda : DeviceKind::cpu;
    if (gpus == 0) log::info("no GPU visible: running on the CPU");
  } else {
    throw UsageError("--device must be auto, cuda or cpu, not '" + o.device + "'");
  }
  if (kind == DeviceKind::cuda && o.gpus > 0) {
    if (o.gpus > gpus)
      throw UsageError("--gpus " + std::to_string(o.gpus) + ": only " + std::to_string(gpus) + " visible");
    gpus = o.gpus;
  }
  if (o.transport != "auto" && o.transport != "copy-engine" && o.transport != "nccl")
    throw UsageError("--transport must be auto, copy-engine or nccl, not '" + o.transport + "'");
  if (o.ranks_per_gpu < 1) throw UsageError("--ranks-per-gpu must be at least 1, not " + std::to_string(o.ranks_per_gpu));
  if (o.ranks_per_gpu > 1 && kind != DeviceKind::cuda)
    throw UsageError("--ranks-per-gpu shares GPUs among ranks: it takes a GPU run (--device cuda or auto with a GPU)");
  if (o.ranks_per_gpu > 1 && kind == DeviceKind::cuda && gpus > 1 && !peer_access_among(gpus))
    throw UsageError("--ranks-per-gpu: ranks that share GPUs copy to one another, and these " + std::to_string(gpus) +
                     " GPUs cannot all reach one another's memory (take --gpus 1)");
  if (o.ranks_per_gpu > 1 && (o.transport == "nccl" || started_under_mpi()))
    throw UsageError("--ranks-per-gpu: ranks that share a GPU exchange by copies within this process (NCCL takes one "
                     "rank a GPU), so neither --transport nccl nor mpirun");
  if (started_under_mpi()) {
    if (o.transport == "copy-engine")
      throw UsageError("--transport copy-engine: ranks started by MPI are processes; peer copies need ranks in one process");
    return make_mpi_backend(kind, o.comm_timeout);
  }
  bool copy_engines = false;
  if (kind == DeviceKind::cuda && o.transport != "nccl") {
    const bool reachable = peer_access_among(gpus);
    if (o.transport == "copy-engine" && !reachable)
      throw UsageError("--transport copy-engine: the " + std::to_string(gpus) + " GPUs cannot all reach one another's memory");
    copy_engines = reachable && gpus > 1;
  }
  return make_thread_backend(kind, gpus, o.comm_timeout, copy_engines, o.ranks_per_gpu);
}

}  // namespace attnhost
