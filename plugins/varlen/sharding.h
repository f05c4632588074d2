// How varlen lays packed sequences out over the ranks (docs/VARIANTS.md, varlen).
//
// A sequence is either placed whole on one rank, or split over all P ranks:
//   causal: the sequence, padded up to a multiple of 2P, is cut into 2P chunks of c = ceil(L / 2P)
//           positions; rank r holds chunks r and 2P-1-r (zigzag within the sequence);
//   full:   padded up to a multiple of P, cut into P chunks of c = ceil(L / P); rank r holds chunk r.
// A rank's local tensor holds the split sequences first, one after another, each in the same number
// of slots on every rank (2c or c): its chunks in position order, the tokens of a chunk first and
// its padding after. Then come the sequences placed on the rank, whole, in order; the tensor is
// padded to the most slots any rank needs. So the slots [0, split_slots()) of every rank hold the
// split sequences alike: only they take part in the ring's later steps, and only they travel.
// The padding is this plugin's alone: the user's lengths are never asked to divide anything.
// A chunk that holds padding is followed only by chunks of padding (the first chunk is r < P, the
// second 2P-1-r >= P), so the tokens a rank holds of a sequence are a prefix of its slots.
#pragma once

#include <attnhost/plugin.hpp>

#include <cstdint>
#include <vector>

namespace varlen {

// One chunk of a sequence on a rank: consecutive positions in consecutive local slots.
struct Piece {
  int64_t slot;  // first local slot
  int64_t pos;   // position of that slot in its sequence
  int64_t real;  // slots that hold tokens, from the first; the rest of the chunk is padding
};

class Sharding {
 public:
  // cu_seqlens: prefix sums of the N lengths (N + 1 entries, from 0). zigzag: two chunks a rank.
  // owner[s]: the rank that holds sequence s whole, or -1 to split it; empty: every one split.
  Sharding(std::vector<int64_t> cu_seqlens, int world_size, bool zigzag, std::vector<int> owner = {});

  int64_t num_seqs() const { return static_cast<int64_t>(cu_.size()) - 1; }
  int64_t start(int64_t s) const { return cu_[s]; }  // first packed token of sequence s
  int64_t length(int64_t s) const { return cu_[s + 1] - cu_[s]; }
  int64_t sequence_of(int64_t token) const;          // the sequence that holds a packed token
  int world_size() const { return world_; }
  bool zigzag() const { return zigzag_; }
  int pieces() const { return zigzag_ ? 2 : 1; }     // chunks of a sequence on a rank
  int owner(int64_t s) const { return owner_[s]; }   // -1: split

  // First local slot of sequence s: on every rank when it is split, on its owner when placed.
  int64_t base(int64_t s) const { return base_[s]; }
  int64_t split_slots() const { return split_slots_; }
  int64_t local_tokens() const { return local_tokens_; }  // slots of a rank, padding included

  // Chunk k (0 <= k < pieces()) of sequence s on `rank`. A placed sequence is chunk 0 on its owner,
  // whole; every other chunk of it holds nothing.
  Piece piece(int rank, int64_t s, int k) const;
  // Tokens of sequence s on `rank`.
  int64_t real(int rank, int64_t s) const;
  // Which global tokens `rank` holds where (the same for queries and keys).
  attnhost::Layout layout(int rank) const;

 private:
  std::vector<int64_t> cu_, chunk_, base_;
  std::vector<int> owner_;
  int64_t split_slots_ = 0, local_tokens_ = 0;
  int world_;
  bool zigzag_;
};

}  // namespace varlen
