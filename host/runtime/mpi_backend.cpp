// Ranks as MPI processes (mpirun -np N attnhost ...). MPI starts the processes and bootstraps;
// on GPUs the plugin's communicator is NCCL (rank 0 makes the unique id and broadcasts it over
// MPI, as nccl-tests does), on the CPU it is MPI itself. Every process walks the same cases in
// the same order; a world of size w runs on processes 0..w-1 while the others wait.
#include "common/errors.h"
#include "common/log.h"
#include "runtime/comm_factory.h"
#if ATTNHOST_HAVE_NCCL
#include "runtime/nccl_comm.h"
#endif

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

namespace attnhost {

namespace {

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw RuntimeFailure(ATTNHOST_ERR_COMMUNICATION, std::string(what) + ": " + std::string(text, len));
}

MPI_Datatype mpi_type(int32_t dtype) {
  switch (dtype) {
    case ATTNHOST_DTYPE_FP32: return MPI_FLOAT;
    case ATTNHOST_DTYPE_FP64: return MPI_DOUBLE;
    case ATTNHOST_DTYPE_INT32: return MPI_INT32_T;
    case ATTNHOST_DTYPE_INT64: return MPI_INT64_T;
    case ATTNHOST_DTYPE_UINT8: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;  // bf16 and fp16: reduced through float
  }
}

MPI_Op mpi_op(int32_t op) { return op == ATTNHOST_REDUCE_MAX ? MPI_MAX : op == ATTNHOST_REDUCE_MIN ? MPI_MIN : MPI_SUM; }

// Waits for requests, polling, so that a receive nobody matches ends with an error.
void wait_all(std::vector<MPI_Request>& reqs, std::chrono::milliseconds timeout, const std::string& what) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int done = 0;
    check_mpi(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    if (done) return;
    if (std::chrono::steady_clock::now() > deadline) {
      for (MPI_Request& r : reqs)
        if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
      throw RuntimeFailure(ATTNHOST_ERR_COMMUNICATION, what + " timed out after " + std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::chrono::milliseconds timeout) : comm_(comm), timeout_(timeout) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* kind() const override { return "mpi"; }

  void send(const void* buf, size_t n, int32_t dt, int peer, void*) override {
    size_t bytes = n * dtype_bytes(dt);
    count_sent(bytes);
    MPI_Request r;
    check_mpi(MPI_Isend(buf, static_cast<int>(bytes), MPI_BYTE, peer, 0, comm_, &r), "MPI_Isend");
    pending_.push_back(r);
    describe_ += " send " + std::to_string(bytes) + " B to rank " + std::to_string(peer);
    if (!in_group_) complete();
  }
  void recv(void* buf, size_t n, int32_t dt, int peer, void*) override {
    size_t bytes = n * dtype_bytes(dt);
    MPI_Request r;
    check_mpi(MPI_Irecv(buf, static_cast<int>(bytes), MPI_BYTE, peer, 0, comm_, &r), "MPI_Irecv");
    pending_.push_back(r);
    describe_ += " recv " + std::to_string(bytes) + " B from rank " + std::to_string(peer);
    if (!in_group_) complete();
  }
  void group_start() override { ++in_group_; }
  void group_end() override {
    if (in_group_ == 0) throw RuntimeFailure(ATTNHOST_ERR_COMMUNICATION, "group_end without group_start");
    if (--in_group_ == 0) complete();
  }
  void all_gather(const void* in, void* out, size_t n, int32_t dt, void*) override {
    int bytes = static_cast<int>(n * dtype_bytes(dt));
    count_sent(static_cast<uint64_t>(bytes) * (size_ - 1));
    check_mpi(MPI_Allgather(in, bytes, MPI_BYTE, out, bytes, MPI_BYTE, comm_), "MPI_Allgather");
  }
  void all_reduce(const void* in, void* out, size_t n, int32_t dt, int32_t op, void*) override {
    count_sent(n * dtype_bytes(dt));
    if (mpi_type(dt) != MPI_DATATYPE_NULL) {
      check_mpi(MPI_Allreduce(in == out ? MPI_IN_PLACE : in, out, static_cast<int>(n), mpi_type(dt), mpi_op(op), comm_),
                "MPI_Allreduce");
      return;
    }
    // bf16/fp16: gather every rank's values and reduce in rank order, as the in-process one does.
    std::vector<char> all(n * dtype_bytes(dt) * size_);
    check_mpi(MPI_Allgather(in, static_cast<int>(n * dtype_bytes(dt)), MPI_BYTE, all.data(),
                            static_cast<int>(n * dtype_bytes(dt)), MPI_BYTE, comm_), "MPI_Allgather");
    for (int r = 1; r < size_; ++r) reduce_into(all.data(), all.data() + r * n * dtype_bytes(dt), n, dt, op);
    std::memcpy(out, all.data(), n * dtype_bytes(dt));
  }
  void reduce_scatter(const void* in, void* out, size_t n, int32_t dt, int32_t op, void*) override {
    size_t bytes = n * dtype_bytes(dt);
    count_sent(bytes * (size_ - 1));
    std::vector<char> full(bytes * size_);
    all_reduce(in, full.data(), n * size_, dt, op, nullptr);
    std::memcpy(out, full.data() + rank_ * bytes, bytes);
  }
  void barrier() override { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }

 private:
  void complete() {
    std::string what = "rank " + std::to_string(rank_) + ":" + describe_;
    describe_.clear();
    std::vector<MPI_Request> reqs;
    reqs.swap(pending_);
    wait_all(reqs, timeout_, what);
  }
  MPI_Comm comm_;
  std::chrono::milliseconds timeout_;
  int rank_ = 0, size_ = 1, in_group_ = 0;
  std::vector<MPI_Request> pending_;
  std::string describe_;
};

class MpiGroup final : public RankGroup {
 public:
  explicit MpiGroup(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }
  std::vector<double> max(const std::vector<double>& v) override { return reduce(v, MPI_MAX); }
  std::vector<double> sum(const std::vector<double>& v) override { return reduce(v, MPI_SUM); }
  std::vector<std::string> gather(const std::string& bytes) override {
    int mine = static_cast<int>(bytes.size());
    std::vector<int> sizes(size_), offsets(size_);
    check_mpi(MPI_Gather(&mine, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, comm_), "MPI_Gather");
    int total = 0;
    for (int r = 0; r < size_; ++r) {
      offsets[r] = total;
      total += sizes[r];
    }
    std::string all(rank_ == 0 ? total : 0, '\0');
    check_mpi(MPI_Gatherv(bytes.data(), mine, MPI_BYTE, all.data(), sizes.data(), offsets.data(), MPI_BYTE, 0, comm_),
              "MPI_Gatherv");
    std::vector<std::string> out;
    if (rank_ == 0)
      for (int r = 0; r < size_; ++r) out.push_back(all.substr(offsets[r], sizes[r]));
    return out;
  }

 private:
  std::vector<double> reduce(const std::vector<double>& v, MPI_Op op) {
    std::vector<double> out(v.size());
    check_mpi(MPI_Allreduce(v.data(), out.data(), static_cast<int>(v.size()), MPI_DOUBLE, op, comm_), "MPI_Allreduce");
    return out;
  }
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

class MpiBackend final : public Backend {
 public:
  MpiBackend(DeviceKind kind, std::chrono::milliseconds timeout) : kind_(kind), timeout_(timeout) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &local_rank_);
    // Each process's machine, named by the world rank of its machine's first process.
    int leader = rank_;
    MPI_Bcast(&leader, 1, MPI_INT, 0, local);
    MPI_Comm_free(&local);
    machine_of_.resize(size_);
    MPI_Allgather(&leader, 1, MPI_INT, machine_of_.data(), 1, MPI_INT, MPI_COMM_WORLD);
    log::set_prefix("attnhost[rank " + std::to_string(rank_) + "]");
  }
  ~MpiBackend() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }

