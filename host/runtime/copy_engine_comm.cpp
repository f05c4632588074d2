// Point-to-point by the copy engines. When every rank is a thread of this process with a GPU of
// its own, and each GPU reaches the others' memory, a send is one peer copy from the sender's
// buffer into the receiver's, on the sender's stream: no SM runs it, so it neither slows the
// attention kernels nor waits for their blocks. Two H200s under a kernel on every SM moved 142 GB/s
// each way through NCCL's send/recv and 374 through the copy engines (docs/KERNELS.md,
// "Point-to-point by the copy engines"). Collectives stay NCCL's.
//
// A copy needs the pointers and stream positions of both ends, so the two ranks meet on the host.
// At group_end each rank
//   1. posts its receives: the buffer and an event marking where its stream lets it be written;
//   2. for each send, waits for the matching receive's post, then enqueues on its own stream:
//      wait for that event, the copy, an event `copied`, which it posts;
//   3. for each receive, waits for `copied` to be posted and makes its stream wait for it.
// The k-th send from a rank to a peer matches the peer's k-th receive from it, as in NCCL; every
// post happens before any wait, so the sends and receives of one group never wait on each other.
// A send outside a group meets its receive alone: two ranks that each send before receiving,
// in separate groups, wait until --comm-timeout, as NCCL's kernels would on one stream.
#include "runtime/nccl_comm.h"

#include "common/errors.h"
#include "runtime/comm_factory.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>
#include <vector>

namespace attnhost {

namespace {

void check_cuda(cudaError_t e, const char* what, int rank) {
  if (e != cudaSuccess)
    throw RuntimeFailure(ATTNHOST_ERR_DEVICE,
                         std::string(what) + " on rank " + std::to_string(rank) + ": " + cudaGetErrorString(e));
}

std::string seconds(std::chrono::milliseconds t) {
  std::ostringstream o;
  o << t.count() / 1000.0;
  return o.str();
}

}  // namespace

// What the ranks of one world share: one slot per (sender, receiver, sequence number) while its
// two ends meet, and the events each rank may use again.
struct PeerMeeting {
  struct Slot {
    Block dst;  // the receiver's block (dst.data null until it posts)
    int recv_device = -1;
    cudaEvent_t writable = nullptr;  // receiver's: its buffer may be written from here on
    cudaEvent_t copied = nullptr;    // sender's: the data is in the receiver's buffer
    std::string refused;             // the sender's block, where it did not match: no copy comes
  };
  explicit PeerMeeting(int size, std::chrono::milliseconds timeout) : free_events(size), timeout(timeout) {}
  ~PeerMeeting() {  // what a failed exchange left behind
    for (auto& [key, slot] : slots)
      for (cudaEvent_t e : {slot.writable, slot.copied})
        if (e) cudaEventDestroy(e);
    for (auto& pool : free_events)
      for (cudaEvent_t e : pool) cudaEventDestroy(e);
  }

  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::tuple<int, int, uint64_t>, Slot> slots;
  std::vector<std::vector<cudaEvent_t>> free_events;  // by owner rank
  std::chrono::milliseconds timeout;
};

namespace {

class CopyEngineCommunicator final : public Communicator {
 public:
  CopyEngineCommunicator(std::unique_ptr<Communicator> nccl, std::shared_ptr<PeerMeeting> meeting)
      : nccl_(std::move(nccl)), meeting_(std::move(meeting)), sent_(nccl_->size()), received_(nccl_->size()) {
    check_cuda(cudaGetDevice(&device_), "cudaGetDevice", rank());
    int max_pitch = 0;
    check_cuda(cudaDeviceGetAttribute(&max_pitch, cudaDevAttrMaxPitch, device_), "cudaDeviceGetAttribute", rank());
    max_pitch_ = size_t(max_pitch);
  }
  ~CopyEngineCommunicator() override {
    std::lock_guard lock(meeting_->mutex);
    for (cudaEvent_t e : meeting_->free_events[rank()]) cudaEventDestroy(e);
    meeting_->free_events[rank()].clear();
  }
  int rank() const override { return nccl_->rank(); }
  int size() const override { return nccl_->size(); }
  const char* kind() const override { return nccl_->kind(); }  // whose collectives

