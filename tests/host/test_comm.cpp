// The in-process communicator: NCCL's semantics, and errors instead of hangs.
#include "common/errors.h"
#include "runtime/comm.h"

#include <doctest/doctest.h>

#include <functional>
#include <numeric>
#include <thread>

using namespace attnhost;

namespace {
// Runs f(rank, comm, group) on `n` threads; returns each rank's exception message ("" if none).
std::vector<std::string> on_ranks(int n, std::chrono::milliseconds timeout,
                                  const std::function<void(int, Communicator&, RankGroup&)>& f) {
  InprocWorld world(n, timeout);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      auto comm = world.communicator(r);
      auto group = world.group(r);
      try {
        f(r, *comm, *group);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}
}  // namespace

TEST_CASE("a ring exchange inside a group works in any order of send and recv") {
  const int n = 4;
  std::vector<std::vector<float>> got(n);
  auto errors = on_ranks(n, std::chrono::seconds(5), [&](int r, Communicator& c, RankGroup&) {
    std::vector<float> mine(8, static_cast<float>(r)), from_prev(8, -1);
    c.group_start();
    if (r % 2) c.recv(from_prev.data(), 8, ATTNHOST_DTYPE_FP32, (r + n - 1) % n, nullptr);
    c.send(mine.data(), 8, ATTNHOST_DTYPE_FP32, (r + 1) % n, nullptr);
    if (r % 2 == 0) c.recv(from_prev.data(), 8, ATTNHOST_DTYPE_FP32, (r + n - 1) % n, nullptr);
    c.group_end();
    got[r] = from_prev;
    CHECK(c.bytes_sent() == 32);
  });
  for (int r = 0; r < n; ++r) {
    CHECK(errors[r] == "");
    CHECK(got[r][0] == static_cast<float>((r + n - 1) % n));
  }
}

TEST_CASE("collectives: all_gather, all_reduce (bf16 too), reduce_scatter, barrier") {
  const int n = 3;
  auto errors = on_ranks(n, std::chrono::seconds(5), [&](int r, Communicator& c, RankGroup& g) {
    std::vector<int32_t> mine = {r, 10 * r}, all(2 * n);
    c.all_gather(mine.data(), all.data(), 2, ATTNHOST_DTYPE_INT32, nullptr);
    for (int i = 0; i < n; ++i) CHECK(all[2 * i + 1] == 10 * i);
    std::vector<double> x = {1.0 * r, 2.0}, sum(2);
    c.all_reduce(x.data(), sum.data(), 2, ATTNHOST_DTYPE_FP64, ATTNHOST_REDUCE_SUM, nullptr);
    CHECK(sum[0] == 3.0);
    CHECK(sum[1] == 6.0);
    std::vector<float> parts(n * 2, 1.0f + r), part(2);
    c.reduce_scatter(parts.data(), part.data(), 2, ATTNHOST_DTYPE_FP32, ATTNHOST_REDUCE_SUM, nullptr);
    CHECK(part[0] == 6.0f);
    uint16_t one = 0x3f80, total = 0;  // bf16 1.0
    c.all_reduce(&one, &total, 1, ATTNHOST_DTYPE_BF16, ATTNHOST_REDUCE_SUM, nullptr);
    CHECK(total == 0x4040);            // bf16 3.0
    c.barrier();
    CHECK(g.max({static_cast<double>(r)})[0] == n - 1);
    auto gathered = g.gather("rank" + std::to_string(r));
    if (r == 0) CHECK(gathered == std::vector<std::string>{"rank0", "rank1", "rank2"});
  });
  for (const auto& e : errors) CHECK(e == "");
}

namespace {
// Bytes of value f(i) at every byte a block covers, in a buffer of `total` bytes filled with 0xEE.
std::vector<uint8_t> laid_out(const Block& shape, size_t total, const std::function<uint8_t(size_t)>& f) {
  std::vector<uint8_t> buf(total, 0xEE), packed(shape.bytes());
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = f(i);
  Block b = shape;
  b.data = buf.data();
  unpack_block(reinterpret_cast<const char*>(packed.data()), b);
  return buf;
}
}  // namespace

// A block is matched in order with plain sends, lands in the receiver's layout (its own pitches),
// and leaves the bytes between its rows and slices alone.
TEST_CASE("blocks: strided rows land in another layout, in order with plain sends") {
  const Block from{nullptr, 24, 5, 40, 3, 240}, to{nullptr, 24, 5, 24, 3, 160};  // rows of 24 bytes, 5 x 3
  const auto value = [](size_t i) { return static_cast<uint8_t>(i * 7 + 3); };
  std::vector<uint8_t> got(480), plain_got(10);
  auto errors = on_ranks(2, std::chrono::seconds(5), [&](int r, Communicator& c, RankGroup&) {
    REQUIRE(c.blocks());
    if (r == 0) {
      std::vector<uint8_t> src = laid_out(from, 720, value), plain(10, 42);
      Block b = from;
      b.data = src.data();
      c.group_start();
      c.send(plain.data(), plain.size(), ATTNHOST_DTYPE_UINT8, 1, nullptr);
      c.send_block(b, 1, nullptr);
      c.group_end();
      CHECK(c.bytes_sent() == 10 + 24 * 5 * 3);
      return;
    }
    std::fill(got.begin(), got.end(), uint8_t{0xEE});
    Block b = to;
    b.data = got.data();
    c.group_start();
    c.recv(plain_got.data(), plain_got.size(), ATTNHOST_DTYPE_UINT8, 0, nullptr);
    c.recv_block(b, 0, nullptr);
    c.group_end();
  });
  for (int r = 0; r < 2; ++r) CHECK_MESSAGE(errors[r].empty(), "rank ", r, ": ", errors[r]);
  CHECK(plain_got == std::vector<uint8_t>(10, 42));
  CHECK(got == laid_out(to, 480, value));
}

TEST_CASE("blocks: another shape, or rows that overlap, are one-line errors") {
  auto errors = on_ranks(2, std::chrono::seconds(2), [&](int r, Communicator& c, RankGroup&) {
    std::vector<uint8_t> buf(1024);
    if (r == 0) c.send_block({buf.data(), 24, 5, 24, 3, 120}, 1, nullptr);
    else c.recv_block({buf.data(), 24, 3, 32, 5, 96}, 0, nullptr);  // (two contiguous blocks of one size would match)
  });
  CHECK(errors[0].empty());
  CHECK(errors[1] == "recv on rank 1 expected 24 x 3 x 5 bytes from rank 0, which sent 360 bytes");
  errors = on_ranks(1, std::chrono::seconds(2), [&](int, Communicator&, RankGroup&) {
    std::vector<uint8_t> buf(1024);
    check_block({buf.data(), 24, 5, 16, 1, 0}, "send on rank 0");
  });
  CHECK(errors[0] == "send on rank 0: a block of 1 slices of 5 rows of 24 bytes cannot lie at pitch 16 and slice pitch 0");
}

TEST_CASE("a receive nobody matches ends with an error naming ranks and size") {
  auto errors = on_ranks(2, std::chrono::milliseconds(200), [&](int r, Communicator& c, RankGroup&) {
    std::vector<float> buf(16);
    if (r == 1) c.recv(buf.data(), 16, ATTNHOST_DTYPE_FP32, 0, nullptr);
  });
  CHECK(errors[0] == "");
  CHECK(errors[1] == "recv of 64 bytes on rank 1 from rank 0 was never matched by a send (timed out after 200 ms)");
}

TEST_CASE("a size mismatch and a bad peer are errors") {
  auto errors = on_ranks(2, std::chrono::seconds(2), [&](int r, Communicator& c, RankGroup&) {
    std::vector<float> buf(16);
    if (r == 0) c.send(buf.data(), 8, ATTNHOST_DTYPE_FP32, 1, nullptr);
    if (r == 1) c.recv(buf.data(), 16, ATTNHOST_DTYPE_FP32, 0, nullptr);
  });
  CHECK(errors[1] == "recv on rank 1 expected 64 bytes from rank 0, which sent 32 bytes");
  auto bad = on_ranks(2, std::chrono::seconds(2), [&](int r, Communicator& c, RankGroup&) {
    float x = 0;
    if (r == 0) c.send(&x, 1, ATTNHOST_DTYPE_FP32, 5, nullptr);
  });
  CHECK(bad[0] == "send on rank 0: invalid peer 5 (world size 2)");
}

TEST_CASE("a collective one rank never joins times out with a count") {
  auto errors = on_ranks(3, std::chrono::milliseconds(200), [&](int r, Communicator& c, RankGroup&) {
    if (r != 2) c.barrier();
  });
  // How many were still waiting depends on which of the two waiting ranks gave up first.
  CHECK(errors[0].rfind("barrier on rank 0 timed out after 200 ms with ", 0) == 0);
  CHECK(errors[0].find(" of 3 ranks waiting") != std::string::npos);
  CHECK(errors[2] == "");
}

TEST_CASE("agree: every rank learns of the first failure") {
  std::vector<std::string> verdicts(3);
  on_ranks(3, std::chrono::seconds(5), [&](int r, Communicator&, RankGroup& g) {
    verdicts[r] = g.agree(r == 1 ? "boom" : "");
  });
  CHECK(verdicts[0] == "rank 1: boom");
  CHECK(verdicts[1] == "another rank failed");
  CHECK(verdicts[2] == "another rank failed");
}

#if ATTNHOST_HAVE_CUDA && ATTNHOST_HAVE_NCCL
#include "runtime/comm_factory.h"
#include "runtime/device.h"

#include <cuda_runtime.h>

#include <cstring>

namespace {
// Runs f(rank, device, comm) on one thread per visible GPU with copy-engine point-to-point;
// returns each rank's exception message ("" if none).
std::vector<std::string> on_gpus(int n, std::chrono::milliseconds timeout,
                                 const std::function<void(int, Device&, Communicator&)>& f) {
  auto comms = nccl_factory(n, true, timeout);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto device = make_cuda_device(r);
        auto comm = comms->create(r);
        f(r, *device, *comm);
        device->synchronize();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// The bytes rank `from` sends rank `to` in round `round`: a pattern no other message has.
std::vector<uint8_t> message(int from, int to, int round, size_t bytes) {
  std::vector<uint8_t> m(bytes);
  for (size_t i = 0; i < bytes; ++i) m[i] = static_cast<uint8_t>(i * 7 + from * 31 + to * 17 + round * 13);
  return m;
}
}  // namespace

// Sends become peer copies that the two ranks pair on the host; the k-th send to a peer must land
// in the peer's k-th receive, on whatever streams the two ends name.
TEST_CASE("gpu: copy-engine sends deliver rings and all-to-alls in order" * doctest::test_suite("gpu")) {
  const int n = cuda_device_count();
  if (n < 2 || !peer_access_among(n)) {
    MESSAGE("needs two GPUs that reach each other's memory");
    return;
  }
  const size_t bytes = (3 << 20) + 48;  // not a multiple of any copy granule
  const int rounds = 40;
  auto errors = on_gpus(n, std::chrono::milliseconds(20000), [&](int rank, Device& device, Communicator& comm) {
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    std::vector<void*> out(n), in(n);
    for (int p = 0; p < n; ++p) {
      out[p] = device.alloc(bytes);
      in[p] = device.alloc(bytes);
    }
    std::vector<uint8_t> got(bytes);
    for (int round = 0; round < rounds; ++round) {
      // A ring: two messages each way in one group, receives before sends on every other round,
      // the send on stream 1 and the receive on stream 2.
      device.copy_from_host(out[0], message(rank, next, round, bytes).data(), bytes);
      device.copy_from_host(out[1], message(rank, next, round + 1000, bytes).data(), bytes);
      device.synchronize();
      comm.group_start();
      if (round % 2) comm.recv(in[0], bytes, ATTNHOST_DTYPE_UINT8, prev, device.stream(2));
      comm.send(out[0], bytes, ATTNHOST_DTYPE_UINT8, next, device.stream(1));
      comm.send(out[1], bytes / 2, ATTNHOST_DTYPE_BF16, next, device.stream(1));
      if (!(round % 2)) comm.recv(in[0], bytes, ATTNHOST_DTYPE_UINT8, prev, device.stream(2));
      comm.recv(in[1], bytes / 2, ATTNHOST_DTYPE_BF16, prev, device.stream(2));
      comm.group_end();
      device.synchronize();
      device.copy_to_host(got.data(), in[0], bytes);
      REQUIRE(got == message(prev, rank, round, bytes));
      device.copy_to_host(got.data(), in[1], bytes);
      REQUIRE(got == message(prev, rank, round + 1000, bytes));
      // An all-to-all: one message to every peer, all in one group on stream 0.
      for (int p = 0; p < n; ++p) device.copy_from_host(out[p], message(rank, p, round, bytes).data(), bytes);
      device.synchronize();
      comm.group_start();
      for (int p = 0; p < n; ++p)
        if (p != rank) {
          comm.send(out[p], bytes, ATTNHOST_DTYPE_UINT8, p, device.stream(0));
          comm.recv(in[p], bytes, ATTNHOST_DTYPE_UINT8, p, device.stream(0));
        }
      comm.group_end();
      device.synchronize();
      for (int p = 0; p < n; ++p)
        if (p != rank) {
          device.copy_to_host(got.data(), in[p], bytes);
          REQUIRE(got == message(p, rank, round, bytes));
        }
    }
    CHECK(comm.bytes_sent() == uint64_t(rounds) * (2 * bytes + (n - 1) * bytes));
    for (int p = 0; p < n; ++p) {
      device.free(out[p]);
      device.free(in[p]);
    }
  });
  for (int r = 0; r < n; ++r) CHECK_MESSAGE(errors[r].empty(), "rank ", r, ": ", errors[r]);
}

// A stream-ordered exchange: the receiver's buffer is written only after what its stream did
// before the receive, and the sender's next write waits for the copy.
TEST_CASE("gpu: copy-engine sends keep both streams' order" * doctest::test_suite("gpu")) {
  const int n = cuda_device_count();
  if (n < 2 || !peer_access_among(n)) {
    MESSAGE("needs two GPUs that reach each other's memory");
    return;
  }
  const size_t bytes = 64 << 20;
  auto errors = on_gpus(2, std::chrono::milliseconds(20000), [&](int rank, Device& device, Communicator& comm) {
    void* a = device.alloc(bytes);
    void* b = device.alloc(bytes);
    void* s = device.stream(1);
    std::vector<uint8_t> got(bytes);
    for (int round = 0; round < 8; ++round) {
      // Nothing synchronizes between the fill, the exchange and the refill: stream order alone
      // keeps the refill from reaching the peer and the peer's copy from landing before the fill.
      cudaMemsetAsync(a, 0x10 + round + rank, bytes, static_cast<cudaStream_t>(s));
      cudaMemsetAsync(b, 0xEE, bytes, static_cast<cudaStream_t>(s));
      comm.group_start();
      comm.send(a, bytes, ATTNHOST_DTYPE_UINT8, 1 - rank, s);
      comm.recv(b, bytes, ATTNHOST_DTYPE_UINT8, 1 - rank, s);
      comm.group_end();
      cudaMemsetAsync(a, 0x00, bytes, static_cast<cudaStream_t>(s));
      device.synchronize();
      device.copy_to_host(got.data(), b, bytes);
      REQUIRE(got == std::vector<uint8_t>(bytes, static_cast<uint8_t>(0x10 + round + (1 - rank))));
    }
    device.free(a);
    device.free(b);
  });
  for (int r = 0; r < 2; ++r) CHECK_MESSAGE(errors[r].empty(), "rank ", r, ": ", errors[r]);
}

// Blocks as the all-to-alls lay them: a quarter of each token's heads (1536 of 6144 bytes) into
// contiguous rows with gaps between slices, one row a slice (row statistics), and slices that lie
// no whole number of rows apart, after a plain send.
TEST_CASE("gpu: copy-engine blocks land in the receiver's layout and keep their order among plain sends" * doctest::test_suite("gpu")) {
  const int n = cuda_device_count();
  if (n < 2 || !peer_access_among(n)) {
    MESSAGE("needs two GPUs that reach each other's memory");
    return;
  }
  struct Pair {
    Block from, to;
    size_t from_bytes, to_bytes;
  };
  const size_t odd = 63 * 6144 + 1536 + 272;  // a slice pitch that is no whole number of rows: a copy a slice
  const std::vector<Pair> pairs = {
      {{nullptr, 1536, 64, 6144, 3, 64 * 6144}, {nullptr, 1536, 64, 1536, 3, 2 * 64 * 1536}, 3 * 64 * 6144, 6 * 64 * 1536},
      {{nullptr, 4096, 1, 4096, 4, 3 * 4096}, {nullptr, 4096, 1, 4096, 4, 2 * 4096}, 12 * 4096, 8 * 4096},
      {{nullptr, 1536, 64, 6144, 3, odd}, {nullptr, 1536, 64, 1536, 3, 64 * 1536}, 3 * odd, 3 * 64 * 1536}};
  auto errors = on_gpus(2, std::chrono::milliseconds(20000), [&](int rank, Device& device, Communicator& comm) {
    REQUIRE(comm.blocks());
    const int peer = 1 - rank;
    const auto value = [](int from, size_t k) { return [=](size_t i) { return static_cast<uint8_t>(i * 13 + k * 5 + from); }; };
    std::vector<void*> src, dst;
    for (size_t k = 0; k < pairs.size(); ++k) {
      src.push_back(device.alloc(pairs[k].from_bytes));
      dst.push_back(device.alloc(pairs[k].to_bytes));
      device.copy_from_host(src[k], laid_out(pairs[k].from, pairs[k].from_bytes, value(rank, k)).data(), pairs[k].from_bytes);
      device.copy_from_host(dst[k], std::vector<uint8_t>(pairs[k].to_bytes, 0xEE).data(), pairs[k].to_bytes);
    }
    void* plain_out = device.alloc(4096);
    void* plain_in = device.alloc(4096);
    device.copy_from_host(plain_out, message(rank, peer, 0, 4096).data(), 4096);
    device.synchronize();
    comm.group_start();
    comm.send(plain_out, 4096, ATTNHOST_DTYPE_UINT8, peer, device.stream(2));
    for (size_t k = 0; k < pairs.size(); ++k) {
      Block b = pairs[k].from;
      b.data = src[k];
      comm.send_block(b, peer, device.stream(2));
    }
    comm.recv(plain_in, 4096, ATTNHOST_DTYPE_UINT8, peer, device.stream(2));
    for (size_t k = 0; k < pairs.size(); ++k) {
      Block b = pairs[k].to;
      b.data = dst[k];
      comm.recv_block(b, peer, device.stream(2));
    }
    comm.group_end();
    device.synchronize();
    std::vector<uint8_t> got(4096);
    device.copy_to_host(got.data(), plain_in, 4096);
    CHECK(got == message(peer, rank, 0, 4096));
    for (size_t k = 0; k < pairs.size(); ++k) {
      got.resize(pairs[k].to_bytes);
      device.copy_to_host(got.data(), dst[k], pairs[k].to_bytes);
      CHECK(got == laid_out(pairs[k].to, pairs[k].to_bytes, value(peer, k)));
      device.free(src[k]);
      device.free(dst[k]);
    }
    device.free(plain_out);
    device.free(plain_in);
  });
  for (int r = 0; r < 2; ++r) CHECK_MESSAGE(errors[r].empty(), "rank ", r, ": ", errors[r]);
}

TEST_CASE("gpu: a copy-engine size mismatch and an unmatched send are one-line errors" * doctest::test_suite("gpu")) {
  const int n = cuda_device_count();
  if (n < 2 || !peer_access_among(n)) {
    MESSAGE("needs two GPUs that reach each other's memory");
    return;
  }
  auto errors = on_gpus(2, std::chrono::milliseconds(1500), [&](int rank, Device& device, Communicator& comm) {
    void* buf = device.alloc(4096);
    if (rank == 0) comm.send(buf, 100, ATTNHOST_DTYPE_UINT8, 1, device.stream(0));
    else comm.recv(buf, 200, ATTNHOST_DTYPE_UINT8, 0, device.stream(0));
  });
  CHECK(errors[0].find("rank 0 sends 100 bytes to rank 1, which receives 200") != std::string::npos);
  // The receiver hears of the mismatch at once, rather than wait out the timeout.
  CHECK(errors[1].find("rank 1 receives 200 bytes from rank 0, which sends 100") != std::string::npos);
  errors = on_gpus(2, std::chrono::milliseconds(1500), [&](int rank, Device& device, Communicator& comm) {
    void* buf = device.alloc(4096);
    if (rank == 0) comm.send(buf, 4096, ATTNHOST_DTYPE_UINT8, 1, device.stream(0));
  });
  CHECK(errors[0].find("rank 0: send of 4096 bytes to rank 1 waited 1.5") != std::string::npos);
  CHECK(errors[1].empty());
}
#endif
