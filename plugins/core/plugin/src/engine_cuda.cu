#include "attncore/cuda.h"
#include "attncore/plugin/engine.h"

#include <cuda_runtime.h>

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

cudaStream_t cuda(void* s) { return static_cast<cudaStream_t>(s); }

class CudaEngine final : public Engine {
 public:
  bool on_device() const override { return true; }
  void forward(const ForwardParams& p, void* s) override { forward_cuda(p, s); }
  void compute_delta(const DeltaParams& p, void* s) override { compute_delta_cuda(p, s); }
  void backward(const BackwardParams& p, void* s) override { backward_cuda(p, s); }
  void merge(const MergeParams& p, void* s) override { merge_partial_cuda(p, s); }
  void convert(const ConvertParams& p, void* s) override { convert_cuda(p, s); }
  void zero(void* dst, size_t bytes, void* s) override { check(cudaMemsetAsync(dst, 0, bytes, cuda(s)), "cudaMemsetAsync"); }
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
  void upload(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  void wait(void* to, void* from) override {
    if (to == from) return;
    cudaEvent_t e;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(e, cuda(from)), "cudaEventRecord");
    check(cudaStreamWaitEvent(cuda(to), e, 0), "cudaStreamWaitEvent");
    check(cudaEventDestroy(e), "cudaEventDestroy");  // legal: the wait already holds the event's state
  }
};

}  // namespace

std::unique_ptr<Engine> make_cuda_engine() { return std::make_unique<CudaEngine>(); }

}  // namespace attncore::plugin
