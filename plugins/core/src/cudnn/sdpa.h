// The attention graphs cuDNN's fused engines recognize, written with the backend vocabulary of
// backend.h: the same operation sequence cudnn-frontend lowers its SDPA nodes to for Hopper
// (matmul, scale, mask, softmax with stats, matmul; and the backward's chain), the single
// SDPA_FWD operation that some versions also take for an unmasked forward, and the FP8 forms of
// both directions (per-tensor descales, FP8 P and dS, FP8 outputs with their scales and amax).
#pragma once

#include <cudnn_graph.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "attncore/cudnn.h"
#include "backend.h"

namespace attncore::cudnn {

// Strides in elements of a [batch, token, head, dim] tensor (dim contiguous).
struct Layout {
  int64_t batch = 0, token = 0, head = 0;
};

struct SdpaShape {
  bool backward = false;
  bool fused_op = false;    // forward: the single SDPA_FWD operation (unmasked only)
  cudnnDataType_t io = CUDNN_DATA_BFLOAT16;  // Q, K, V, dO; CUDNN_DATA_FP8_E4M3: the FP8 graphs
  bool fp8() const { return io == CUDNN_DATA_FP8_E4M3; }
  int64_t b = 1, hq = 1, hkv = 1, sq = 0, skv = 0, d = 0;
  Layout q, k, v, o, d_o, dq, dk, dv;
  bool o_fp32 = false;      // forward: O in fp32
  bool grads_fp32 = false;  // backward: dQ/dK/dV in fp32 (else in io)
  // The FP8 graphs write O (forward) and dQ/dK/dV (backward) in io and read O (backward) in io.
  CudnnMask mask;
  bool padding = false;     // backward: seq_len tensors and the padding mask (a pre-9.16 workaround)
  float scale = 1.f;

  std::vector<int64_t> key() const;  // every field
};

// The one-element fp32 tensors of the FP8 graphs: the factors they read and the amax they write.
// cuDNN's FP8 engines take them as device tensors (as cudnn-frontend's FP8 samples bind them), so a
// call puts the factors into its scratch, one 16-byte slot each, in this order.
enum Fp8Slot : int {
  kDescaleQ, kDescaleK, kDescaleV, kDescaleS, kScaleS, kScaleO, kAmaxS, kAmaxO,  // forward
  kDescaleO, kDescaleDO, kDescaleDP, kScaleDQ, kScaleDK, kScaleDV, kScaleDP,      // backward adds
  kAmaxDQ, kAmaxDK, kAmaxDV, kAmaxDP,
  kFp8Slots
};
constexpr int64_t kFp8SlotBytes = 16;  // the 16-byte alignment every tensor of these graphs declares

// A built graph and the uids of the tensors a call binds (0: not in this graph).
struct SdpaGraph {
  std::shared_ptr<GraphBuilder> graph = std::make_shared<GraphBuilder>();
  int64_t q = 0, k = 0, v = 0, o = 0, stats = 0, d_o = 0, dq = 0, dk = 0, dv = 0;
  int64_t softmax_sum = 0, dq_accum = 0, seq_q = 0, seq_kv = 0;  // in the workspace
  int64_t fp8[kFp8Slots] = {};                                    // FP8 graphs: the slots they bind
};

SdpaGraph forward_graph(const SdpaShape& s);
SdpaGraph backward_graph(const SdpaShape& s);
SdpaGraph fp8_forward_graph(const SdpaShape& s);
SdpaGraph fp8_backward_graph(const SdpaShape& s);

} // namespace attncore::cudnn
