// The attention graphs cuDNN's fused engines recognize, written with the backend vocabulary of
// backend.h: the same operation sequence cudnn-frontend lowers its SDPA nodes to for Hopper
// (matmul, scale, mask, softmax with stats, matmul; and the backward's chain), and the single
// SDPA_FWD operation that some versions also take for an unmasked forward.
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
  cudnnDataType_t io = CUDNN_DATA_BFLOAT16;
  int64_t b = 1, hq = 1, hkv = 1, sq = 0, skv = 0, d = 0;
  Layout q, k, v, o, d_o, dq, dk, dv;
  bool o_fp32 = false;      // forward: O in fp32
  bool grads_fp32 = false;  // backward: dQ/dK/dV in fp32 (else in io)
  CudnnMask mask;
  bool padding = false;     // backward: seq_len tensors and the padding mask (a pre-9.16 workaround)
  float scale = 1.f;

  std::vector<int64_t> key() const;  // every field
};

// A built graph and the uids of the tensors a call binds (0: not in this graph).
struct SdpaGraph {
  std::shared_ptr<GraphBuilder> graph = std::make_shared<GraphBuilder>();
  int64_t q = 0, k = 0, v = 0, o = 0, stats = 0, d_o = 0, dq = 0, dk = 0, dv = 0;
  int64_t softmax_sum = 0, dq_accum = 0, seq_q = 0, seq_kv = 0;  // in the workspace
};

SdpaGraph forward_graph(const SdpaShape& s);
SdpaGraph backward_graph(const SdpaShape& s);

} // namespace attncore::cudnn
