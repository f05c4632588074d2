// The CUDA device of a rank: the thread is bound to one GPU; three streams; device events;
// an L2 flush by writing a buffer twice the size of L2; the host's kernels (data generation with
// the same arithmetic as the CPU, NaN poisoning, non-finite counting).
#include "common/errors.h"
#include "runtime/device.h"

#include <cuda_runtime.h>

#include <iterator>
#include <string>

namespace attnhost {

namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw RuntimeFailure(ATTNHOST_ERR_DEVICE, std::string(what) + ": " + cudaGetErrorString(e));
}

struct DeviceRange {
  int64_t global_begin, local_begin, length;
};

// One thread per element of the local tensor; a slot outside every range is padding (zero).
template <int32_t kDtype>
__global__ void generate_kernel(void* dst, data::Params p, uint32_t tensor, int64_t batch, int64_t local_tokens,
                                int32_t heads, int32_t head_dim, const DeviceRange* ranges, int32_t num_ranges) {
  const int64_t row = static_cast<int64_t>(heads) * head_dim;
  const int64_t total = batch * local_tokens * row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t b = i / (local_tokens * row);
    int64_t slot = (i / row) % local_tokens;
    int32_t h = static_cast<int32_t>((i % row) / head_dim);
    int32_t d = static_cast<int32_t>(i % head_dim);
    float v = 0.f;
    for (int32_t r = 0; r < num_ranges; ++r)
      if (slot >= ranges[r].local_begin && slot < ranges[r].local_begin + ranges[r].length) {
        v = data::element_value(p, tensor, b, ranges[r].global_begin + (slot - ranges[r].local_begin), h, d);
        break;
      }
    if constexpr (kDtype == ATTNHOST_DTYPE_BF16) static_cast<uint16_t*>(dst)[i] = data::to_bf16(v);
    else if constexpr (kDtype == ATTNHOST_DTYPE_FP16) static_cast<uint16_t*>(dst)[i] = data::to_fp16(v);
    else if constexpr (kDtype == ATTNHOST_DTYPE_FP8_E4M3 || kDtype == ATTNHOST_DTYPE_FP8_E5M2)
      static_cast<uint8_t*>(dst)[i] = data::to_fp8(v * data::fp8_scale(p, fp8_format(kDtype)), fp8_format(kDtype));
    else static_cast<float*>(dst)[i] = v;
  }
}

__global__ void fill_u16(uint16_t* dst, uint16_t v, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) dst[i] = v;
}
__global__ void fill_u32(uint32_t* dst, uint32_t v, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) dst[i] = v;
}

template <int32_t kDtype>
__global__ void count_nonfinite_kernel(const void* src, size_t n, bool allow_neg_inf, unsigned long long* count) {
  unsigned long long bad = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float v;
    if constexpr (kDtype == ATTNHOST_DTYPE_BF16) v = data::from_bf16(static_cast<const uint16_t*>(src)[i]);
    else if constexpr (kDtype == ATTNHOST_DTYPE_FP16) v = data::from_fp16(static_cast<const uint16_t*>(src)[i]);
    else v = static_cast<const float*>(src)[i];
    bool finite = isfinite(v) || (allow_neg_inf && isinf(v) && v < 0);
    bad += finite ? 0 : 1;
  }
  for (int o = 16; o > 0; o /= 2) bad += __shfl_down_sync(0xffffffffu, bad, o);
  if ((threadIdx.x & 31) == 0 && bad) atomicAdd(count, bad);
}

class CudaMarker final : public Marker {
 public:
  CudaMarker() { check_cuda(cudaEventCreate(&event_), "cudaEventCreate"); }
  ~CudaMarker() override { cudaEventDestroy(event_); }
  void record(void* stream) override {
    check_cuda(cudaEventRecord(event_, static_cast<cudaStream_t>(stream)), "cudaEventRecord");
  }
  double since(const Marker& start) const override {
    float ms = 0;
    check_cuda(cudaEventSynchronize(event_), "cudaEventSynchronize");
    check_cuda(cudaEventElapsedTime(&ms, static_cast<const CudaMarker&>(start).event_, event_), "cudaEventElapsedTime");
    return ms;
  }

