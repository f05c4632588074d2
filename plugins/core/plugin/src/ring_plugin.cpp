#include "attncore/plugin/ring_plugin.h"

namespace attncore::plugin {

void validate_dense(const attnhost::Problem& p) {
  using attnhost::fail;
  if (p.packed()) fail(ATTNHOST_ERR_UNSUPPORTED, "packed variable-length input is the varlen plugin's");
  if (p->seqlen_q != p->seqlen_kv)
    fail(ATTNHOST_ERR_UNSUPPORTED, "seqlen_kv (" + std::to_string(p->seqlen_kv) + ") must equal seqlen_q (" +
                                       std::to_string(p->seqlen_q) + "): self-attention only");
  if (p->heads_kv <= 0 || p->heads_q % p->heads_kv != 0)
    fail(ATTNHOST_ERR_INVALID_ARGUMENT, "heads_q must be a multiple of heads_kv");
  const DType dtype = core_dtype(p->dtype);
  const std::string why = p->device_type == ATTNHOST_DEVICE_CUDA ? check_supported(dtype, p->head_dim)
                                                                 : check_supported_cpu(dtype, p->head_dim);
  if (!why.empty()) fail(ATTNHOST_ERR_UNSUPPORTED, why);
  if (p->device_type == ATTNHOST_DEVICE_CUDA && !(kRingDevices & ATTNHOST_CAP_DEVICE_CUDA))
    fail(ATTNHOST_ERR_UNSUPPORTED, "this plugin was built without CUDA");
}

DenseMask dense_mask(const attnhost::Problem& p) {
  DenseMask m;
  m.seqlen = p->seqlen_q;
  m.causal = p->causal != 0;
  m.window_left = p->window_left;
  m.window_right = p->window_right;
  return m;
}

}  // namespace attncore::plugin
