// Where rank threads of one process wait for each other on the host: the copy engines' meetings at
// every exchange, the barrier before each timed sample.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace attnhost {

// Waits, holding `lock`, until `ready()` holds; false once `limit` has passed. A thread blocked in a
// condition variable runs again only when the scheduler wakes it, tens of microseconds after the
// notify (30-45 us between two rank threads of an H200 host, docs/KERNELS.md, "Host meetings"), and
// a GPU waiting for that thread's next enqueue waits as long. So a waiter first spins for `spin`,
// giving its core to any other runnable thread at each turn, then blocks. Spin only where every
// rank thread has a core of its own (one thread a GPU); zero blocks at once.
// What a rank thread with a core of its own spins: well past a wake-up, short against a pass.
inline constexpr std::chrono::microseconds kOwnCoreSpin{500};

template <class Ready>
bool wait_ready(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, std::chrono::microseconds spin,
                std::chrono::milliseconds limit, Ready ready) {
  const auto start = std::chrono::steady_clock::now();
  while (!ready()) {
    const auto spent = std::chrono::steady_clock::now() - start;
    if (spent >= limit) return false;
    if (spent >= spin) return cv.wait_for(lock, limit - spent, ready);
    lock.unlock();
    std::this_thread::yield();
    lock.lock();
  }
  return true;
}

}  // namespace attnhost
