#include "sharding.h"

#include <algorithm>

namespace varlen {

Sharding::Sharding(std::vector<int64_t> cu_seqlens, int world_size, bool zigzag, std::vector<int> owner)
    : cu_(std::move(cu_seqlens)), owner_(std::move(owner)), world_(world_size), zigzag_(zigzag) {
  owner_.resize(num_seqs(), -1);
  const int64_t parts = int64_t{world_} * pieces();
  chunk_.assign(num_seqs(), 0);
  base_.assign(num_seqs(), 0);
  for (int64_t s = 0; s < num_seqs(); ++s) {
    if (owner_[s] >= 0) continue;
    chunk_[s] = (length(s) + parts - 1) / parts;
    base_[s] = split_slots_;
    split_slots_ += pieces() * chunk_[s];
  }
  std::vector<int64_t> placed(world_, split_slots_);  // each rank's next free slot
  for (int64_t s = 0; s < num_seqs(); ++s) {
    if (owner_[s] < 0) continue;
    chunk_[s] = length(s);
    base_[s] = placed[owner_[s]];
    placed[owner_[s]] += length(s);
  }
  local_tokens_ = *std::max_element(placed.begin(), placed.end());
}

int64_t Sharding::sequence_of(int64_t token) const {
  return std::upper_bound(cu_.begin(), cu_.end(), token) - cu_.begin() - 1;
}

Piece Sharding::piece(int rank, int64_t s, int k) const {
  const int64_t c = chunk_[s];
  if (owner_[s] >= 0) return {base_[s], k == 0 ? 0 : c, k == 0 && rank == owner_[s] ? c : 0};
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
    if (owner_[s] < 0)
      for (int k = 0; k < pieces(); ++k) {
        const Piece p = piece(rank, s, k);
        l.add(start(s) + p.pos, p.real);
        l.pad(chunk_[s] - p.real);
      }
  for (int64_t s = 0; s < num_seqs(); ++s)
    if (owner_[s] == rank) l.add(start(s), length(s));
  l.pad(local_tokens_ - l.local_tokens());
  return l;
}

}  // namespace varlen
