// The NCCL communicator: every operation is enqueued on the stream the plugin names; the host
// never synchronizes inside a pass except for barrier, which must be a host-visible point.
#include "runtime/nccl_comm.h"

#include "common/errors.h"
#include "runtime/comm_factory.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <map>
#include <mutex>
#include <vector>

namespace attnhost {

namespace {

void check_nccl(ncclResult_t r, const char* what, int rank) {
  if (r != ncclSuccess)
    throw RuntimeFailure(ATTNHOST_ERR_COMMUNICATION,
                         std::string(what) + " on rank " + std::to_string(rank) + ": " + ncclGetErrorString(r));
}

ncclDataType_t nccl_type(int32_t dtype) {
  switch (dtype) {
    case ATTNHOST_DTYPE_BF16: return ncclBfloat16;
    case ATTNHOST_DTYPE_FP16: return ncclFloat16;
    case ATTNHOST_DTYPE_FP32: return ncclFloat32;
    case ATTNHOST_DTYPE_FP64: return ncclFloat64;
    case ATTNHOST_DTYPE_INT32: return ncclInt32;
    case ATTNHOST_DTYPE_INT64: return ncclInt64;
    case ATTNHOST_DTYPE_UINT8: return ncclUint8;
    case ATTNHOST_DTYPE_FP8_E4M3: return ncclFloat8e4m3;
    case ATTNHOST_DTYPE_FP8_E5M2: return ncclFloat8e5m2;
    default: throw RuntimeFailure(ATTNHOST_ERR_INVALID_ARGUMENT, "NCCL: unknown dtype " + std::to_string(dtype));
  }
}

ncclRedOp_t nccl_op(int32_t op) {
  return op == ATTNHOST_REDUCE_MAX ? ncclMax : op == ATTNHOST_REDUCE_MIN ? ncclMin : ncclSum;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  ~NcclCommunicator() override {
    if (flag_) cudaFree(flag_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* kind() const override { return "nccl"; }

  void send(const void* buf, size_t n, int32_t dt, int peer, void* s) override {
    count_sent(n * dtype_bytes(dt));
    check_nccl(ncclSend(buf, n, nccl_type(dt), peer, comm_, cuda(s)), "ncclSend", rank_);
  }
  void recv(void* buf, size_t n, int32_t dt, int peer, void* s) override {
    check_nccl(ncclRecv(buf, n, nccl_type(dt), peer, comm_, cuda(s)), "ncclRecv", rank_);
  }
  void group_start() override { check_nccl(ncclGroupStart(), "ncclGroupStart", rank_); }
  void group_end() override { check_nccl(ncclGroupEnd(), "ncclGroupEnd", rank_); }
  void all_gather(const void* in, void* out, size_t n, int32_t dt, void* s) override {
    count_sent(n * dtype_bytes(dt) * (size_ - 1));
    check_nccl(ncclAllGather(in, out, n, nccl_type(dt), comm_, cuda(s)), "ncclAllGather", rank_);
  }
  void all_reduce(const void* in, void* out, size_t n, int32_t dt, int32_t op, void* s) override {
    count_sent(n * dtype_bytes(dt));
    check_nccl(ncclAllReduce(in, out, n, nccl_type(dt), nccl_op(op), comm_, cuda(s)), "ncclAllReduce", rank_);
  }
  void reduce_scatter(const void* in, void* out, size_t n, int32_t dt, int32_t op, void* s) override {
    count_sent(n * dtype_bytes(dt) * (size_ - 1));
    check_nccl(ncclReduceScatter(in, out, n, nccl_type(dt), nccl_op(op), comm_, cuda(s)), "ncclReduceScatter", rank_);
  }
  void barrier() override {
    if (!flag_ && cudaMalloc(&flag_, sizeof(float)) != cudaSuccess)
      throw RuntimeFailure(ATTNHOST_ERR_OUT_OF_MEMORY, "NCCL barrier: cudaMalloc failed");
    check_nccl(ncclAllReduce(flag_, flag_, 1, ncclFloat32, ncclSum, comm_, nullptr), "ncclAllReduce (barrier)", rank_);
    if (cudaStreamSynchronize(nullptr) != cudaSuccess)
      throw RuntimeFailure(ATTNHOST_ERR_DEVICE, "NCCL barrier: stream synchronization failed");
  }
  void* native() override { return comm_; }

 private:
  static cudaStream_t cuda(void* s) { return static_cast<cudaStream_t>(s); }
  ncclComm_t comm_;
  int rank_, size_;
  void* flag_ = nullptr;
};

// Communicators of this process's rank threads, one set per world size, made once.
class ThreadNcclFactory final : public CommFactory {
 public:
  ThreadNcclFactory(int size, bool copy_engines, std::chrono::milliseconds timeout)
      : size_(size), meeting_(copy_engines ? make_peer_meeting(size, timeout) : nullptr) {
    std::lock_guard lock(mutex());
    auto& entry = cache()[size];
    if (entry.id.empty()) {
      entry.id = nccl_unique_id();
      entry.comms.assign(size, nullptr);
    }
  }
  std::unique_ptr<Communicator> create(int rank) override {
    void* comm = nullptr;
    std::string id;
    {
      std::lock_guard lock(mutex());
      comm = cache()[size_].comms[rank];
      id = cache()[size_].id;
    }
    if (!comm) {
      comm = nccl_init_rank(id.data(), rank, size_);
      std::lock_guard lock(mutex());
      cache()[size_].comms[rank] = comm;
    }
    std::unique_ptr<Communicator> nccl = wrap_nccl(comm, rank, size_);
    return meeting_ ? with_copy_engines(std::move(nccl), meeting_) : std::move(nccl);
  }

 private:
  struct Entry {
    std::string id;
    std::vector<void*> comms;
  };
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::map<int, Entry>& cache() {
    static std::map<int, Entry> c;
    return c;
  }
  int size_;
  std::shared_ptr<PeerMeeting> meeting_;  // one a world: its slots never outlive a case
};

}  // namespace

std::unique_ptr<Communicator> wrap_nccl(void* comm, int rank, int size) {
  return std::make_unique<NcclCommunicator>(static_cast<ncclComm_t>(comm), rank, size);
}

std::string nccl_unique_id() {
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId", 0);
  return std::string(reinterpret_cast<const char*>(&id), sizeof id);
}

void* nccl_init_rank(const void* unique_id, int rank, int size) {
  ncclUniqueId id;
  std::memcpy(&id, unique_id, sizeof id);
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, size, id, rank), "ncclCommInitRank", rank);
  return comm;
}

std::unique_ptr<CommFactory> nccl_factory(int world_size, bool copy_engines, std::chrono::milliseconds timeout) {
  return std::make_unique<ThreadNcclFactory>(world_size, copy_engines, timeout);
}

}  // namespace attnhost
