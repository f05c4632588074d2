// LongNet dilated attention (arXiv 2307.02486, docs/VARIANTS.md): which rows each pattern selects, how
// the sequence is sharded, and what one rank computes for one pattern. Host code only; every
// device table of the schedule (dilated_attention.h) is built from what this file answers, and
// so are the pair counts and the reference enumeration.
//
// A pattern (w, r) cuts the sequence into segments of w tokens (the last one padded). In segment g
// head h selects the rows g*w + off(h) + t*r for t = 0, 1, ... while off(h) + t*r < w and the row
// is < S (the padding, and the tail of a segment whose length is not a multiple of r, select
// nothing). The selected rows of one (segment, head) attend each other (causal on position).
// off(h) is h mod r (paper) or h / ceil(H / r) (torchscale: contiguous head groups).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dilated {

enum class OffsetMode { paper, torchscale };

struct Pattern {
  int64_t w;  // segment length
  int64_t r;  // dilation rate
};

// The rows of one (pattern, segment, head): first + t*step for t in [0, count).
struct Lattice {
  int64_t first = 0, step = 1, count = 0;
  int64_t position(int64_t t) const { return first + t * step; }
  // The t of the rows in positions [x, y): [t_lo, t_hi), empty when t_lo == t_hi.
  std::pair<int64_t, int64_t> within(int64_t x, int64_t y) const;
};

// One (head, segment) a rank computes for a pattern: its local queries t in [tq_lo, tq_hi) attend
// the keys t in [0, kv_hi) (causal: only up to its last query). In the gathered buffers of the
// pattern, row t of this region's queries is q_slot + t - tq_lo of its head, key t is kv_slot + t.
struct Region {
  int32_t head;
  int64_t segment;
  Lattice rows;
  int64_t tq_lo, tq_hi, kv_hi;
  int64_t q_slot, kv_slot;
};

// What one rank computes for one pattern.
struct PatternPlan {
  std::vector<Region> regions;  // by head, then segment
  int64_t nq = 0, nk = 0;       // gathered query and key rows per head
  bool remote = false;          // some key it needs lives on another rank
};

// Keys one rank sends another for a pattern, in the receiver's region order: region `region` of
// the receiver's plan, keys t in [t_lo, t_hi).
struct Run {
  int32_t region;
  int64_t t_lo, t_hi;
};

class Geometry {
 public:
  Geometry(int64_t seqlen, int32_t heads, bool causal, OffsetMode mode, std::vector<Pattern> patterns, int world);

  int64_t seqlen() const { return seqlen_; }
  int32_t heads() const { return heads_; }
  bool causal() const { return causal_; }
  const std::vector<Pattern>& patterns() const { return patterns_; }
  int64_t offset(size_t p, int32_t head) const;
  int64_t segments(size_t p) const { return (seqlen_ + patterns_[p].w - 1) / patterns_[p].w; }
  Lattice lattice(size_t p, int32_t head, int64_t segment) const;
  // Is position `pos` selected for `head` by pattern p? Then *t is its row in its segment's lattice.
  bool selects(size_t p, int32_t head, int64_t pos, int64_t* t) const;

  // Contiguous sharding: rank k holds [begin(k), end(k)); every rank has chunk() local slots.
  int world() const { return world_; }
  int64_t chunk() const { return chunk_; }
  int64_t begin(int rank) const;
  int64_t end(int rank) const;
  int owner(int64_t pos) const { return static_cast<int>(pos / chunk_); }

  PatternPlan plan(size_t p, int rank) const;
  // Keys of `receiver`'s plan that `sender` holds (empty when sender == receiver's own keys).
  std::vector<Run> runs(const PatternPlan& receiver, int sender) const;

  // (query, key) pairs with multiplicity: of a plan's regions (per batch entry), and of the whole
  // problem (per batch entry, every head and pattern).
  static int64_t pairs(const PatternPlan& plan, bool causal);
  int64_t total_pairs() const;

 private:
  int64_t seqlen_;
  int32_t heads_;
  bool causal_;
  OffsetMode mode_;
  std::vector<Pattern> patterns_;
  int world_;
  int64_t chunk_;
};

// "" or what is wrong with these patterns (lengths, rates, how many).
std::string check_patterns(const std::vector<int64_t>& segment_lengths, const std::vector<int64_t>& dilation_rates);

inline constexpr int kMaxPatterns = 16;  // the combine kernel takes the patterns by value

}  // namespace dilated
