// attncore on the GPU: the native flash-attention kernels and the small operations around them.
//
// Each function validates its call on the host, enqueues its kernels on `stream` (a cudaStream_t;
// nullptr is the legacy default stream) and returns without synchronizing. A malformed or
// unsupported call, or a failed launch, throws attncore::Error (one line: what, and why); an error
// inside a kernel surfaces at the caller's next synchronization, as with any CUDA work.
//
// Two families of kernels, the same contract: mma.sync ones for sm_80 and newer, and on Hopper
// (compute capability 9.0, when built for sm_90a) warpgroup-product ones; native_kernels() says
// which serve the current device.
//
// Supported: bf16 and fp16 inputs, head_dim 64, 80, 96, 128, 256 (check_supported says so in one
// line); all of the Mask, GQA, segments and block lists (attention.h). FP8 e4m3 inputs at head_dim
// 64, 128 and 256: the forward on Hopper (without segments), the backward anywhere, on the bf16
// kernels after its inputs are widened in its workspace (backward_workspace_bytes), or with three
// of its products in e4m3 on Hopper at head_dim 128 for long plain calls with e4m3 dO (docs/KERNELS.md,
// "FP8 backward": dV's rel L2 then about 0.027, where the widened path's is 0.0024;
// ATTNCORE_FP8_PRODUCTS=0 takes the widened path there too); FP8 tensors need strides that are
// multiples of 16 elements. Every data pointer is device
// memory, except the BlockList struct itself (host). Q, K, V, dO and a dtype O need a 16-byte
// aligned base and strides that are multiples of 8 elements; fp32 tensors (partial O, dQ/dK/dV)
// 8-byte aligned and even strides. Lengths up to 2^31 - 1.
//
// Only available when attncore was built with CUDA (ATTNCORE_HAVE_CUDA is then defined to 1 for
// everything that links attncore); a CPU-only plugin includes attncore/cpu.h alone.
#pragma once

#if !defined(ATTNCORE_HAVE_CUDA) || !ATTNCORE_HAVE_CUDA
#error "attncore/cuda.h: attncore was built without CUDA; guard the include with #if ATTNCORE_HAVE_CUDA"
#endif

#include "attncore/attention.h"

namespace attncore {

// O and LSE (O in fp32 when p.o_fp32: a partial to merge). Rows outside every segment are untouched.
void forward_cuda(const ForwardParams& p, void* stream);

// delta = rowsum(dO * O), fp32.
void compute_delta_cuda(const DeltaParams& p, void* stream);

// Adds dQ, dK, dV into the fp32 accumulators p.dq, p.dk, p.dv, from the final LSE and delta.
// p.deterministic: bitwise reproducible (dQ by its own kernel, no atomics; about 1.4x the work),
// provided no two segments share keys. Otherwise dQ is added with fp32 atomics, whose order
// varies between runs.
void backward_cuda(const BackwardParams& p, void* stream);

// In place fp32 merge of a partial into an accumulator (MergeParams).
void merge_partial_cuda(const MergeParams& p, void* stream);

// fp32 -> bf16 / fp16 / fp32.
void convert_cuda(const ConvertParams& p, void* stream);

// max |x| (attention.h, AmaxParams), written to device memory.
void amax_cuda(const AmaxParams& p, void* stream);

// Which native kernels serve calls on the current device: "wgmma" (the Hopper kernels, sm_90a:
// warpgroup products, TMA; deterministic backwards still run mma.sync) or "mma.sync" (any other
// device, or ATTNCORE_KERNELS=mma).
const char* native_kernels();

} // namespace attncore
