#include "attncore/attention.h"
#include "attncore/version.h"

namespace attncore {

int library_version() { return ATTNCORE_VERSION_MAJOR * 1000 + ATTNCORE_VERSION_MINOR; }

// The native kernels' instantiations (src/cuda/*_hdim*.cu): keep this list and them in step.
std::string check_supported(DType dtype, int32_t head_dim) {
  if (is_fp8(dtype)) {
    if (dtype != DType::fp8_e4m3) return "attncore: FP8 on CUDA takes e4m3 (e5m2 runs on the CPU path)";
    if (head_dim != 64 && head_dim != 128 && head_dim != 256)
      return "attncore: head_dim " + std::to_string(head_dim) + " is not supported by the FP8 kernels; supported: 64, 128, 256";
    return {};
  }
  if (dtype != DType::bf16 && dtype != DType::fp16)
    return "attncore: the CUDA kernels take bf16 or fp16 (the CPU reference also takes fp32)";
  switch (head_dim) {
  case 64: case 80: case 96: case 128: case 256: return {};
  default:
    return "attncore: head_dim " + std::to_string(head_dim) +
           " is not supported by the CUDA kernels; supported: 64, 80, 96, 128, 256";
  }
}

std::string check_supported_do(DType dtype, DType dtype_do) {
  if (dtype_do == DType::invalid || dtype_do == dtype) return {};
  if (dtype == DType::fp8_e4m3 && dtype_do == DType::fp8_e5m2) return {};
  return "attncore: dO in another type than Q, K and V is taken only as fp8_e5m2 beside fp8_e4m3 inputs";
}

std::string check_grad_addend(const BackwardParams& p) {
  if (!p.dk_add.data && !p.dv_add.data) return {};
  if (!p.dk_add.data || !p.dv_add.data) return "attncore: backward: dk_add and dv_add go together";
  if (!p.write_dkdv) return "attncore: backward: dk_add and dv_add go with write_dkdv (they are added before dK and dV are written)";
  if (p.blocks) return "attncore: backward: dk_add and dv_add are not taken with a block list";
  if (p.add_begin < 0 || p.add_begin > p.add_end || p.add_end > p.seqlen_kv)
    return "attncore: backward: the added keys [" + std::to_string(p.add_begin) + ", " + std::to_string(p.add_end) +
           ") are not within the call's " + std::to_string(p.seqlen_kv);
  return {};
}

// Since 3.1 the backward takes what the forward takes.
std::string check_supported_forward(DType dtype, int32_t head_dim) { return check_supported(dtype, head_dim); }

// V with its keys contiguous: [batch][kv head][head dim][keys rounded up to 32] bytes (the Hopper
// FP8 forward, src/cuda/sm90/forward_sm90_fp8.cuh).
size_t forward_workspace_bytes(const ForwardParams& p) {
  if (!is_fp8(p.dtype)) return 0;
  return size_t(p.batch) * size_t(p.heads_kv) * size_t(p.head_dim) * size_t((p.seqlen_kv + 31) / 32 * 32);
}

} // namespace attncore
