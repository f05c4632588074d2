#include "attncore/attention.h"
#include "attncore/version.h"

namespace attncore {

int library_version() { return ATTNCORE_VERSION_MAJOR * 1000 + ATTNCORE_VERSION_MINOR; }

// The native kernels' instantiations (src/cuda/*_hdim*.cu): keep this list and them in step.
std::string check_supported(DType dtype, int32_t head_dim) {
  if (is_fp8(dtype)) return "attncore: FP8 runs on the CPU path only so far; the CUDA kernels take bf16 or fp16";
  if (dtype != DType::bf16 && dtype != DType::fp16)
    return "attncore: the CUDA kernels take bf16 or fp16 (the CPU reference also takes fp32)";
  switch (head_dim) {
  case 64: case 80: case 96: case 128: case 256: return {};
  default:
    return "attncore: head_dim " + std::to_string(head_dim) +
           " is not supported by the CUDA kernels; supported: 64, 80, 96, 128, 256";
  }
}

} // namespace attncore
