// The block lists of a rank's attention calls where the core reads them: the host vectors on the
// CPU; on a GPU, one allocation from the host's allocator (so the host counts it), uploaded once
// when the instance is created and reused by every forward and backward.
#pragma once

#include "attncore/block_list.h"

#include <attnhost/plugin.hpp>

#include <vector>

namespace blocksparse {

class ListStore {
 public:
  ListStore() = default;
  ListStore(std::vector<attncore::BlockListData> lists, bool device, attnhost::Host host);
  const attncore::BlockList* get(size_t i) const { return &views_[i]; }
  size_t bytes() const { return bytes_; }  // what the lists take (device memory on a GPU)

 private:
  std::vector<attncore::BlockListData> data_;
  std::vector<attncore::BlockList> views_;
  attnhost::HostBuffer device_;
  size_t bytes_ = 0;
};

}  // namespace blocksparse