  void send(const void* buf, size_t n, int32_t dt, int peer, void* s) override {
    send_block(Block::contiguous(buf, n * dtype_bytes(dt)), peer, s);
  }
  void recv(void* buf, size_t n, int32_t dt, int peer, void* s) override {
    recv_block(Block::contiguous(buf, n * dtype_bytes(dt)), peer, s);
  }
  // A strided block is one 3-D peer copy (copy()): the copy engines walk its rows at the rate of a
  // contiguous copy (rows of 512-3072 bytes between two H200s, docs/KERNELS.md, "Blocks as they lie").
  bool blocks() const override { return true; }
  void send_block(const Block& b, int peer, void* s) override {
    check_block(b, "send on rank " + std::to_string(rank()));
    count_sent(b.bytes());
    add({true, b, peer, stream(s), sent_.at(peer)++});
  }
  void recv_block(const Block& b, int peer, void* s) override {
    check_block(b, "recv on rank " + std::to_string(rank()));
    add({false, b, peer, stream(s), received_.at(peer)++});
  }
  void group_start() override { ++depth_; }
  void group_end() override {
    if (depth_ == 0) throw RuntimeFailure(ATTNHOST_ERR_COMMUNICATION, "group_end without group_start on rank " + std::to_string(rank()));
    if (--depth_ == 0) meet();
  }
  void all_gather(const void* in, void* out, size_t n, int32_t dt, void* s) override {
    nccl_->all_gather(in, out, n, dt, s);
    count_sent(n * dtype_bytes(dt) * (size() - 1));
  }
  void all_reduce(const void* in, void* out, size_t n, int32_t dt, int32_t op, void* s) override {
    nccl_->all_reduce(in, out, n, dt, op, s);
    count_sent(n * dtype_bytes(dt));
  }
  void reduce_scatter(const void* in, void* out, size_t n, int32_t dt, int32_t op, void* s) override {
    nccl_->reduce_scatter(in, out, n, dt, op, s);
    count_sent(n * dtype_bytes(dt) * (size() - 1));
  }
  void barrier() override { nccl_->barrier(); }
  void* native() override { return nccl_->native(); }

 private:
  struct Op {
    bool send;
    Block block;
    int peer;
    cudaStream_t stream;
    uint64_t seq;
  };
  using Key = std::tuple<int, int, uint64_t>;

