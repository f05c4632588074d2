// attncore on the CPU: the reference of every operation, and what the whole tool runs in CPU mode.
//
// Same parameter structs as the CUDA kernels (attncore/attention.h), host pointers throughout.
// The algorithm is the flash one (tiles of 16 rows x 64 keys, online softmax), with every
// intermediate in Acc (float or double); inputs may be bf16, fp16 or fp32 and any head_dim >= 1.
// Calls are independent: no globals, no internal threads, safe to run from many threads at once
// on disjoint outputs. Malformed or unsupported calls throw attncore::Error.
#pragma once

#include "attncore/attention.h"

namespace attncore::cpu {

// O (dtype, or fp32 when p.o_fp32) and LSE of the rows the call covers (all rows, or the rows
// inside segments). A row that sees no key gets O = 0 and LSE = -inf.
template <class Acc> void forward(const ForwardParams& p);

// delta = rowsum(dO * O), fp32 out. Acc is the type of the sum.
template <class Acc> void compute_delta(const DeltaParams& p);

// Adds this call's dQ, dK, dV into the fp32 accumulators p.dq, p.dk, p.dv, using the final LSE and
// delta (so a ring or a sum of patterns differentiates exactly). Rows with LSE = -inf add nothing.
// p.deterministic is accepted and ignored: the CPU is always deterministic.
template <class Acc> void backward(const BackwardParams& p);

// fp32 LSE merge of a partial into an accumulator (attention.h, MergeParams).
void merge_partial(const MergeParams& p);

// fp32 -> bf16 / fp16 / fp32.
void convert(const ConvertParams& p);

// max |x| (attention.h, AmaxParams).
void amax(const AmaxParams& p);

extern template void forward<float>(const ForwardParams&);
extern template void forward<double>(const ForwardParams&);
extern template void compute_delta<float>(const DeltaParams&);
extern template void compute_delta<double>(const DeltaParams&);
extern template void backward<float>(const BackwardParams&);
extern template void backward<double>(const BackwardParams&);

} // namespace attncore::cpu
