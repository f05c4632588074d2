// The CPU communicator: rank threads of one process. Sends are buffered (copied into the
// receiver's mailbox), so a send never waits; receives inside a group wait at group_end, so any
// order of sends and receives inside a group works, as with NCCL. Every wait has a deadline: a
// receive nobody matches ends with an error naming both ranks and the size, never a hang.
#include "common/errors.h"
#include "runtime/comm.h"
#include "runtime/data.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>

namespace attnhost {

size_t dtype_bytes(int32_t dtype) {
  switch (dtype) {
    case ATTNHOST_DTYPE_BF16: case ATTNHOST_DTYPE_FP16: return 2;
    case ATTNHOST_DTYPE_FP32: case ATTNHOST_DTYPE_INT32: return 4;
    case ATTNHOST_DTYPE_FP64: case ATTNHOST_DTYPE_INT64: return 8;
    case ATTNHOST_DTYPE_UINT8: case ATTNHOST_DTYPE_FP8_E4M3: case ATTNHOST_DTYPE_FP8_E5M2: return 1;
    default: throw RuntimeFailure(ATTNHOST_ERR_INVALID_ARGUMENT, "unknown dtype " + std::to_string(dtype));
  }
}

std::string Block::shape() const {
  if (is_contiguous()) return std::to_string(bytes()) + " bytes";
  return std::to_string(width) + " x " + std::to_string(rows) + " x " + std::to_string(slices) + " bytes";
}

void check_block(const Block& b, const std::string& where) {
  const bool rows_apart = b.rows <= 1 || b.pitch >= b.width;
  const bool slices_apart = b.slices <= 1 || b.slice_pitch >= b.pitch * (b.rows - 1) + b.width;
  if (b.width == 0 || b.rows == 0 || b.slices == 0 || !rows_apart || !slices_apart)
    throw RuntimeFailure(ATTNHOST_ERR_INVALID_ARGUMENT,
                         where + ": a block of " + std::to_string(b.slices) + " slices of " + std::to_string(b.rows) +
                             " rows of " + std::to_string(b.width) + " bytes cannot lie at pitch " +
                             std::to_string(b.pitch) + " and slice pitch " + std::to_string(b.slice_pitch));
}

void pack_block(const Block& b, char* out) {
  for (size_t s = 0; s < b.slices; ++s)
    for (size_t r = 0; r < b.rows; ++r, out += b.width)
      std::memcpy(out, static_cast<const char*>(b.data) + s * b.slice_pitch + r * b.pitch, b.width);
}

void unpack_block(const char* in, const Block& b) {
  for (size_t s = 0; s < b.slices; ++s)
    for (size_t r = 0; r < b.rows; ++r, in += b.width)
      std::memcpy(static_cast<char*>(b.data) + s * b.slice_pitch + r * b.pitch, in, b.width);
}

void Communicator::send_block(const Block&, int, void*) {
  throw RuntimeFailure(ATTNHOST_ERR_UNSUPPORTED, std::string("the ") + kind() +
                                                     " transport moves contiguous buffers only: pack the block and send it");
}

void Communicator::recv_block(const Block&, int, void*) {
  throw RuntimeFailure(ATTNHOST_ERR_UNSUPPORTED, std::string("the ") + kind() +
                                                     " transport moves contiguous buffers only: receive a packed block");
}

namespace {

template <class T, class Load, class Store>
void reduce_typed(void* acc, const void* in, size_t n, int32_t op, Load load, Store store) {
  auto* a = static_cast<T*>(acc);
  auto* b = static_cast<const T*>(in);
  for (size_t i = 0; i < n; ++i) {
    auto x = load(a[i]), y = load(b[i]);
    a[i] = store(op == ATTNHOST_REDUCE_SUM ? x + y : op == ATTNHOST_REDUCE_MAX ? std::max(x, y) : std::min(x, y));
  }
}

}  // namespace

void reduce_into(void* acc, const void* in, size_t n, int32_t dtype, int32_t op) {
  auto same = [](auto v) { return v; };
  switch (dtype) {
    case ATTNHOST_DTYPE_FP32: return reduce_typed<float>(acc, in, n, op, same, same);
    case ATTNHOST_DTYPE_FP64: return reduce_typed<double>(acc, in, n, op, same, same);
    case ATTNHOST_DTYPE_INT32: return reduce_typed<int32_t>(acc, in, n, op, same, same);
    case ATTNHOST_DTYPE_INT64: return reduce_typed<int64_t>(acc, in, n, op, same, same);
    case ATTNHOST_DTYPE_UINT8: return reduce_typed<uint8_t>(acc, in, n, op, same, [](int v) { return uint8_t(v); });
    case ATTNHOST_DTYPE_BF16:
      return reduce_typed<uint16_t>(acc, in, n, op, [](uint16_t v) { return data::from_bf16(v); },
                                    [](float v) { return data::to_bf16(v); });
    case ATTNHOST_DTYPE_FP16:
      return reduce_typed<uint16_t>(acc, in, n, op, [](uint16_t v) { return data::from_fp16(v); },
                                    [](float v) { return data::to_fp16(v); });
    default: throw RuntimeFailure(ATTNHOST_ERR_INVALID_ARGUMENT, "cannot reduce dtype " + std::to_string(dtype));
  }
}

std::string RankGroup::agree(const std::string& my_error) {
  std::vector<std::string> all = gather(my_error);
  std::string first;
  if (rank() == 0)
    for (size_t r = 0; r < all.size() && first.empty(); ++r)
      if (!all[r].empty()) first = size() > 1 ? "rank " + std::to_string(r) + ": " + all[r] : all[r];
  // Share rank 0's verdict: every rank leaves with the same answer.
  std::vector<double> flag = max({first.empty() ? 0.0 : 1.0});
  if (flag[0] == 0.0) return "";
  return rank() == 0 ? first : "another rank failed";
}

struct InprocWorld::State {
  // Host-level waits outlast the plugin's: a rank stuck in a receive times out first, reports,
  // and still reaches the host's agreement step.
  explicit State(int n, std::chrono::milliseconds t)
      : size(n), timeout(t), group_timeout(3 * t + std::chrono::seconds(10)), mailbox(n * n), slots(n) {}