  static cudaStream_t stream(void* s) { return static_cast<cudaStream_t>(s); }
  // One peer copy of a block, as CUDA's 3-D copies see it where they can: one copy whose slices lie
  // pitch x ysize apart, so a slice pitch that is a whole number of rows; else a copy a slice; and
  // a copy a row where a pitch passes the device's limit (rows of megabytes then).
  void copy(const Block& dst, int dst_device, const Block& src, cudaStream_t stream) const {
    if (src.is_contiguous() && dst.is_contiguous()) {
      check_cuda(cudaMemcpyPeerAsync(dst.data, dst_device, src.data, device_, src.bytes(), stream), "cudaMemcpyPeerAsync",
                 rank());
      return;
    }
    const auto row_pitch = [](const Block& b) { return b.rows > 1 ? b.pitch : b.width; };
    const auto fits = [&](const Block& b) { return row_pitch(b) <= max_pitch_; };
    const auto whole = [&](const Block& b) { return fits(b) && (b.slices == 1 || b.slice_pitch % row_pitch(b) == 0); };
    const auto at = [](const Block& b, size_t slice, size_t row) {
      return static_cast<char*>(b.data) + slice * b.slice_pitch + row * b.pitch;
    };
    const auto copy3d = [&](void* d, const Block& db, void* s, const Block& sb, size_t slices) {
      cudaMemcpy3DPeerParms p{};
      p.srcPtr = make_cudaPitchedPtr(s, row_pitch(sb), sb.width, slices > 1 ? sb.slice_pitch / row_pitch(sb) : sb.rows);
      p.srcDevice = device_;
      p.dstPtr = make_cudaPitchedPtr(d, row_pitch(db), db.width, slices > 1 ? db.slice_pitch / row_pitch(db) : db.rows);
      p.dstDevice = dst_device;
      p.extent = make_cudaExtent(sb.width, sb.rows, slices);
      check_cuda(cudaMemcpy3DPeerAsync(&p, stream), "cudaMemcpy3DPeerAsync", rank());
    };
    if (whole(src) && whole(dst)) return copy3d(dst.data, dst, src.data, src, src.slices);
    for (size_t slice = 0; slice < src.slices; ++slice) {
      if (fits(src) && fits(dst)) {
        copy3d(at(dst, slice, 0), dst, at(src, slice, 0), src, 1);
        continue;
      }
      for (size_t row = 0; row < src.rows; ++row)
        check_cuda(cudaMemcpyPeerAsync(at(dst, slice, row), dst_device, at(src, slice, row), device_, src.width, stream),
                   "cudaMemcpyPeerAsync", rank());
    }
  }

  Key key(const Op& op) const { return op.send ? Key{rank(), op.peer, op.seq} : Key{op.peer, rank(), op.seq}; }

  void add(Op op) {
    if (op.peer < 0 || op.peer >= size() || op.peer == rank())
      throw RuntimeFailure(ATTNHOST_ERR_COMMUNICATION, "rank " + std::to_string(rank()) + ": point-to-point with peer " +
                                                           std::to_string(op.peer) + " in a world of " + std::to_string(size()));
    ops_.push_back(op);
    if (depth_ == 0) meet();
  }

