// NCCL communicators (built with CUDA and NCCL).
#pragma once

#include "runtime/comm.h"

#include <memory>

namespace attnhost {

// Wraps an initialized ncclComm_t (passed as void*) that stays owned by the cache that made it.
std::unique_ptr<Communicator> wrap_nccl(void* nccl_comm, int rank, int size);

// ncclCommInitRank from a unique id (128 bytes), on the calling thread's current device.
void* nccl_init_rank(const void* unique_id, int rank, int size);
// A fresh unique id, 128 bytes.
std::string nccl_unique_id();

}  // namespace attnhost
