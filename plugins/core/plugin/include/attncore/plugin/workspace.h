// A schedule's buffers beyond the problem's tensors: one allocation, laid out by one function of the
// schedule's. The layout takes its buffers in order from a Carver. Run on a Carver without memory it
// only counts the bytes; run on the allocation it hands out the pointers; so the size and the
// carving cannot disagree. A forward and a backward never run at once: each pass lays out its
// buffers from the start of the allocation, which is as large as the larger pass, and a buffer both
// passes use is taken first by both.
#pragma once

#include <attnhost/plugin.hpp>

#include <algorithm>
#include <cstddef>
#include <functional>

namespace attncore::plugin {

// Buffers carved from one allocation start on 256-byte boundaries.
inline size_t align_up(size_t n) { return (n + 255) / 256 * 256; }

enum class Pass { forward, backward };

class Carver {
 public:
  explicit Carver(char* base = nullptr) : base_(base) {}
  // The next `bytes` of the allocation; null when counting.
  template <class T = char> T* take(size_t bytes) {
    const size_t at = used_;
    used_ += align_up(bytes);
    return base_ ? reinterpret_cast<T*>(base_ + at) : nullptr;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

// The allocation and both passes' buffers, carved once where the schedule is made. `Buffers` is the
// schedule's struct of pointers; its layout is called with a counting Carver to size the allocation,
// then with the allocation's, once per pass.
template <class Buffers>
class Workspace {
 public:
  using Layout = std::function<Buffers(Carver&, Pass)>;

  Workspace() = default;
  Workspace(attnhost::Host host, const Layout& layout) : memory_(host, bytes(layout)) {
    for (Pass pass : {Pass::forward, Pass::backward}) {
      Carver c(memory_.as<char>());
      passes_[static_cast<int>(pass)] = layout(c, pass);
    }
  }
  // The allocation a layout needs: its larger pass.
  static size_t bytes(const Layout& layout) {
    size_t most = 0;
    for (Pass pass : {Pass::forward, Pass::backward}) {
      Carver c;
      layout(c, pass);
      most = std::max(most, c.used());
    }
    return most;
  }

  const Buffers& forward() const { return passes_[static_cast<int>(Pass::forward)]; }
  const Buffers& backward() const { return passes_[static_cast<int>(Pass::backward)]; }
  size_t bytes() const { return memory_.bytes(); }

 private:
  attnhost::HostBuffer memory_;
  Buffers passes_[2]{};
};

}  // namespace attncore::plugin