  // An event of this rank's device, free to record (the caller holds the meeting's lock).
  cudaEvent_t take_event() {
    std::vector<cudaEvent_t>& pool = meeting_->free_events[rank()];
    if (!pool.empty()) {
      cudaEvent_t e = pool.back();
      pool.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate", rank());
    return e;
  }

  // Waits, holding `lock`, until `ready` holds; throws after the world's timeout.
  template <class Ready>
  void wait(std::unique_lock<std::mutex>& lock, const Op& op, const char* what, Ready ready) {
    if (meeting_->changed.wait_for(lock, meeting_->timeout, ready)) return;
    throw RuntimeFailure(ATTNHOST_ERR_COMMUNICATION,
                         "rank " + std::to_string(rank()) + ": " + (op.send ? "send of " : "receive of ") +
                             op.block.shape() + " " + (op.send ? "to" : "from") + " rank " +
                             std::to_string(op.peer) + " waited " + seconds(meeting_->timeout) + " s for " + what);
  }

  void meet() {
    std::vector<Op> ops;
    ops.swap(ops_);
    // Sends go out in the order rank + 1, rank + 2, ...: had every rank sent to peers in the order
    // 0, 1, 2, ... all would first copy into rank 0, whose incoming links would carry three
    // messages while the others idled. Staggered, each step's copies form a permutation.
    std::stable_sort(ops.begin(), ops.end(), [&](const Op& a, const Op& b) {
      return (a.peer - rank() + size()) % size() < (b.peer - rank() + size()) % size();
    });
    PeerMeeting& m = *meeting_;
    // 1. Receives post their buffers.
    for (const Op& op : ops) {
      if (op.send) continue;
      std::unique_lock lock(m.mutex);
      cudaEvent_t writable = take_event();
      check_cuda(cudaEventRecord(writable, op.stream), "cudaEventRecord", rank());
      PeerMeeting::Slot& slot = m.slots[key(op)];
      slot.dst = op.block;
      slot.recv_device = device_;
      slot.writable = writable;
      m.changed.notify_all();
    }
    // 2. Sends copy once their receive is posted.
    for (const Op& op : ops) {
      if (!op.send) continue;
      std::unique_lock lock(m.mutex);
      PeerMeeting::Slot& slot = m.slots[key(op)];
      wait(lock, op, "its receive", [&] { return slot.writable != nullptr; });
      const Block& src = op.block;
      if (!src.matches(slot.dst)) {  // the receiver hears it too, rather than wait out the timeout
        slot.refused = src.shape();
        m.changed.notify_all();
        throw RuntimeFailure(ATTNHOST_ERR_COMMUNICATION,
                             "rank " + std::to_string(rank()) + " sends " + src.shape() + " to rank " +
                                 std::to_string(op.peer) + ", which receives " + slot.dst.shape());
      }
      check_cuda(cudaStreamWaitEvent(op.stream, slot.writable, 0), "cudaStreamWaitEvent", rank());
      copy(slot.dst, slot.recv_device, src, op.stream);
      m.free_events[op.peer].push_back(slot.writable);  // waited for: the receiver may record it again
      slot.writable = nullptr;
      slot.dst = Block{};
      slot.copied = take_event();
      check_cuda(cudaEventRecord(slot.copied, op.stream), "cudaEventRecord", rank());
      m.changed.notify_all();
    }
    // 3. Receives wait for their copies.
    for (const Op& op : ops) {
      if (op.send) continue;
      std::unique_lock lock(m.mutex);
      auto at = m.slots.find(key(op));
      wait(lock, op, "its send", [&] { return at->second.copied != nullptr || !at->second.refused.empty(); });
      if (!at->second.refused.empty()) {
        const std::string sent = at->second.refused;
        m.free_events[rank()].push_back(at->second.writable);  // posted, never waited for
        m.slots.erase(at);
        throw RuntimeFailure(ATTNHOST_ERR_COMMUNICATION, "rank " + std::to_string(rank()) + " receives " +
                                                             op.block.shape() + " from rank " +
                                                             std::to_string(op.peer) + ", which sends " + sent);
      }
      check_cuda(cudaStreamWaitEvent(op.stream, at->second.copied, 0), "cudaStreamWaitEvent", rank());
      m.free_events[op.peer].push_back(at->second.copied);
      m.slots.erase(at);
    }
  }

  std::unique_ptr<Communicator> nccl_;
  std::shared_ptr<PeerMeeting> meeting_;
  std::vector<uint64_t> sent_, received_;  // operations so far, by peer
  std::vector<Op> ops_;
  int depth_ = 0;
  int device_ = 0;
  size_t max_pitch_ = 0;  // cudaDevAttrMaxPitch: the largest row pitch of a 2-D or 3-D copy
};

}  // namespace

namespace {

// Collectives of ranks that share GPUs, where NCCL (one rank a GPU) cannot run: each rank waits for
// its stream, copies its input to the host, the in-process communicator combines (a reduction in
// rank order), and the result goes back before the call returns. Slow; the built-in plugins use
// point-to-point only.
class StagedCollectives final : public Communicator {
 public:
  explicit StagedCollectives(std::unique_ptr<Communicator> host) : host_(std::move(host)) {}
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const char* kind() const override { return "staged"; }
  void send(const void*, size_t, int32_t, int, void*) override { unreachable(); }
  void recv(void*, size_t, int32_t, int, void*) override { unreachable(); }
  void group_start() override {}
  void group_end() override {}
  void all_gather(const void* in, void* out, size_t n, int32_t dt, void* s) override {
    const size_t bytes = n * dtype_bytes(dt);
    std::vector<char> mine = to_host(in, bytes, s), all(bytes * size());
    host_->all_gather(mine.data(), all.data(), n, dt, nullptr);
    to_device(out, all, s);
  }
  void all_reduce(const void* in, void* out, size_t n, int32_t dt, int32_t op, void* s) override {
    const size_t bytes = n * dtype_bytes(dt);
    std::vector<char> mine = to_host(in, bytes, s), sum(bytes);
    host_->all_reduce(mine.data(), sum.data(), n, dt, op, nullptr);
    to_device(out, sum, s);
  }
  void reduce_scatter(const void* in, void* out, size_t n, int32_t dt, int32_t op, void* s) override {
    const size_t bytes = n * dtype_bytes(dt);
    std::vector<char> mine = to_host(in, bytes * size(), s), part(bytes);
    host_->reduce_scatter(mine.data(), part.data(), n, dt, op, nullptr);
    to_device(out, part, s);
  }
  void barrier() override { host_->barrier(); }

