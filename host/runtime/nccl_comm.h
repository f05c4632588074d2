// NCCL communicators (built with CUDA and NCCL).
#pragma once

#include "runtime/comm.h"

#include <chrono>
#include <memory>

namespace attnhost {

// Wraps an initialized ncclComm_t (passed as void*) that stays owned by the cache that made it.
std::unique_ptr<Communicator> wrap_nccl(void* nccl_comm, int rank, int size);

// ncclCommInitRank from a unique id (128 bytes), on the calling thread's current device.
void* nccl_init_rank(const void* unique_id, int rank, int size);
// A fresh unique id, 128 bytes.
std::string nccl_unique_id();

// Point-to-point by the copy engines (copy_engine_comm.cpp): the ranks of one world, threads of
// this process, meet on the host to pair their sends and receives.
struct PeerMeeting;
std::shared_ptr<PeerMeeting> make_peer_meeting(int size, std::chrono::milliseconds timeout);
// `nccl`'s sends and receives become peer copies (its collectives stay); enables this rank's
// device to reach the other devices in use: the first `gpus` (0: one a rank, rank r on device r).
std::unique_ptr<Communicator> with_copy_engines(std::unique_ptr<Communicator> nccl, std::shared_ptr<PeerMeeting> meeting,
                                                int gpus = 0);

}  // namespace attnhost
