#include "runtime/services.h"

#include "common/errors.h"
#include "common/log.h"

namespace attnhost {

void Tracer::start(void* stream) {
  ranges_.clear();
  origin_ = device_.marker();
  origin_->record(stream);
  active_ = true;
}

int32_t Tracer::begin(const std::string& name, const std::string& category, void* stream) {
  if (!active_) return -1;
  Range r{name, category, device_.marker(), nullptr};
  r.begin->record(stream);
  ranges_.push_back(std::move(r));
  return static_cast<int32_t>(ranges_.size() - 1);
}

void Tracer::end(int32_t id, void* stream) {
  if (!active_ || id < 0 || id >= static_cast<int32_t>(ranges_.size()) || ranges_[id].end) return;
  ranges_[id].end = device_.marker();
  ranges_[id].end->record(stream);
}

std::vector<TraceEvent> Tracer::stop() {
  active_ = false;
  device_.synchronize();
  std::vector<TraceEvent> out;
  for (const Range& r : ranges_) {
    if (!r.end) continue;  // a range the plugin never closed is left out
    double start = r.begin->since(*origin_), stop = r.end->since(*origin_);
    out.push_back({rank_, r.name, r.category, start * 1000.0, (stop - start) * 1000.0});
  }
  ranges_.clear();
  return out;
}

namespace {
RankServices& self(void* context) { return *static_cast<RankServices*>(context); }

Block block_of(const attnhost_block* b) {
  if (!b || b->struct_size < ATTNHOST_STRUCT_SIZE(attnhost_block, slice_pitch))
    throw RuntimeFailure(ATTNHOST_ERR_INVALID_ARGUMENT, "a block without its fields (struct_size too small)");
  return {b->data, b->width, b->rows, b->pitch, b->slices, b->slice_pitch};
}
}  // namespace

template <class F>
int32_t RankServices::guarded(const char* what, F f) {
  try {
    f();
    return ATTNHOST_OK;
  } catch (const OutOfMemory& e) {
    last_failure_ = e.what();
    last_status_ = ATTNHOST_ERR_OUT_OF_MEMORY;
  } catch (const RuntimeFailure& e) {
    last_failure_ = std::string(what) + ": " + e.what();
    last_status_ = e.code;
  } catch (const std::exception& e) {
    last_failure_ = std::string(what) + ": " + e.what();
    last_status_ = ATTNHOST_ERR_INTERNAL;
  } catch (...) {
    last_failure_ = std::string(what) + ": unknown failure";
    last_status_ = ATTNHOST_ERR_INTERNAL;
  }
  log::debug("rank " + std::to_string(rank_) + ": " + last_failure_);
  return last_status_;
}

RankServices::RankServices(Device& device, Communicator& comm, Tracer& tracer, int rank)
    : device_(device), comm_(comm), tracer_(tracer), rank_(rank) {
  api_.struct_size = ATTNHOST_STRUCT_SIZE(attnhost_host_api, recv_block);
  api_.context = this;
  api_.stream = [](void* c, int32_t index) -> void* {
    if (index < 0 || index > 3) return nullptr;
    return self(c).device_.stream(index);
  };
  api_.alloc = [](void* c, size_t bytes, void** out) {
    *out = nullptr;
    return self(c).guarded("alloc", [&] { *out = self(c).device_.alloc(bytes); });
  };
  api_.free = [](void* c, void* p) { self(c).device_.free(p); };
  api_.send = [](void* c, const void* buf, size_t n, int32_t dt, int32_t peer, void* s) {
    return self(c).guarded("send", [&] { self(c).comm_.send(buf, n, dt, peer, s); });
  };
  api_.recv = [](void* c, void* buf, size_t n, int32_t dt, int32_t peer, void* s) {
    return self(c).guarded("recv", [&] { self(c).comm_.recv(buf, n, dt, peer, s); });
  };
  api_.group_start = [](void* c) { return self(c).guarded("group_start", [&] { self(c).comm_.group_start(); }); };
  api_.group_end = [](void* c) { return self(c).guarded("group_end", [&] { self(c).comm_.group_end(); }); };
  api_.all_gather = [](void* c, const void* in, void* out, size_t n, int32_t dt, void* s) {
    return self(c).guarded("all_gather", [&] { self(c).comm_.all_gather(in, out, n, dt, s); });
  };
  api_.all_reduce = [](void* c, const void* in, void* out, size_t n, int32_t dt, int32_t op, void* s) {
    return self(c).guarded("all_reduce", [&] { self(c).comm_.all_reduce(in, out, n, dt, op, s); });
  };
  api_.reduce_scatter = [](void* c, const void* in, void* out, size_t n, int32_t dt, int32_t op, void* s) {
    return self(c).guarded("reduce_scatter", [&] { self(c).comm_.reduce_scatter(in, out, n, dt, op, s); });
  };
  api_.barrier = [](void* c) { return self(c).guarded("barrier", [&] { self(c).comm_.barrier(); }); };
  api_.native_comm = [](void* c) { return self(c).comm_.native(); };
  if (comm_.blocks()) {  // else NULL: the plugin packs (ABI 1.7)
    api_.send_block = [](void* c, const attnhost_block* b, int32_t peer, void* s) {
      return self(c).guarded("send_block", [&] { self(c).comm_.send_block(block_of(b), peer, s); });
    };
    api_.recv_block = [](void* c, const attnhost_block* b, int32_t peer, void* s) {
      return self(c).guarded("recv_block", [&] { self(c).comm_.recv_block(block_of(b), peer, s); });
    };
  }
  api_.range_begin = [](void* c, const char* name, int32_t kind, void* s) -> int32_t {
    const char* category = kind == ATTNHOST_RANGE_COMPUTE ? "compute"
                           : kind == ATTNHOST_RANGE_COMMUNICATION ? "communication" : "other";
    int32_t id = -1;
    self(c).guarded("range_begin", [&] { id = self(c).tracer_.begin(name ? name : "", category, s); });
    return id;
  };
  api_.range_end = [](void* c, int32_t id, void* s) {
    self(c).guarded("range_end", [&] { self(c).tracer_.end(id, s); });
  };
  api_.log = [](void* c, int32_t level, const char* message) {
    std::string text = message ? message : "";
    if (text.rfind("engine:", 0) == 0) {  // goes into the result, not onto the console
      self(c).engine_note_ = text;
      level = ATTNHOST_LOG_DEBUG;
    }
    std::string line = "plugin (rank " + std::to_string(self(c).rank_) + "): " + text;
    log::write(level >= ATTNHOST_LOG_ERROR ? log::Level::error
               : level == ATTNHOST_LOG_WARNING ? log::Level::warning
               : level == ATTNHOST_LOG_INFO ? log::Level::info : log::Level::debug, line);
  };
}

}  // namespace attnhost
