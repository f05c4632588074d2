#include "attncore/cuda.h"
#include "attncore/plugin/engine.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace attncore::plugin {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) attnhost::fail(ATTNHOST_ERR_DEVICE, std::string(what) + ": " + cudaGetErrorString(e));
}

__global__ void fill_kernel(float* dst, float value, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) dst[i] = value;
}

__global__ void add_kernel(float* dst, const float* src, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) dst[i] += src[i];
}

// Rows of 16-byte words: a warp moves a row's words side by side, so rows of a few hundred bytes
// (one head group's slice of a token) still go at the memory's rate, where cudaMemcpy2DAsync moves
// narrow rows one by one (docs/KERNELS.md, "Packing head slices").
// Slices of rows (pitches in words): slice s's rows at s * *_slice_pitch.
__global__ void copy_rows_kernel(uint4* dst, size_t dst_pitch, size_t dst_slice_pitch, const uint4* src,
                                 size_t src_pitch, size_t src_slice_pitch, size_t words, size_t rows, size_t slices) {
  const size_t total = words * rows * slices;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    const size_t row = i / words, word = i % words, slice = row / rows, r = row % rows;
    dst[slice * dst_slice_pitch + r * dst_pitch + word] = src[slice * src_slice_pitch + r * src_pitch + word];
  }
}

__device__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ float to_float(__half x) { return __half2float(x); }
__device__ float to_float(float x) { return x; }

// One block a (batch, token) row of heads x dim elements; dim is a multiple of 8 on the paths
// that use it, but the loop does not rely on it.
template <class T>
__global__ void widen_kernel(WidenParams p) {
  const int64_t b = blockIdx.y, t = blockIdx.x;
  const T* src = static_cast<const T*>(p.src.data) + b * p.src.batch_stride + t * p.src.token_stride;
  float* dst = static_cast<float*>(p.dst.data) + b * p.dst.batch_stride + t * p.dst.token_stride;
  for (int i = threadIdx.x; i < p.heads * p.head_dim; i += blockDim.x) {
    const int h = i / p.head_dim, d = i % p.head_dim;
    const float x = to_float(src[h * p.src.head_stride + d]);
    float& y = dst[h * p.dst.head_stride + d];
    y = p.add ? y + x : x;
  }
}

cudaStream_t cuda(void* s) { return static_cast<cudaStream_t>(s); }

class CudaEngine final : public Engine {
 public:
  bool on_device() const override { return true; }
  void forward(const ForwardParams& p, void* s) override { forward_cuda(p, s); }
  void compute_delta(const DeltaParams& p, void* s) override { compute_delta_cuda(p, s); }
  void backward(const BackwardParams& p, void* s) override { backward_cuda(p, s); }
  void merge(const MergeParams& p, void* s) override { merge_partial_cuda(p, s); }
  void convert(const ConvertParams& p, void* s) override { convert_cuda(p, s); }
  void amax(const AmaxParams& p, void* s) override { amax_cuda(p, s); }
  bool adds_atomically(const BackwardParams& p) override { return !p.deterministic && !p.write_grads && !p.write_dkdv; }
  bool adds_dq_atomically(const BackwardParams& p) override { return !p.deterministic && !p.write_grads; }
  bool merges_prior(const ForwardParams&) override { return true; }
  void zero(void* dst, size_t bytes, void* s) override { check(cudaMemsetAsync(dst, 0, bytes, cuda(s)), "cudaMemsetAsync"); }
  void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows,
                 void* s) override {
    copy_slices(dst, dst_pitch, 0, src, src_pitch, 0, width, rows, 1, s);
  }
  void copy_slices(void* dst, size_t dst_pitch, size_t dst_slice_pitch, const void* src, size_t src_pitch,
                   size_t src_slice_pitch, size_t width, size_t rows, size_t slices, void* s) override {
    if (rows == 0 || width == 0 || slices == 0) return;
    const auto aligned = [](size_t x) { return x % sizeof(uint4) == 0; };
    const bool words = aligned(reinterpret_cast<uintptr_t>(dst)) && aligned(reinterpret_cast<uintptr_t>(src)) &&
                       aligned(dst_pitch) && aligned(src_pitch) && aligned(width) &&
                       (slices == 1 || (aligned(dst_slice_pitch) && aligned(src_slice_pitch)));
    if (rows * slices == 1 || !words) {
      for (size_t i = 0; i < slices; ++i)
        check(cudaMemcpy2DAsync(static_cast<char*>(dst) + i * dst_slice_pitch, dst_pitch,
                                static_cast<const char*>(src) + i * src_slice_pitch, src_pitch, width, rows,
                                cudaMemcpyDeviceToDevice, cuda(s)),
              "cudaMemcpy2DAsync");
      return;
    }
    const size_t n = width / sizeof(uint4) * rows * slices, w = sizeof(uint4);
    const unsigned blocks = static_cast<unsigned>(std::min<size_t>((n + 255) / 256, 8192));
    copy_rows_kernel<<<blocks, 256, 0, cuda(s)>>>(static_cast<uint4*>(dst), dst_pitch / w, dst_slice_pitch / w,
                                                  static_cast<const uint4*>(src), src_pitch / w, src_slice_pitch / w,
                                                  width / w, rows, slices);
    check(cudaGetLastError(), "copy_rows kernel");
  }
  void fill(float* dst, float value, size_t n, void* s) override {
    if (n == 0) return;
    unsigned blocks = static_cast<unsigned>(std::min<size_t>((n + 255) / 256, 4096));
    fill_kernel<<<blocks, 256, 0, cuda(s)>>>(dst, value, n);
    check(cudaGetLastError(), "fill kernel");
  }
  void add(float* dst, const float* src, size_t n, void* s) override {
    if (n == 0) return;
    unsigned blocks = static_cast<unsigned>(std::min<size_t>((n + 255) / 256, 4096));
    add_kernel<<<blocks, 256, 0, cuda(s)>>>(dst, src, n);
    check(cudaGetLastError(), "add kernel");
  }
  void widen(const WidenParams& p, void* s) override {
    if (p.seqlen == 0 || p.batch == 0) return;
    const dim3 grid(static_cast<unsigned>(p.seqlen), static_cast<unsigned>(p.batch));
    switch (p.dtype) {
      case DType::bf16: widen_kernel<__nv_bfloat16><<<grid, 256, 0, cuda(s)>>>(p); break;
      case DType::fp16: widen_kernel<__half><<<grid, 256, 0, cuda(s)>>>(p); break;
      default: widen_kernel<float><<<grid, 256, 0, cuda(s)>>>(p); break;
    }
    check(cudaGetLastError(), "widen kernel");
  }
  Event record(void* s) override {
    cudaEvent_t e;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    Event event(static_cast<void*>(e), [](void* p) { cudaEventDestroy(static_cast<cudaEvent_t>(p)); });
    check(cudaEventRecord(e, cuda(s)), "cudaEventRecord");
    return event;  // destroying it after a wait is legal: the wait holds the event's state
  }
  void wait(void* s, const Event& event) override {
    if (event) check(cudaStreamWaitEvent(cuda(s), static_cast<cudaEvent_t>(event.get()), 0), "cudaStreamWaitEvent");
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
};

}  // namespace

std::unique_ptr<Engine> make_cuda_engine() { return std::make_unique<CudaEngine>(); }

}  // namespace attncore::plugin
