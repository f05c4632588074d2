// How the core's masks (by global position) map onto cuDNN's for one block: pure logic, built in
// every configuration so that the CPU tests check it.
#include "attncore/cudnn.h"

namespace attncore {

// Row i, column j of the block sit at q_pos0 + i and kv_pos0 + j; with o = q_pos0 - kv_pos0 the
// core's conditions read: causal j <= i + o, window_left j >= i + o - wl, window_right
// j <= i + o + wr. cuDNN's causal mask (with its right bound shifted) is j <= i + shift, shift >= 0.
std::string cudnn_mask(const Mask& m, int64_t seqlen_q, int64_t seqlen_kv, CudnnMask* out) {
  const int64_t o = m.q_pos0 - m.kv_pos0;
  const int64_t last_q = seqlen_q > 0 ? seqlen_q - 1 : 0, last_kv = seqlen_kv > 0 ? seqlen_kv - 1 : 0;
  // A left bound that keeps column 0 for the last row keeps every pair of the block.
  if (m.window_left >= 0 && m.window_left < last_q + o)
    return "window_left " + std::to_string(m.window_left) + " cuts through the block (keys before q - " +
           std::to_string(m.window_left) + " hidden): not mapped to cuDNN's sliding window";
  bool bounded = false;
  int64_t shift = 0;
  if (m.causal) {
    bounded = true;
    shift = o;
  } else if (m.window_right >= 0) {  // non-causal right bound: a causal mask shifted by o + wr
    bounded = true;
    shift = o + m.window_right;
  }
  CudnnMask r;
  if (bounded && shift < last_kv) {  // else the last column is visible from row 0: no mask
    if (shift < 0)
      return "the right bound leaves rows without a key (q_pos0 - kv_pos0" +
             std::string(m.causal ? "" : " + window_right") + " = " + std::to_string(shift) +
             " < 0): cuDNN's causal mask cannot express it";
    r.causal = true;
    r.shift = shift;
  }
  if (out) *out = r;
  return {};
}

} // namespace attncore