  struct Message {
    std::vector<char> bytes;
    Block shape;  // as sent (its data pointer is the sender's, not read)
  };
  int size;
  std::chrono::milliseconds timeout, group_timeout;
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::deque<Message>> mailbox; // [from * size + to]

  // Rendezvous for collectives and the rank group: each rank posts a pointer, all read all.
  std::vector<const void*> slots;
  int arrived = 0;
  uint64_t generation = 0;

  // Waits until every rank has arrived at this generation, or fails after the deadline.
  void arrive_and_wait(std::unique_lock<std::mutex>& lock, int rank, const char* what) {
    const bool host = std::strncmp(what, "host", 4) == 0;
    const std::chrono::milliseconds limit = host ? group_timeout : timeout;
    uint64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    if (!cv.wait_for(lock, limit, [&] { return generation != gen; })) {
      const int present = arrived;
      --arrived;  // withdraw, so that the rendezvous still counts right for the next operation
      throw RuntimeFailure(ATTNHOST_ERR_COMMUNICATION,
                           std::string(what) + " on rank " + std::to_string(rank) + " timed out after " +
                               std::to_string(limit.count()) + " ms with " + std::to_string(present) + " of " +
                               std::to_string(size) + " ranks waiting");
    }
  }

  // All ranks post `mine`, then `use` reads every rank's post, then all leave together.
  template <class F>
  void exchange(int rank, const void* mine, const char* what, F use) {
    std::unique_lock lock(mutex);
    slots[rank] = mine;
    arrive_and_wait(lock, rank, what);
    lock.unlock();
    use(slots);
    lock.lock();
    arrive_and_wait(lock, rank, what);
  }
};

namespace {

class InprocCommunicator final : public Communicator {
 public:
  InprocCommunicator(std::shared_ptr<InprocWorld::State> s, int rank) : s_(std::move(s)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_->size; }
  const char* kind() const override { return "inproc"; }

