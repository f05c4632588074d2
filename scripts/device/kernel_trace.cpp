// Every kernel, copy and memset a process runs on its GPUs, with their streams and times, from
// CUPTI's activity records: the timeline between attnhost's trace ranges (what fills a gap between
// two attention calls). Loaded by the CUDA driver as an injection library, with no change to the
// program; the GPU machine has no Nsight Systems. pack.sh builds it into .gpu/tests/, and
// `checks.sh kernels` runs a compare under it:
//   CUDA_INJECTION64_PATH=$PWD/.gpu/tests/kernel_trace.so KERNEL_TRACE_OUT=kernels.tsv attnhost compare ...
// Writes one line a record: kind (K kernel, C copy, P peer copy, S memset), device, stream, start and
// end (ns, one clock for every GPU), bytes, name. Records are buffered and written at exit;
// KERNEL_TRACE_LAST keeps only the last that many (200000). scripts/device/kernel_gaps.py prints them.
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>

namespace {

struct Record {
  char kind;  // K kernel, C copy, P peer copy, S memset
  uint32_t device, stream;
  uint64_t start, end, bytes;
  std::string name;
};

std::mutex records_mutex;
std::deque<Record> records;
size_t keep_last = 200000;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = 8 << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void keep(Record r) {
  std::lock_guard lock(records_mutex);
  records.push_back(std::move(r));
  if (records.size() > keep_last) records.pop_front();
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        keep({'K', k->deviceId, k->streamId, k->start, k->end, 0, k->name ? k->name : "?"});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* c = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        keep({'C', c->deviceId, c->streamId, c->start, c->end, c->bytes, "copy kind " + std::to_string(c->copyKind)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY2: {
        const auto* c = reinterpret_cast<const CUpti_ActivityMemcpyPtoP4*>(record);
        keep({'P', c->deviceId, c->streamId, c->start, c->end, c->bytes,
              "peer copy " + std::to_string(c->srcDeviceId) + "->" + std::to_string(c->dstDeviceId)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        keep({'S', m->deviceId, m->streamId, m->start, m->end, m->bytes, "memset"});
        break;
      }
      default:
        break;
    }
  }
  std::free(buffer);
}

void write_records() {
  cuptiActivityFlushAll(1);
  const char* path = std::getenv("KERNEL_TRACE_OUT");
  FILE* out = std::fopen(path ? path : "kernels.tsv", "w");
  if (!out) return;
  std::lock_guard lock(records_mutex);
  for (const Record& r : records)
    std::fprintf(out, "%c\t%u\t%u\t%llu\t%llu\t%llu\t%s\n", r.kind, r.device, r.stream,
                 static_cast<unsigned long long>(r.start), static_cast<unsigned long long>(r.end),
                 static_cast<unsigned long long>(r.bytes), r.name.c_str());
  std::fclose(out);
}

}  // namespace

extern "C" int InitializeInjection() {
  if (const char* last = std::getenv("KERNEL_TRACE_LAST")) keep_last = std::strtoull(last, nullptr, 10);
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) return 0;
  for (CUpti_ActivityKind kind : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                  CUPTI_ACTIVITY_KIND_MEMCPY2, CUPTI_ACTIVITY_KIND_MEMSET})
    cuptiActivityEnable(kind);
  std::atexit(write_records);
  return 1;
}
