// attncore on cuDNN: the dense blocks of a variant through cuDNN's fused attention (the backend
// graph API, cudnn_graph.h; no frontend library), with the same parameter structs as the native
// kernels (attncore/cuda.h).
//
// What it serves, and what not. A call is served when its answer from cudnn_check is empty; every
// other call gets a one-line reason and must go to the native kernels (never a failure):
//  - bf16 or fp16; head_dim a multiple of 8 up to 256; GQA (heads_q a multiple of heads_kv);
//  - FP8 e4m3 (cuDNN 9.1 on, not 9.10.0; Hopper or newer): the forward through cuDNN's FP8 graph,
//    whose Hopper engines write O in FP8 only, so O lands in scratch (scaled by 1 / (2 descale_v))
//    and one kernel writes it in bf16; the backward (head dim 128 on Hopper, FP8 gradients
//    converted or added after) only with ATTNCORE_CUDNN_FP8_BACKWARD=force, since the call carries
//    no amax history for the gradients' scales, which are then guesses: a timing line;
//  - masks by global position (attention.h) that are fully visible (no mask), causal with
//    q_pos0 - kv_pos0 = 0 (cuDNN's top-left causal mask) or > 0 (the same mask with its right
//    bound shifted), or that a window leaves untouched inside the block. Not served: a causal
//    offset < 0 (rows with no key), windows that cut through the block, segments, block lists;
//  - forward: O in dtype; LSE from cuDNN's softmax stats, which are max + log(sum exp) of the scaled
//    scores in natural log: the core's convention as they come. O in fp32 (o_fp32, a partial to
//    merge) is not served: cuDNN 9.14 and 9.19 build that graph and write wrong values (measured,
//    docs/KERNELS.md, "cuDNN engine"), and a bf16 O widened would carry its rounding into the merge;
//  - backward: needs BackwardParams::o (cuDNN recomputes delta from dO and O in its graph) and reads
//    LSE from p.lse. Gradients are written in dtype (write_grads, what frameworks do). Adding them
//    into the fp32 accumulators (the core's contract) would need fp32 dQ/dK/dV outputs, landing in
//    scratch for one kernel to add (cuDNN overwrites): those graphs wrote wrong values or did not
//    build (GQA), so such calls are not served. ATTNCORE_CUDNN_FP32_OUTPUTS=force serves both fp32
//    forms anyway, to measure a new cuDNN. Not deterministic (cuDNN adds dQ with atomics):
//    deterministic calls are not served.
// Whether cuDNN builds a graph is a property of the loaded library and the GPU, so cudnn_check
// builds (and caches) the execution plan of the call's shape the first time it sees it; its answer
// is what this cuDNN on this device can do. docs/KERNELS.md, "cuDNN engine", records what was seen.
//
// Plans are cached per device and per shape (every dimension, stride, dtype and mask parameter);
// a call with a cached plan only binds pointers and enqueues. Thread-safe. The library is linked
// dynamically; cudnn_version says which one was loaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "attncore/attention.h"

namespace attncore {

// Scratch device memory for one call: get(context, bytes) returns at least `bytes` bytes of device
// memory on the call's device, 256-byte aligned, that stays valid until the work the call enqueues
// on its stream has finished (a buffer the caller keeps and grows is the usual answer). Called at
// most once per call, never for 0 bytes. The plugin layer's engine (attncore/plugin/engine.h) passes
// the host's allocator.
struct Workspace {
  void* (*get)(void* context, size_t bytes) = nullptr;
  void* context = nullptr;
};

// The loaded cuDNN's version (e.g. 91400 for 9.14.0), or 0 when attncore was built without cuDNN.
int cudnn_version();
// "9.14.0", or "none (attncore was built without cuDNN)".
std::string cudnn_version_string();

// Empty when forward_cudnn / backward_cudnn serve the call on the current device, else one line
// saying why not (what cuDNN or this engine lacks, or the status of the graph cuDNN could not build).
std::string cudnn_check(const ForwardParams& p);
std::string cudnn_check(const BackwardParams& p);
inline bool cudnn_supports(const ForwardParams& p, std::string* why = nullptr) {
  std::string w = cudnn_check(p);
  if (why) *why = w;
  return w.empty();
}
inline bool cudnn_supports(const BackwardParams& p, std::string* why = nullptr) {
  std::string w = cudnn_check(p);
  if (why) *why = w;
  return w.empty();
}

// What serves a supported call: the graph kind, the heuristics' engine config, cuDNN's workspace
// (for the logs and docs/KERNELS.md, "cuDNN engine"); cudnn_check's reason otherwise.
std::string cudnn_plan_info(const ForwardParams& p);
std::string cudnn_plan_info(const BackwardParams& p);

// As forward_cuda / backward_cuda: validate, enqueue on `stream` (a cudaStream_t), return. An
// unsupported call throws attncore::Error with cudnn_check's reason; so does a failed launch.
void forward_cudnn(const ForwardParams& p, void* stream, const Workspace& ws);
void backward_cudnn(const BackwardParams& p, void* stream, const Workspace& ws);

// How a mask by global positions maps onto cuDNN's masks for one block of seqlen_q x seqlen_kv.
// Pure logic, available in every build (the CPU tests check it).
struct CudnnMask {
  bool causal = false;   // key j visible to row i iff j <= i + shift
  int64_t shift = 0;     // q_pos0 - kv_pos0, >= 0
};
// Empty and *out filled when cuDNN can express `m` on this block, else the reason.
std::string cudnn_mask(const Mask& m, int64_t seqlen_q, int64_t seqlen_kv, CudnnMask* out);

} // namespace attncore
