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
  CHECK(errors[1] == "recv on rank 1 expected 64 bytes from rank 0, which sent 32");
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
