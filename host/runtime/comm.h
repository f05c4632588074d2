// Communicators behind the ABI's host services: one interface, three implementations
// (in-process threads on the CPU, MPI processes on the CPU, NCCL on GPUs). Semantics follow
// NCCL's: point-to-point inside group_start/group_end progresses together in any order;
// collectives are called by every rank in the same order. Failures throw RuntimeFailure with a
// message that names the ranks and sizes involved.
#pragma once

#include <attnhost/plugin.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace attnhost {

// A strided block of bytes (the ABI's attnhost_block): `slices` slices of `rows` rows of `width`
// bytes, row r of slice s at data + s * slice_pitch + r * pitch.
struct Block {
  void* data = nullptr;
  size_t width = 0, rows = 1, pitch = 0, slices = 1, slice_pitch = 0;

  static Block contiguous(const void* data, size_t bytes) {
    return {const_cast<void*>(data), bytes, 1, bytes, 1, bytes};
  }
  size_t bytes() const { return width * rows * slices; }
  bool is_contiguous() const {
    return (rows == 1 || pitch == width) && (slices == 1 || slice_pitch == width * rows);
  }
  // Whether a block sent meets this one received: two contiguous blocks of one size, else the same
  // width, rows and slices.
  bool matches(const Block& o) const {
    if (is_contiguous() && o.is_contiguous()) return bytes() == o.bytes();
    return width == o.width && rows == o.rows && slices == o.slices;
  }
  std::string shape() const;  // "W x R x S bytes" (or "N bytes" when contiguous), for errors
};

// A block's pitches hold its rows and slices apart; throws RuntimeFailure naming `where` if not.
void check_block(const Block& b, const std::string& where);
// Between a block in host memory and a contiguous copy of it.
void pack_block(const Block& b, char* out);
void unpack_block(const char* in, const Block& b);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* kind() const = 0;  // "inproc", "mpi", "nccl"

  virtual void send(const void* buf, size_t count, int32_t dtype, int peer, void* stream) = 0;
  virtual void recv(void* buf, size_t count, int32_t dtype, int peer, void* stream) = 0;
  virtual void group_start() = 0;
  virtual void group_end() = 0;
  virtual void all_gather(const void* send, void* recv, size_t count_per_rank, int32_t dtype, void* stream) = 0;
  virtual void all_reduce(const void* send, void* recv, size_t count, int32_t dtype, int32_t op, void* stream) = 0;
  virtual void reduce_scatter(const void* send, void* recv, size_t count_per_rank, int32_t dtype, int32_t op,
                              void* stream) = 0;
  virtual void barrier() = 0;
  virtual void* native() { return nullptr; }

  // Point-to-point of strided blocks (ABI 1.7), matched in order with send and recv, in the same
  // groups; a block received has the width, rows and slices of the block sent. Only where blocks()
  // holds: a transport of contiguous buffers (NCCL's kernels, MPI) leaves the packing to the plugin.
  virtual bool blocks() const { return false; }
  virtual void send_block(const Block& b, int peer, void* stream);
  virtual void recv_block(const Block& b, int peer, void* stream);

  // Bytes this rank has handed to send/all_gather/all_reduce/reduce_scatter since the last reset.
  uint64_t bytes_sent() const { return bytes_sent_; }
  void reset_bytes_sent() { bytes_sent_ = 0; }

 protected:
  void count_sent(uint64_t bytes) { bytes_sent_ += bytes; }

 private:
  uint64_t bytes_sent_ = 0;
};

size_t dtype_bytes(int32_t dtype);

// Host-level coordination among the ranks of one case (not the plugin's communicator): agree on
// errors, align samples, take maxima, gather results to rank 0. Values are host values.
class RankGroup {
 public:
  virtual ~RankGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void barrier() = 0;
  virtual std::vector<double> max(const std::vector<double>& values) = 0; // elementwise, on every rank
  virtual std::vector<double> sum(const std::vector<double>& values) = 0;
  virtual std::vector<std::string> gather(const std::string& bytes) = 0; // all ranks' at rank 0
  // The first error any rank reported ("rank R: message"), or "" when every rank is fine.
  std::string agree(const std::string& my_error);
};

// ---- in-process (threads) --------------------------------------------------------------------
// One World per world size; each rank thread takes its Communicator and RankGroup from it.
class InprocWorld {
 public:
  InprocWorld(int size, std::chrono::milliseconds timeout);
  ~InprocWorld();
  int size() const;
  std::unique_ptr<Communicator> communicator(int rank);
  std::unique_ptr<RankGroup> group(int rank);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

// Reduction on the host for any dtype the ABI allows (bf16/fp16 accumulate in float).
void reduce_into(void* acc, const void* in, size_t count, int32_t dtype, int32_t op);

}  // namespace attnhost
