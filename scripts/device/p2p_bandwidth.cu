// Point-to-point bandwidth between the GPUs of one host: NCCL send/recv against copy-engine peer
// copies, one and both directions, alone and under a compute kernel that fills every SM.
//   nvcc -O2 -std=c++17 -arch=sm_90a scripts/device/p2p_bandwidth.cu -lnccl -o p2p_bandwidth
//   ./p2p_bandwidth [MiB per message, default 96]
// Prints one line per measurement: what, GB/s per direction, and the compute kernel's slowdown.
// The strided lines copy rows of W bytes read at a pitch of 4 W (a quarter of each token's heads,
// as an all-to-all between sequence and head shards reads them) into contiguous rows, by one 3-D
// peer copy (cudaMemcpy3DPeerAsync) or by a copy kernel into a contiguous message first (packed).
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#define CK(x) do { cudaError_t ck_ = (x); if (ck_ != cudaSuccess) { std::printf("%s: %s\n", #x, cudaGetErrorString(ck_)); std::exit(1); } } while (0)
#define NK(x) do { ncclResult_t nk_ = (x); if (nk_ != ncclSuccess) { std::printf("%s: %s\n", #x, ncclGetErrorString(nk_)); std::exit(1); } } while (0)

// A kernel that keeps every SM busy for a fixed amount of arithmetic.
__global__ void busy(float* out, int iters) {
  float a = threadIdx.x * 1e-3f, b = 1.0001f;
  for (int i = 0; i < iters; ++i) a = a * b + 1e-7f;
  if (a == 12345.f) out[0] = a;
}

constexpr int kGpus = 2;

// dst rows = src rows of `width` bytes at `pitch` (16-byte words; the pack before a contiguous send).
__global__ void pack_rows(uint4* dst, const uint4* src, size_t width, size_t pitch, size_t rows) {
  const size_t words = width / 16, total = words * rows;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = src[(i / words) * (pitch / 16) + i % words];
}

struct Rig {
  void* buf[kGpus][2];  // [device][send, recv]
  void* wide[kGpus];    // the strided source: 4x the message
  cudaStream_t comm[kGpus], comm2[kGpus], work[kGpus];
  ncclComm_t nccl[kGpus];
  float* sink[kGpus];
  size_t bytes;
};

double time_ms(Rig& r, const std::function<void()>& enqueue, int reps) {
  cudaEvent_t a, b;
  CK(cudaSetDevice(0));
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int d = 0; d < kGpus; ++d) { CK(cudaSetDevice(d)); CK(cudaDeviceSynchronize()); }
  CK(cudaSetDevice(0));
  CK(cudaEventRecord(a, r.comm[0]));
  for (int i = 0; i < reps; ++i) enqueue();
  for (int d = 0; d < kGpus; ++d) { CK(cudaSetDevice(d)); CK(cudaDeviceSynchronize()); }
  CK(cudaSetDevice(0));
  CK(cudaEventRecord(b, r.comm[0]));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  return ms / reps;
}

void nccl_exchange(Rig& r, bool both) {
  NK(ncclGroupStart());
  for (int d = 0; d < kGpus; ++d) {
    const int peer = 1 - d;
    if (both || d == 0) NK(ncclSend(r.buf[d][0], r.bytes, ncclUint8, peer, r.nccl[d], r.comm[d]));
    if (both || d == 1) NK(ncclRecv(r.buf[d][1], r.bytes, ncclUint8, peer, r.nccl[d], r.comm[d]));
  }
  NK(ncclGroupEnd());
}

void copy_exchange(Rig& r, bool both, int split) {
  for (int d = 0; d < kGpus; ++d) {
    if (!both && d == 1) break;
    CK(cudaSetDevice(d));
    const size_t part = r.bytes / split;
    for (int i = 0; i < split; ++i)
      CK(cudaMemcpyPeerAsync(static_cast<char*>(r.buf[1 - d][1]) + i * part, 1 - d,
                             static_cast<char*>(r.buf[d][0]) + i * part, d, part, i == 0 ? r.comm[d] : r.comm2[d]));
    if (split > 1) {  // the second stream's half joins the first stream
      cudaEvent_t joined;
      CK(cudaEventCreateWithFlags(&joined, cudaEventDisableTiming));
      CK(cudaEventRecord(joined, r.comm2[d]));
      CK(cudaStreamWaitEvent(r.comm[d], joined));
      CK(cudaEventDestroy(joined));
    }
  }
}

// Rows of `width` bytes at a pitch of 4 x width on the sender into contiguous rows on the receiver.
void strided_exchange(Rig& r, size_t width, bool packed) {
  const size_t rows = r.bytes / width;
  for (int d = 0; d < kGpus; ++d) {
    CK(cudaSetDevice(d));
    if (packed) {
      pack_rows<<<132 * 4, 256, 0, r.comm[d]>>>(static_cast<uint4*>(r.buf[d][0]), static_cast<const uint4*>(r.wide[d]),
                                              width, 4 * width, rows);
      CK(cudaMemcpyPeerAsync(r.buf[1 - d][1], 1 - d, r.buf[d][0], d, r.bytes, r.comm[d]));
      continue;
    }
    cudaMemcpy3DPeerParms p{};
    p.srcPtr = make_cudaPitchedPtr(r.wide[d], 4 * width, width, rows);
    p.srcDevice = d;
    p.dstPtr = make_cudaPitchedPtr(r.buf[1 - d][1], width, width, rows);
    p.dstDevice = 1 - d;
    p.extent = make_cudaExtent(width, rows, 1);
    CK(cudaMemcpy3DPeerAsync(&p, r.comm[d]));
  }
}