  void send(const void* buf, size_t count, int32_t dtype, int peer, void* s) override {
    send_block(Block::contiguous(buf, count * dtype_bytes(dtype)), peer, s);
  }

  void recv(void* buf, size_t count, int32_t dtype, int peer, void* s) override {
    recv_block(Block::contiguous(buf, count * dtype_bytes(dtype)), peer, s);
  }

  bool blocks() const override { return true; }

  // A message carries the block packed, and the shape it had, so that a receive checks it.
  void send_block(const Block& b, int peer, void*) override {
    check_peer(peer, "send");
    check_block(b, "send on rank " + std::to_string(rank_));
    InprocWorld::State::Message m;
    m.bytes.resize(b.bytes());
    pack_block(b, m.bytes.data());
    m.shape = b;
    count_sent(b.bytes());
    std::lock_guard lock(s_->mutex);
    s_->mailbox[rank_ * s_->size + peer].push_back(std::move(m));
    s_->cv.notify_all();
  }

  void recv_block(const Block& b, int peer, void*) override {
    check_peer(peer, "recv");
    check_block(b, "recv on rank " + std::to_string(rank_));
    if (in_group_) {
      pending_.push_back({b, peer});
      return;
    }
    receive(b, peer);
  }

  void group_start() override { ++in_group_; }
  void group_end() override {
    if (in_group_ == 0) throw RuntimeFailure(ATTNHOST_ERR_COMMUNICATION, "group_end without group_start");
    if (--in_group_ > 0) return;
    std::vector<Pending> todo;
    todo.swap(pending_);
    for (const Pending& p : todo) receive(p.block, p.peer);
  }

  void all_gather(const void* send, void* recv, size_t count, int32_t dtype, void*) override {
    size_t bytes = count * dtype_bytes(dtype);
    count_sent(bytes * (s_->size - 1));
    s_->exchange(rank_, send, "all_gather", [&](const std::vector<const void*>& all) {
      for (int r = 0; r < s_->size; ++r)
        std::memcpy(static_cast<char*>(recv) + r * bytes, all[r], bytes);
    });
  }

  void all_reduce(const void* send, void* recv, size_t count, int32_t dtype, int32_t op, void*) override {
    size_t bytes = count * dtype_bytes(dtype);
    count_sent(bytes);
    std::vector<char> acc(bytes);
    s_->exchange(rank_, send, "all_reduce", [&](const std::vector<const void*>& all) {
      std::memcpy(acc.data(), all[0], bytes);  // rank order: every rank gets the same bits
      for (int r = 1; r < s_->size; ++r) reduce_into(acc.data(), all[r], count, dtype, op);
    });
    std::memcpy(recv, acc.data(), bytes);
  }

  void reduce_scatter(const void* send, void* recv, size_t count, int32_t dtype, int32_t op, void*) override {
    size_t bytes = count * dtype_bytes(dtype);
    count_sent(bytes * (s_->size - 1));
    std::vector<char> acc(bytes);
    s_->exchange(rank_, send, "reduce_scatter", [&](const std::vector<const void*>& all) {
      auto part = [&](int r) { return static_cast<const char*>(all[r]) + rank_ * bytes; };
      std::memcpy(acc.data(), part(0), bytes);
      for (int r = 1; r < s_->size; ++r) reduce_into(acc.data(), part(r), count, dtype, op);
    });
    std::memcpy(recv, acc.data(), bytes);
  }

  void barrier() override {
    std::unique_lock lock(s_->mutex);
    s_->arrive_and_wait(lock, rank_, "barrier");
  }

