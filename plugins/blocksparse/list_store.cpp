#include "list_store.h"

#include "attncore/plugin/engine.h"

#include <algorithm>
#include <cstring>

namespace blocksparse {

namespace {

constexpr size_t kAlign = 256;
size_t padded(size_t bytes) { return (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign; }

// The ten arrays of a list, each given at least one element: the CUDA path checks its pointers
// even when a list has no entries.
template <class F>
void for_each_array(const attncore::BlockListData& d, F f) {
  f(d.row_ptr.data(), d.row_ptr.size() * sizeof(int32_t));
  f(d.kv_block.data(), d.kv_block.size() * sizeof(int32_t));
  f(d.masked.data(), d.masked.size());
  f(d.col_ptr.data(), d.col_ptr.size() * sizeof(int32_t));
  f(d.q_block.data(), d.q_block.size() * sizeof(int32_t));
  f(d.q_masked.data(), d.q_masked.size());
  f(d.pieces.data(), d.pieces.size() * sizeof(int32_t));
  f(d.piece_col_ptr.data(), d.piece_col_ptr.size() * sizeof(int32_t));
  f(d.piece_q_block.data(), d.piece_q_block.size() * sizeof(int32_t));
  f(d.piece_q_masked.data(), d.piece_q_masked.size());
}

}  // namespace

ListStore::ListStore(std::vector<attncore::BlockListData> lists, bool device, attnhost::Host host)
    : data_(std::move(lists)) {
  for (const auto& d : data_) for_each_array(d, [&](const void*, size_t n) { bytes_ += padded(n); });
  if (!device) {
    for (const auto& d : data_) views_.push_back(d.view());
    return;
  }
  device_ = attnhost::HostBuffer(host, bytes_);
  // One staging copy, one upload.
  std::vector<char> staging(bytes_, 0);
  std::vector<const void*> at;
  size_t offset = 0;
  for (const auto& d : data_)
    for_each_array(d, [&](const void* src, size_t n) {
      if (n) std::memcpy(staging.data() + offset, src, n);
      at.push_back(device_.as<char>() + offset);
      offset += padded(n);
    });
  attncore::plugin::Engine::make(true, false)->upload(device_.get(), staging.data(), bytes_);
  for (size_t i = 0; i < data_.size(); ++i) {
    attncore::BlockList b = data_[i].view();
    const void* const* p = at.data() + 10 * i;
    b.row_ptr = static_cast<const int32_t*>(p[0]);
    b.kv_block = static_cast<const int32_t*>(p[1]);
    b.masked = static_cast<const uint8_t*>(p[2]);
    b.col_ptr = static_cast<const int32_t*>(p[3]);
    b.q_block = static_cast<const int32_t*>(p[4]);
    b.q_masked = static_cast<const uint8_t*>(p[5]);
    b.pieces = static_cast<const int32_t*>(p[6]);
    b.piece_col_ptr = static_cast<const int32_t*>(p[7]);
    b.piece_q_block = static_cast<const int32_t*>(p[8]);
    b.piece_q_masked = static_cast<const uint8_t*>(p[9]);
    views_.push_back(b);
  }
}

}  // namespace blocksparse