int main(int argc, char** argv) {
  Rig r{};
  r.bytes = size_t(argc > 1 ? std::atoi(argv[1]) : 96) << 20;
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n < kGpus) { std::printf("needs %d GPUs, found %d\n", kGpus, n); return 1; }
  int devs[kGpus] = {0, 1};
  NK(ncclCommInitAll(r.nccl, kGpus, devs));
  for (int d = 0; d < kGpus; ++d) {
    CK(cudaSetDevice(d));
    int ok = 0;
    CK(cudaDeviceCanAccessPeer(&ok, d, 1 - d));
    if (!ok) { std::printf("no peer access %d -> %d\n", d, 1 - d); return 1; }
    CK(cudaDeviceEnablePeerAccess(1 - d, 0));
    int lo, hi;
    CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    CK(cudaStreamCreateWithPriority(&r.comm[d], cudaStreamNonBlocking, hi));
    CK(cudaStreamCreateWithPriority(&r.comm2[d], cudaStreamNonBlocking, hi));
    CK(cudaStreamCreateWithPriority(&r.work[d], cudaStreamNonBlocking, lo));
    for (int b = 0; b < 2; ++b) { CK(cudaMalloc(&r.buf[d][b], r.bytes)); CK(cudaMemset(r.buf[d][b], 1, r.bytes)); }
    CK(cudaMalloc(&r.wide[d], 4 * r.bytes));
    CK(cudaMemset(r.wide[d], 1, 4 * r.bytes));
    CK(cudaMalloc(&r.sink[d], 4));
  }
  const int reps = 20;
  const double gb = r.bytes / 1e9;
  struct Way { const char* name; std::function<void()> f; };
  std::vector<Way> ways = {
      {"nccl one way", [&] { nccl_exchange(r, false); }},
      {"nccl both ways", [&] { nccl_exchange(r, true); }},
      {"copy engine one way", [&] { copy_exchange(r, false, 1); }},
      {"copy engine both ways", [&] { copy_exchange(r, true, 1); }},
      {"copy engine both ways, 2 streams", [&] { copy_exchange(r, true, 2); }},
      {"strided 1536 B rows, 3-D peer copy", [&] { strided_exchange(r, 1536, false); }},
      {"strided 1536 B rows, packed + copy", [&] { strided_exchange(r, 1536, true); }},
      {"strided 3072 B rows, 3-D peer copy", [&] { strided_exchange(r, 3072, false); }},
      {"strided 3072 B rows, packed + copy", [&] { strided_exchange(r, 3072, true); }},
      {"strided 512 B rows, 3-D peer copy", [&] { strided_exchange(r, 512, false); }},
  };
  for (int w = 0; w < 2; ++w) nccl_exchange(r, true);  // NCCL's connections are made lazily
  // The compute kernel alone, then each transfer alone and under it.
  const int iters = 1 << 16;
  auto compute = [&] {
    for (int d = 0; d < kGpus; ++d) { CK(cudaSetDevice(d)); busy<<<132 * 16, 128, 0, r.work[d]>>>(r.sink[d], iters); }
  };
  const double compute_ms = time_ms(r, compute, 3);
  std::printf("message %.1f MiB; compute kernel alone %.3f ms\n", r.bytes / 1048576.0, compute_ms);
  for (Way& w : ways) {
    const double alone = time_ms(r, w.f, reps);
    // Under compute: the kernel and as many transfers as fit in its time, all enqueued at once.
    const int under = std::max(1, int(compute_ms / alone));
    cudaEvent_t s[kGpus], e[kGpus], cs[kGpus], ce[kGpus];
    for (int d = 0; d < kGpus; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaEventCreate(&s[d])); CK(cudaEventCreate(&e[d])); CK(cudaEventCreate(&cs[d])); CK(cudaEventCreate(&ce[d]));
      CK(cudaDeviceSynchronize());
    }
    for (int d = 0; d < kGpus; ++d) { CK(cudaSetDevice(d)); CK(cudaEventRecord(s[d], r.work[d])); CK(cudaEventRecord(cs[d], r.comm[d])); }
    compute();
    for (int i = 0; i < under; ++i) w.f();
    for (int d = 0; d < kGpus; ++d) { CK(cudaSetDevice(d)); CK(cudaEventRecord(e[d], r.work[d])); CK(cudaEventRecord(ce[d], r.comm[d])); CK(cudaStreamWaitEvent(r.comm[d], e[d])); }
    for (int d = 0; d < kGpus; ++d) { CK(cudaSetDevice(d)); CK(cudaDeviceSynchronize()); }
    float kms = 0, cms = 0;
    CK(cudaEventElapsedTime(&kms, s[0], e[0]));
    CK(cudaEventElapsedTime(&cms, cs[0], ce[0]));
    std::printf("%-34s alone %7.1f GB/s (%.3f ms) | under compute %7.1f GB/s, compute %.3f ms (%+.1f%%)\n", w.name,
                gb / alone * 1e3, alone, gb * under / cms * 1e3, kms, 100.0 * (kms / compute_ms - 1));
  }
  return 0;
}
