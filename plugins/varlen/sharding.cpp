#include "sharding.h"

#include <algorithm>

namespace varlen {

Sharding::Sharding(std::vector<int64_t> cu_seqlens, int world_size, bool zigzag)
    : cu_(std::move(cu_seqlens)), world_(world_size), zigzag_(zigzag) {
  const int64_t parts = int64_t{world_} * pieces();
  base_.push_back(0);
  for (int64_t s = 0; s < num_seqs(); ++s) {
    chunk_.push_back((length(s) + parts - 1) / parts);
    base_.push_back(base_.back() + pieces() * chunk_.back());
  }
}

int64_t Sharding::sequence_of(int64_t token) const {
  return std::upper_bound(cu_.begin(), cu_.end(), token) - cu_.begin() - 1;
}

Piece Sharding::piece(int rank, int64_t s, int k) const {
  const int64_t c = chunk_[s];
  const int64_t index = k == 0 ? rank : 2 * int64_t{world_} - 1 - rank;  // which chunk of the sequence
  const int64_t pos = index * c;
  return {base_[s] + k * c, pos, std::clamp<int64_t>(length(s) - pos, 0, c)};
}

int64_t Sharding::real(int rank, int64_t s) const {
  int64_t n = 0;
  for (int k = 0; k < pieces(); ++k) n += piece(rank, s, k).real;
  return n;
}

attnhost::Layout Sharding::layout(int rank) const {
  attnhost::Layout l;
  for (int64_t s = 0; s < num_seqs(); ++s)
    for (int k = 0; k < pieces(); ++k) {
      const Piece p = piece(rank, s, k);
      l.add(start(s) + p.pos, p.real);
      l.pad(chunk_[s] - p.real);
    }
  return l;
}

}  // namespace varlen