 private:
  cudaEvent_t event_{};
};

constexpr int kThreads = 256;
int grid_for(size_t n) { return static_cast<int>(std::min<size_t>((n + kThreads - 1) / kThreads, 65535 * 8)); }

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal), board_(ordinal) {
    check_cuda(cudaSetDevice(ordinal), "cudaSetDevice");
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
    name_ = prop.name;
    l2_bytes_ = static_cast<size_t>(prop.l2CacheSize);
    // The auxiliary streams carry communication: at the greatest priority the scheduler gives a
    // transfer's few blocks the next free SMs, instead of queueing them behind every block of the
    // attention kernel under which it should hide (measured: a 256 MiB K/V hop that takes 1.1 ms on
    // an idle GPU took 14 ms under a long backward kernel at the default priority).
    int least = 0, greatest = 0;
    check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    // Stream 3 is at stream 0's priority: its blocks wait for the running kernel's to be placed,
    // then take the SMs its last wave leaves (docs/KERNELS.md, "Filling the last wave").
    for (size_t i = 0; i < std::size(streams_); ++i)
      check_cuda(cudaStreamCreateWithPriority(&streams_[i], cudaStreamNonBlocking,
                                              i == 0 || i == 3 ? least : greatest),
                 "cudaStreamCreate");
    check_cuda(cudaMalloc(&scratch_count_, sizeof(unsigned long long)), "cudaMalloc");
  }
  ~CudaDevice() override {
    cudaDeviceSynchronize();
    if (flush_) cudaFree(flush_);
    cudaFree(scratch_count_);
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
  }

  DeviceKind kind() const override { return DeviceKind::cuda; }
  int ordinal() const override { return ordinal_; }
  std::string name() const override { return name_; }

  void copy_to_host(void* dst, const void* src, size_t n) override {
    check_cuda(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, streams_[0]), "cudaMemcpy D2H");
    check_cuda(cudaStreamSynchronize(streams_[0]), "cudaStreamSynchronize");
  }
  void copy_from_host(void* dst, const void* src, size_t n) override {
    check_cuda(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, streams_[0]), "cudaMemcpy H2D");
    check_cuda(cudaStreamSynchronize(streams_[0]), "cudaStreamSynchronize");
  }
  void fill_bytes(void* dst, int v, size_t n) override {
    check_cuda(cudaMemsetAsync(dst, v, n, streams_[0]), "cudaMemset");
  }
  void* stream(int index) override { return index >= 0 && index < int(std::size(streams_)) ? streams_[index] : nullptr; }
  void synchronize() override {
    for (cudaStream_t s : streams_) check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    check_cuda(cudaGetLastError(), "kernel launch");
  }
  std::unique_ptr<Marker> marker() override { return std::make_unique<CudaMarker>(); }
  std::optional<GpuReading> read_board() const override { return board_.read(); }

  void flush_l2() override {
    // Writing twice L2's size evicts whatever the last sample left there (not accounted: it is
    // the host's, not the plugin's).
    if (!flush_) check_cuda(cudaMalloc(&flush_, 2 * l2_bytes_), "cudaMalloc (L2 flush)");
    check_cuda(cudaMemsetAsync(flush_, flush_value_++ & 0xff, 2 * l2_bytes_, streams_[0]), "cudaMemset (L2 flush)");
  }

  void generate(void* dst, const GenerateSpec& s) override {
    std::vector<DeviceRange> host;
    for (const attnhost_token_range& r : s.ranges) host.push_back({r.global_begin, r.local_begin, r.length});
    DeviceRange* ranges = nullptr;
    size_t bytes = std::max<size_t>(1, host.size()) * sizeof(DeviceRange);
    check_cuda(cudaMalloc(&ranges, bytes), "cudaMalloc");
    check_cuda(cudaMemcpy(ranges, host.data(), host.size() * sizeof(DeviceRange), cudaMemcpyHostToDevice), "cudaMemcpy");
    size_t n = static_cast<size_t>(s.batch) * s.local_tokens * s.heads * s.head_dim;
    auto args = [&](auto kernel) {
      kernel<<<grid_for(n), kThreads, 0, streams_[0]>>>(dst, s.params, s.tensor, s.batch, s.local_tokens, s.heads,
                                                         s.head_dim, ranges, static_cast<int32_t>(host.size()));
    };
    if (s.dtype == ATTNHOST_DTYPE_BF16) args(generate_kernel<ATTNHOST_DTYPE_BF16>);
    else if (s.dtype == ATTNHOST_DTYPE_FP16) args(generate_kernel<ATTNHOST_DTYPE_FP16>);
    else if (s.dtype == ATTNHOST_DTYPE_FP8_E4M3) args(generate_kernel<ATTNHOST_DTYPE_FP8_E4M3>);
    else if (s.dtype == ATTNHOST_DTYPE_FP8_E5M2) args(generate_kernel<ATTNHOST_DTYPE_FP8_E5M2>);
    else args(generate_kernel<ATTNHOST_DTYPE_FP32>);
    check_cuda(cudaGetLastError(), "generate kernel");
    check_cuda(cudaStreamSynchronize(streams_[0]), "generate kernel");
    cudaFree(ranges);
  }

  void poison(void* dst, int32_t dtype, size_t n) override {
    if (n == 0) return;
    if (dtype == ATTNHOST_DTYPE_FP32)
      fill_u32<<<grid_for(n), kThreads, 0, streams_[0]>>>(static_cast<uint32_t*>(dst), 0x7fc00000u, n);
    else
      fill_u16<<<grid_for(n), kThreads, 0, streams_[0]>>>(static_cast<uint16_t*>(dst),
                                                          dtype == ATTNHOST_DTYPE_BF16 ? 0x7fc0 : 0x7e00, n);
    check_cuda(cudaGetLastError(), "poison kernel");
  }

  int64_t count_nonfinite(const void* src, int32_t dtype, size_t n, bool allow_neg_inf) override {
    if (n == 0) return 0;
    check_cuda(cudaMemsetAsync(scratch_count_, 0, sizeof(unsigned long long), streams_[0]), "cudaMemset");
    if (dtype == ATTNHOST_DTYPE_BF16)
      count_nonfinite_kernel<ATTNHOST_DTYPE_BF16><<<grid_for(n), kThreads, 0, streams_[0]>>>(src, n, allow_neg_inf, scratch_count_);
    else if (dtype == ATTNHOST_DTYPE_FP16)
      count_nonfinite_kernel<ATTNHOST_DTYPE_FP16><<<grid_for(n), kThreads, 0, streams_[0]>>>(src, n, allow_neg_inf, scratch_count_);
    else
      count_nonfinite_kernel<ATTNHOST_DTYPE_FP32><<<grid_for(n), kThreads, 0, streams_[0]>>>(src, n, allow_neg_inf, scratch_count_);
    check_cuda(cudaGetLastError(), "non-finite scan");
    unsigned long long count = 0;
    check_cuda(cudaMemcpyAsync(&count, scratch_count_, sizeof count, cudaMemcpyDeviceToHost, streams_[0]), "cudaMemcpy");
    check_cuda(cudaStreamSynchronize(streams_[0]), "cudaStreamSynchronize");
    return static_cast<int64_t>(count);
  }

 protected:
  void* raw_alloc(size_t bytes) override {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error so the rank can go on
      return nullptr;
    }
    return p;
  }
  void raw_free(void* p) override { cudaFree(p); }
  size_t free_memory() const override {
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    return free;
  }

 private:
  int ordinal_;
  GpuBoard board_;
  std::string name_;
  size_t l2_bytes_ = 0;
  cudaStream_t streams_[4]{};
  void* flush_ = nullptr;
  int flush_value_ = 0;
  unsigned long long* scratch_count_ = nullptr;
};

}  // namespace

std::unique_ptr<Device> make_cuda_device(int ordinal) { return std::make_unique<CudaDevice>(ordinal); }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace attnhost
