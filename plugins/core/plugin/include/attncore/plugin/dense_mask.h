// Causal and sliding-window masks over global positions of one sequence: what a dense variant
// (ring, zigzag) computes, whatever its sharding. The keys of a query, and the queries of a key,
// are one interval each; the host's reference check enumerates them through these.
#pragma once

#include <cstdint>

namespace attncore::plugin {

struct Interval {
  int64_t lo = 0, hi = 0;  // [lo, hi)
  int64_t size() const { return hi > lo ? hi - lo : 0; }
};

struct DenseMask {
  int64_t seqlen = 0;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;  // -1: unbounded

  Interval keys_of(int64_t i) const {
    Interval r{0, seqlen};
    if (causal && i + 1 < r.hi) r.hi = i + 1;
    if (window_right >= 0 && i + window_right + 1 < r.hi) r.hi = i + window_right + 1;
    if (window_left >= 0 && i - window_left > r.lo) r.lo = i - window_left;
    return r;
  }
  Interval queries_of(int64_t j) const {
    Interval r{0, seqlen};
    if (causal && j > r.lo) r.lo = j;
    if (window_right >= 0 && j - window_right > r.lo) r.lo = j - window_right;
    if (window_left >= 0 && j + window_left + 1 < r.hi) r.hi = j + window_left + 1;
    return r;
  }
  // A block of queries at positions [q_lo, q_hi) against keys at [k_lo, k_hi): are none, some or
  // all of its pairs visible? Exact in O(1): both ends of keys_of(i) never decrease with i and
  // move by at most one per row, so the corner rows decide.
  enum class Block { empty, partial, full };
  Block block(int64_t q_lo, int64_t q_hi, int64_t k_lo, int64_t k_hi) const {
    if (q_hi <= q_lo || k_hi <= k_lo) return Block::empty;
    const Interval first = keys_of(q_lo), last = keys_of(q_hi - 1);
    if (last.hi <= k_lo || first.lo >= k_hi || last.size() == 0) return Block::empty;
    if (first.hi >= k_hi && last.lo <= k_lo) return Block::full;
    return Block::partial;
  }

  // The smallest rectangle of a block that holds all its visible pairs: the rows that see some key
  // of [k_lo, k_hi) and the keys some query of [q_lo, q_hi) sees (empty intervals when none).
  // Exact for the same reason as block(): the visible keys of a row, and the rows of a key, move
  // monotonically.
  struct Rect {
    Interval rows, keys;
  };
  Rect visible(int64_t q_lo, int64_t q_hi, int64_t k_lo, int64_t k_hi) const {
    if (block(q_lo, q_hi, k_lo, k_hi) == Block::empty) return {};
    const Interval first_key = queries_of(k_lo), last_key = queries_of(k_hi - 1);
    const Interval first_row = keys_of(q_lo), last_row = keys_of(q_hi - 1);
    Rect r;
    r.rows = {first_key.lo > q_lo ? first_key.lo : q_lo, last_key.hi < q_hi ? last_key.hi : q_hi};
    r.keys = {first_row.lo > k_lo ? first_row.lo : k_lo, last_row.hi < k_hi ? last_row.hi : k_hi};
    return r;
  }

  // Visible (query, key) pairs with queries at positions [q_lo, q_hi) and keys at [k_lo, k_hi).
  int64_t pairs(int64_t q_lo, int64_t q_hi, int64_t k_lo, int64_t k_hi) const {
    int64_t n = 0;
    for (int64_t i = q_lo; i < q_hi; ++i) {
      Interval k = keys_of(i);
      int64_t lo = k.lo > k_lo ? k.lo : k_lo, hi = k.hi < k_hi ? k.hi : k_hi;
      if (hi > lo) n += hi - lo;
    }
    return n;
  }
};

}  // namespace attncore::plugin