  DeviceKind device_kind() const override { return kind_; }
  int max_world_size() const override { return size_; }
  int process_rank() const override { return rank_; }
  std::string describe() const override {
    return std::string(kind_ == DeviceKind::cuda ? "cuda" : "cpu") + " (MPI, " + std::to_string(size_) + " processes" +
           (kind_ == DeviceKind::cuda ? ", NCCL)" : ")");
  }
  void sync_processes() override { MPI_Barrier(MPI_COMM_WORLD); }

  RunResult run_world(int ws, const std::function<RunResult(RankEnv&)>& body) override {
    MPI_Comm sub = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, rank_ < ws ? 0 : MPI_UNDEFINED, rank_, &sub);
    RunResult result;
    result.world_size = ws;
    if (sub == MPI_COMM_NULL) return result;  // not part of this world
    try {
      std::unique_ptr<Device> device = make_device();
      device->rank = rank_;
      std::unique_ptr<Communicator> comm = make_comm(sub, ws);
      MpiGroup group(sub);
      RankEnv env{rank_, ws, *device, *comm, group};
      // This world is ranks 0..ws-1: count those on this machine, and those of them before this rank.
      env.local_rank = static_cast<int>(std::count(machine_of_.begin(), machine_of_.begin() + rank_, machine_of_[rank_]));
      env.local_size = static_cast<int>(std::count(machine_of_.begin(), machine_of_.begin() + ws, machine_of_[rank_]));
      result = body(env);
    } catch (const std::exception& e) {
      result.status = "ERROR";
      result.error = "rank " + std::to_string(rank_) + ": " + e.what();
    }
    MPI_Comm_free(&sub);
    return result;
  }

 private:
  std::unique_ptr<Device> make_device() {
#if ATTNHOST_HAVE_CUDA
    if (kind_ == DeviceKind::cuda) return make_cuda_device(local_rank_ % std::max(1, cuda_device_count()));
#endif
    return make_cpu_device();
  }

  std::unique_ptr<Communicator> make_comm(MPI_Comm sub, int ws) {
    if (kind_ == DeviceKind::cpu) return std::make_unique<MpiCommunicator>(sub, timeout_);
#if ATTNHOST_HAVE_NCCL
    auto it = nccl_.find(ws);
    if (it == nccl_.end()) {
      std::string id = rank_ == 0 ? nccl_unique_id() : std::string(128, '\0');
      id.resize(128);
      check_mpi(MPI_Bcast(id.data(), 128, MPI_BYTE, 0, sub), "MPI_Bcast (NCCL id)");
      it = nccl_.emplace(ws, nccl_init_rank(id.data(), rank_, ws)).first;
    }
    return wrap_nccl(it->second, rank_, ws);
#else
    (void)ws;
    throw RuntimeFailure(ATTNHOST_ERR_UNSUPPORTED, "this attnhost was built without NCCL: GPU worlds are unavailable");
#endif
  }

  DeviceKind kind_;
  std::chrono::milliseconds timeout_;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  std::vector<int> machine_of_;  // per world rank: its machine's first rank
  std::map<int, void*> nccl_;
};

}  // namespace

std::unique_ptr<Backend> make_mpi_backend(DeviceKind kind, std::chrono::milliseconds timeout) {
  return std::make_unique<MpiBackend>(kind, timeout);
}

}  // namespace attnhost
