#include "tensor_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace attncore::cuda::sm90 {

namespace {

// The driver's encoder, reached through the runtime so that nothing links libcuda directly.
PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

constexpr uint64_t kMaxStride = uint64_t(1) << 40;

} // namespace

bool sm90a_device() {
#if ATTNCORE_HAVE_SM90
  constexpr int kMaxDevices = 64;
  static std::array<int8_t, kMaxDevices> sm90a{}; // 0 unknown, 1 yes, -1 no
  static std::mutex mu;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return false;
  std::lock_guard<std::mutex> lock(mu);
  if (sm90a[dev] == 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    sm90a[dev] = (major == 9 && minor == 0 && encoder()) ? 1 : -1;
  }
  return sm90a[dev] > 0;
#else
  return false;
#endif
}

bool hopper_path_enabled() {
  // Read on every call, so that a test can switch paths; the device's capability once.
  if (const char* force = std::getenv("ATTNCORE_KERNELS"); force && std::strcmp(force, "mma") == 0) return false;
  return sm90a_device();
}

bool tma_readable(const TensorRef& t, int elem_bytes) {
  const auto ok = [&](int64_t elems) {
    return elems >= 0 && uint64_t(elems) * elem_bytes < kMaxStride && elems * elem_bytes % 16 == 0;
  };
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && ok(t.batch_stride) && ok(t.token_stride) &&
         ok(t.head_stride);
}

CUtensorMap make_tile_map(const TensorRef& t, DType dtype, int32_t batch, int64_t tokens, int32_t heads, int32_t dim,
                          int box_rows, int box_cols, CUtensorMapSwizzle swizzle) {
  // A dimension of extent 1 is never stepped along: any legal stride will do (0 is not one).
  const uint64_t el = uint64_t(dtype_bytes(dtype));
  const auto stride = [&](int64_t elems, int64_t extent) { return extent > 1 ? uint64_t(elems) * el : uint64_t(16); };
  const cuuint64_t dims[4] = {cuuint64_t(dim), cuuint64_t(tokens > 0 ? tokens : 1), cuuint64_t(heads),
                              cuuint64_t(batch)};
  const cuuint64_t strides[3] = {stride(t.token_stride, tokens), stride(t.head_stride, heads),
                                 stride(t.batch_stride, batch)};
  const cuuint32_t box[4] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1, 1};
  const cuuint32_t steps[4] = {1, 1, 1, 1};
  CUtensorMap map;
  std::memset(&map, 0, sizeof map);
  const auto encode = encoder();
  const CUresult r =
      encode ? encode(&map,
                      dtype == DType::fp32   ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                      : dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                      : is_fp8(dtype)        ? CU_TENSOR_MAP_DATA_TYPE_UINT8 // bytes: the copy engine does not convert
                                             : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                      4,
                      t.data, dims, strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
             : CUDA_ERROR_NOT_SUPPORTED;
  if (r != CUDA_SUCCESS)
    throw Error("attncore cuda: the driver refused a tensor map (error " + std::to_string(int(r)) + ") for a " +
                std::to_string(box_rows) + " x " + std::to_string(box_cols) + " box of a tensor of " +
                std::to_string(tokens) + " tokens, " + std::to_string(heads) + " heads, head dim " +
                std::to_string(dim));
  return map;
}

} // namespace attncore::cuda::sm90