 private:
  [[noreturn]] void unreachable() const {
    throw RuntimeFailure(ATTNHOST_ERR_INTERNAL, "staged collectives carry no point-to-point (the copy engines do)");
  }
  std::vector<char> to_host(const void* src, size_t bytes, void* stream) const {
    std::vector<char> out(bytes);
    check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize", rank());
    check_cuda(cudaMemcpy(out.data(), src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy", rank());
    return out;
  }
  // On the caller's stream, waited for: a plain cudaMemcpy from pageable memory may return before
  // the bytes land, ordered only against the legacy stream, which the ranks' streams do not follow.
  void to_device(void* dst, const std::vector<char>& bytes, void* stream) const {
    const auto s = static_cast<cudaStream_t>(stream);
    check_cuda(cudaMemcpyAsync(dst, bytes.data(), bytes.size(), cudaMemcpyHostToDevice, s), "cudaMemcpyAsync", rank());
    check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize", rank());
  }
  std::unique_ptr<Communicator> host_;
};

class SharedGpuFactory final : public CommFactory {
 public:
  SharedGpuFactory(InprocWorld& world, int gpus, std::chrono::milliseconds timeout)
      : world_(world), gpus_(gpus), meeting_(make_peer_meeting(world.size(), timeout)) {}
  std::unique_ptr<Communicator> create(int rank) override {
    return with_copy_engines(std::make_unique<StagedCollectives>(world_.communicator(rank)), meeting_, gpus_);
  }

 private:
  InprocWorld& world_;
  int gpus_;
  std::shared_ptr<PeerMeeting> meeting_;
};

}  // namespace

std::unique_ptr<CommFactory> shared_gpu_factory(InprocWorld& world, int gpus, std::chrono::milliseconds timeout) {
  return std::make_unique<SharedGpuFactory>(world, gpus, timeout);
}

std::shared_ptr<PeerMeeting> make_peer_meeting(int size, std::chrono::milliseconds timeout) {
  return std::make_shared<PeerMeeting>(size, timeout);
}

std::unique_ptr<Communicator> with_copy_engines(std::unique_ptr<Communicator> nccl, std::shared_ptr<PeerMeeting> meeting,
                                                int gpus) {
  const int rank = nccl->rank();
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice", rank);
  int count = 0;
  check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount", rank);
  const int used = std::min(count, gpus > 0 ? gpus : nccl->size());
  for (int peer = 0; peer < used; ++peer) {
    if (peer == device) continue;
    cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
    else check_cuda(e, "cudaDeviceEnablePeerAccess", rank);
  }
  return std::make_unique<CopyEngineCommunicator>(std::move(nccl), std::move(meeting));
}

bool peer_access_among(int gpus) {
  for (int a = 0; a < gpus; ++a)
    for (int b = 0; b < gpus; ++b) {
      int ok = 0;
      if (a != b && (cudaDeviceCanAccessPeer(&ok, a, b) != cudaSuccess || !ok)) return false;
    }
  return true;
}

}  // namespace attnhost