 private:
  struct Pending {
    Block block;
    int peer;
  };

  void check_peer(int peer, const char* what) const {
    if (peer < 0 || peer >= s_->size || peer == rank_)
      throw RuntimeFailure(ATTNHOST_ERR_COMMUNICATION, std::string(what) + " on rank " + std::to_string(rank_) +
                                                           ": invalid peer " + std::to_string(peer) + " (world size " +
                                                           std::to_string(s_->size) + ")");
  }

  void receive(const Block& b, int peer) {
    const size_t bytes = b.bytes();
    std::unique_lock lock(s_->mutex);
    auto& box = s_->mailbox[peer * s_->size + rank_];
    if (!s_->cv.wait_for(lock, s_->timeout, [&] { return !box.empty(); }))
      throw RuntimeFailure(ATTNHOST_ERR_COMMUNICATION,
                           "recv of " + std::to_string(bytes) + " bytes on rank " + std::to_string(rank_) +
                               " from rank " + std::to_string(peer) + " was never matched by a send (timed out after " +
                               std::to_string(s_->timeout.count()) + " ms)");
    InprocWorld::State::Message m = std::move(box.front());
    box.pop_front();
    lock.unlock();
    if (!m.shape.matches(b))
      throw RuntimeFailure(ATTNHOST_ERR_COMMUNICATION,
                           "recv on rank " + std::to_string(rank_) + " expected " + b.shape() + " from rank " +
                               std::to_string(peer) + ", which sent " + m.shape.shape());
    unpack_block(m.bytes.data(), b);
  }

  std::shared_ptr<InprocWorld::State> s_;
  int rank_;
  int in_group_ = 0;
  std::vector<Pending> pending_;
};

class InprocGroup final : public RankGroup {
 public:
  InprocGroup(std::shared_ptr<InprocWorld::State> s, int rank) : s_(std::move(s)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_->size; }
  void barrier() override {
    std::unique_lock lock(s_->mutex);
    s_->arrive_and_wait(lock, rank_, "host barrier");
  }
  std::vector<double> max(const std::vector<double>& v) override { return combine(v, true); }
  std::vector<double> sum(const std::vector<double>& v) override { return combine(v, false); }
  std::vector<std::string> gather(const std::string& bytes) override {
    std::vector<std::string> out;
    s_->exchange(rank_, &bytes, "host gather", [&](const std::vector<const void*>& all) {
      if (rank_ != 0) return;
      for (const void* p : all) out.push_back(*static_cast<const std::string*>(p));
    });
    return out;
  }

 private:
  // Every rank combines all posts in rank order, so every rank gets the same bits.
  std::vector<double> combine(const std::vector<double>& v, bool is_max) {
    std::vector<double> out;
    s_->exchange(rank_, &v, "host reduction", [&](const std::vector<const void*>& all) {
      out = *static_cast<const std::vector<double>*>(all[0]);
      for (size_t r = 1; r < all.size(); ++r) {
        const auto& o = *static_cast<const std::vector<double>*>(all[r]);
        for (size_t i = 0; i < out.size() && i < o.size(); ++i) out[i] = is_max ? std::max(out[i], o[i]) : out[i] + o[i];
      }
    });
    return out;
  }

  std::shared_ptr<InprocWorld::State> s_;
  int rank_;
};

}  // namespace

InprocWorld::InprocWorld(int size, std::chrono::milliseconds timeout)
    : state_(std::make_shared<State>(size, timeout)) {}
InprocWorld::~InprocWorld() = default;
int InprocWorld::size() const { return state_->size; }
std::unique_ptr<Communicator> InprocWorld::communicator(int rank) {
  return std::make_unique<InprocCommunicator>(state_, rank);
}
std::unique_ptr<RankGroup> InprocWorld::group(int rank) { return std::make_unique<InprocGroup>(state_, rank); }

}  // namespace attnhost
