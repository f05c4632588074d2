// attnhost plugin helper for C++20 plugin authors (header-only, optional).
//
// Write a class with the members below, then export it with ATTNHOST_EXPORT_PLUGIN(MyPlugin).
// The helper builds the C table, turns every exception into an attnhost_error and checks the
// host's services for you, so plugin code can simply throw attnhost::Error.
//
//   struct MyPlugin {
//     static const attnhost_plugin_info& info();                       // required
//     static void validate(const attnhost::Problem&);                  // required; throw to refuse
//     MyPlugin(const attnhost::Problem&, attnhost::Host);              // required
//     attnhost_layout layout(int32_t kind);                            // required
//     void forward(const attnhost_forward_args&);                      // required
//     void backward(const attnhost_backward_args&);                    // optional
//     attnhost::PairCount count_pairs();                               // required
//     attnhost_span_list enumerate_keys(int64_t b, int32_t h, int64_t q);        // required
//     attnhost_span_list enumerate_queries(int64_t b, int32_t kvh, int64_t k);   // required
//   };
//
// The struct attnhost_error is defined here, once per plugin library (plugins are built with hidden
// visibility, so two plugins' definitions never meet). The host never includes this header.
#pragma once

#include <attnhost/plugin.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct attnhost_error {
  int32_t code;
  std::string message;
  bool is_static; // the fallback used when even the error could not be allocated
};

#ifndef ATTNHOST_PLUGIN_CONFIG
#define ATTNHOST_PLUGIN_CONFIG ""
#endif
#ifdef __OPTIMIZE__
#define ATTNHOST_DETAIL_OPTIMIZED "optimized"
#else
#define ATTNHOST_DETAIL_OPTIMIZED "unoptimized"
#endif

namespace attnhost {

// An error a plugin raises; becomes an attnhost_error at the ABI boundary.
class Error : public std::exception {
 public:
  Error(attnhost_status code, std::string message) : code_(code), message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }
  attnhost_status code() const noexcept { return code_; }

 private:
  attnhost_status code_;
  std::string message_;
};

[[noreturn]] inline void fail(attnhost_status code, std::string message) {
  throw Error(code, std::move(message));
}

inline void require(bool ok, attnhost_status code, std::string_view message) {
  if (!ok) fail(code, std::string(message));
}

inline size_t dtype_size(int32_t dtype) {
  switch (dtype) {
    case ATTNHOST_DTYPE_BF16: case ATTNHOST_DTYPE_FP16: return 2;
    case ATTNHOST_DTYPE_FP32: case ATTNHOST_DTYPE_INT32: return 4;
    case ATTNHOST_DTYPE_FP64: case ATTNHOST_DTYPE_INT64: return 8;
    case ATTNHOST_DTYPE_UINT8: case ATTNHOST_DTYPE_FP8_E4M3: case ATTNHOST_DTYPE_FP8_E5M2: return 1;
    default: return 0;
  }
}

inline const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case ATTNHOST_DTYPE_BF16: return "bf16";
    case ATTNHOST_DTYPE_FP16: return "fp16";
    case ATTNHOST_DTYPE_FP32: return "fp32";
    case ATTNHOST_DTYPE_FP64: return "fp64";
    case ATTNHOST_DTYPE_INT32: return "int32";
    case ATTNHOST_DTYPE_INT64: return "int64";
    case ATTNHOST_DTYPE_UINT8: return "uint8";
    case ATTNHOST_DTYPE_FP8_E4M3: return "fp8_e4m3";
    case ATTNHOST_DTYPE_FP8_E5M2: return "fp8_e5m2";
    default: return "invalid";
  }
}

inline int64_t numel(const attnhost_tensor& t) {
  int64_t n = 1;
  for (int32_t i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

// (query, key) pairs, for FLOPs: this rank's and all ranks' together.
struct PairCount {
  int64_t rank_pairs = 0;
  int64_t total_pairs = 0;
};

// An owning copy of the problem: what the host passed is only valid during the call.
class Problem {
 public:
  explicit Problem(const attnhost_problem& p) : raw_{} {
    // Only the fields the host's struct has: an older host's problem is smaller than ours.
    std::memcpy(&raw_, &p, p.struct_size < sizeof(raw_) ? p.struct_size : sizeof(raw_));
    if (!ATTNHOST_HAS_FIELD(&raw_, attnhost_problem, local_size) || raw_.local_size <= 0) {
      raw_.local_rank = raw_.rank;
      raw_.local_size = raw_.world_size;
    }
    raw_.struct_size = sizeof(attnhost_problem);
    if (p.num_seqs > 0) {
      if (p.cu_seqlens_q) cu_q_.assign(p.cu_seqlens_q, p.cu_seqlens_q + p.num_seqs + 1);
      if (p.cu_seqlens_kv) cu_kv_.assign(p.cu_seqlens_kv, p.cu_seqlens_kv + p.num_seqs + 1);
    }
    for (int32_t i = 0; i < p.num_params; ++i) {
      const attnhost_param_value& v = *ATTNHOST_ELEMENT(attnhost_param_value, p.params, i);
      Param copy{v.name ? v.name : "", v.type, v.int_value, v.float_value,
                 v.string_value ? v.string_value : "", {}};
      if (v.type == ATTNHOST_PARAM_INT_LIST && v.list_value)
        copy.list.assign(v.list_value, v.list_value + v.list_length);
      params_.push_back(std::move(copy));
    }
    raw_.cu_seqlens_q = cu_q_.empty() ? nullptr : cu_q_.data();
    raw_.cu_seqlens_kv = cu_kv_.empty() ? nullptr : cu_kv_.data();
    raw_.params = nullptr;  // read parameters through the typed getters below
    raw_.num_params = 0;
  }

  const attnhost_problem& raw() const { return raw_; }
  const attnhost_problem* operator->() const { return &raw_; }
  bool packed() const { return raw_.num_seqs > 0; }
  const std::vector<int64_t>& cu_seqlens_q() const { return cu_q_; }
  const std::vector<int64_t>& cu_seqlens_kv() const { return cu_kv_; }

  bool has(std::string_view name) const { return find(name) != nullptr; }
  int64_t get_int(std::string_view name) const { return get(name, ATTNHOST_PARAM_INT).int_value; }
  double get_float(std::string_view name) const {
    return get(name, ATTNHOST_PARAM_FLOAT).float_value;
  }
  bool get_bool(std::string_view name) const {
    return get(name, ATTNHOST_PARAM_BOOL).int_value != 0;
  }
  const std::string& get_string(std::string_view name) const {
    return get(name, ATTNHOST_PARAM_STRING).string_value;
  }
  // A PATH parameter: absolute, or empty (ABI 1.2).
  const std::string& get_path(std::string_view name) const { return get(name, ATTNHOST_PARAM_PATH).string_value; }
  const std::vector<int64_t>& get_int_list(std::string_view name) const {
    return get(name, ATTNHOST_PARAM_INT_LIST).list;
  }

 private:
  struct Param {
    std::string name;
    int32_t type;
    int64_t int_value;
    double float_value;
    std::string string_value;
    std::vector<int64_t> list;
  };
  const Param* find(std::string_view name) const {
    for (const Param& p : params_)
      if (p.name == name) return &p;
    return nullptr;
  }
  const Param& get(std::string_view name, int32_t type) const {
    const Param* p = find(name);
    if (!p) fail(ATTNHOST_ERR_INVALID_ARGUMENT, "missing plugin parameter '" + std::string(name) + "'");
    if (p->type != type)
      fail(ATTNHOST_ERR_INVALID_ARGUMENT, "plugin parameter '" + std::string(name) + "' has another type");
    return *p;
  }

  attnhost_problem raw_;
  std::vector<int64_t> cu_q_, cu_kv_;
  std::vector<Param> params_;
};

// The host's services with status codes turned into exceptions.
class Host {
 public:
  Host() = default;
  explicit Host(const attnhost_host_api* api) : api_(api) {}
  const attnhost_host_api* raw() const { return api_; }

  void* stream(int32_t index = 0) const { return api_->stream(api_->context, index); }
  void* alloc(size_t bytes) const {
    void* p = nullptr;
    check(api_->alloc(api_->context, bytes, &p), "alloc of " + std::to_string(bytes) + " bytes");
    return p;
  }
  void free(void* p) const { if (p) api_->free(api_->context, p); }

  void send(const void* buf, size_t count, int32_t dtype, int32_t peer, void* s) const {
    check(api_->send(api_->context, buf, count, dtype, peer, s), "send");
  }
  void recv(void* buf, size_t count, int32_t dtype, int32_t peer, void* s) const {
    check(api_->recv(api_->context, buf, count, dtype, peer, s), "recv");
  }
  void group_start() const { check(api_->group_start(api_->context), "group_start"); }
  void group_end() const { check(api_->group_end(api_->context), "group_end"); }
  void all_gather(const void* send, void* recv, size_t count, int32_t dtype, void* s) const {
    check(api_->all_gather(api_->context, send, recv, count, dtype, s), "all_gather");
  }
  void all_reduce(const void* send, void* recv, size_t count, int32_t dtype, int32_t op, void* s) const {
    check(api_->all_reduce(api_->context, send, recv, count, dtype, op, s), "all_reduce");
  }
  void reduce_scatter(const void* send, void* recv, size_t count, int32_t dtype, int32_t op,
                      void* s) const {
    check(api_->reduce_scatter(api_->context, send, recv, count, dtype, op, s), "reduce_scatter");
  }
  void barrier() const { check(api_->barrier(api_->context), "barrier"); }
  void* native_comm() const { return api_->native_comm(api_->context); }
  // ABI 1.7: whether blocks move as they lie (send_block/recv_block); else pack them.
  bool blocks() const {
    return ATTNHOST_HAS_FIELD(api_, attnhost_host_api, recv_block) && api_->send_block && api_->recv_block;
  }
  void send_block(const attnhost_block& b, int32_t peer, void* s) const {
    if (!blocks()) fail(ATTNHOST_ERR_UNSUPPORTED, "send_block: this host moves no blocks (ABI < 1.7, or NCCL or MPI): pack them");
    check(api_->send_block(api_->context, &b, peer, s), "send_block");
  }
  void recv_block(const attnhost_block& b, int32_t peer, void* s) const {
    if (!blocks()) fail(ATTNHOST_ERR_UNSUPPORTED, "recv_block: this host moves no blocks (ABI < 1.7, or NCCL or MPI): pack them");
    check(api_->recv_block(api_->context, &b, peer, s), "recv_block");
  }

  int32_t range_begin(const char* name, attnhost_range_kind kind, void* s) const {
    return api_->range_begin(api_->context, name, kind, s);
  }
  void range_end(int32_t range, void* s) const { api_->range_end(api_->context, range, s); }
  void log(attnhost_log_level level, const std::string& message) const {
    api_->log(api_->context, level, message.c_str());
  }

 private:
  static void check(int32_t status, const std::string& what) {
    if (status == ATTNHOST_OK) return;
    attnhost_status code = status == ATTNHOST_ERR_OUT_OF_MEMORY ? ATTNHOST_ERR_OUT_OF_MEMORY
                           : status == ATTNHOST_ERR_COMMUNICATION ? ATTNHOST_ERR_COMMUNICATION
                                                                  : ATTNHOST_ERR_INTERNAL;
    fail(code, "host service failed: " + what);
  }
  const attnhost_host_api* api_ = nullptr;
};

// A device buffer from the host's allocator, freed when it goes out of scope.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(const Host& host, size_t bytes) : host_(host), ptr_(bytes ? host.alloc(bytes) : nullptr), bytes_(bytes) {}
  HostBuffer(HostBuffer&& o) noexcept { *this = std::move(o); }
  HostBuffer& operator=(HostBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      host_ = o.host_; ptr_ = std::exchange(o.ptr_, nullptr); bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { reset(); }
  void reset() { if (ptr_) host_.free(ptr_); ptr_ = nullptr; bytes_ = 0; }
  void* get() const { return ptr_; }
  template <class T> T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  Host host_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Storage behind an attnhost_span_list returned to the host.
class SpanList {
 public:
  void clear() { spans_.clear(); }
  void add(int64_t begin, int64_t end, int64_t step = 1, int32_t head = -1, int32_t multiplicity = 1) {
    if (end > begin) spans_.push_back({begin, end, step, head, multiplicity});
  }
  attnhost_span_list view() const {
    return {ATTNHOST_STRUCT_SIZE(attnhost_span_list, spans), static_cast<int64_t>(spans_.size()),
            spans_.data()};
  }
  const std::vector<attnhost_span>& spans() const { return spans_; }

 private:
  std::vector<attnhost_span> spans_;
};

// Storage behind an attnhost_layout.
class Layout {
 public:
  void clear() { ranges_.clear(); local_tokens_ = 0; }
  void add(int64_t global_begin, int64_t length) {
    if (length <= 0) return;
    ranges_.push_back({global_begin, local_tokens_, length});
    local_tokens_ += length;
  }
  void pad(int64_t tokens) { local_tokens_ += tokens; }  // local slots that hold no real token
  attnhost_layout view() const {
    return {ATTNHOST_STRUCT_SIZE(attnhost_layout, ranges), local_tokens_,
            static_cast<int32_t>(ranges_.size()), ranges_.data()};
  }
  int64_t local_tokens() const { return local_tokens_; }

 private:
  std::vector<attnhost_token_range> ranges_;
  int64_t local_tokens_ = 0;
};

namespace detail {

inline attnhost_error* make_error(int32_t code, const char* message) noexcept {
  try {
    return new attnhost_error{code, message, false};
  } catch (...) {
    static attnhost_error out_of_memory{ATTNHOST_ERR_OUT_OF_MEMORY,
                                        "out of host memory while reporting an error", true};
    return &out_of_memory;
  }
}

// Runs f; any exception becomes an error object (rule 4 of plugin.h).
template <class F>
attnhost_error* guard(F&& f) noexcept {
  try {
    f();
    return nullptr;
  } catch (const Error& e) {
    return make_error(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return make_error(ATTNHOST_ERR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return make_error(ATTNHOST_ERR_INTERNAL, e.what());
  } catch (...) {
    return make_error(ATTNHOST_ERR_INTERNAL, "unknown exception");
  }
}

template <class Impl>
Impl& self(attnhost_instance* instance) {
  return *reinterpret_cast<Impl*>(instance);
}

template <class Impl>
struct Table {
  static attnhost_error* describe(const attnhost_plugin_info** out) {
    return guard([&] { *out = &Impl::info(); });
  }
  static attnhost_error* validate(const attnhost_problem* p) {
    return guard([&] { Impl::validate(Problem(*p)); });
  }
  static attnhost_error* create(const attnhost_problem* p, const attnhost_host_api* host,
                                attnhost_instance** out) {
    return guard([&] {
      Problem problem(*p);
      Impl::validate(problem);
      *out = reinterpret_cast<attnhost_instance*>(new Impl(problem, Host(host)));
    });
  }
  static attnhost_error* layout(attnhost_instance* in, int32_t kind, attnhost_layout* out) {
    return guard([&] { *out = self<Impl>(in).layout(kind); });
  }
  static attnhost_error* forward(attnhost_instance* in, const attnhost_forward_args* a) {
    return guard([&] { self<Impl>(in).forward(*a); });
  }
  static attnhost_error* backward(attnhost_instance* in, const attnhost_backward_args* a) {
    return guard([&] {
      if constexpr (requires(Impl& i) { i.backward(*a); }) self<Impl>(in).backward(*a);
    });
  }
  static attnhost_error* count_pairs(attnhost_instance* in, int64_t* rank, int64_t* total) {
    return guard([&] {
      PairCount c = self<Impl>(in).count_pairs();
      *rank = c.rank_pairs;
      *total = c.total_pairs;
    });
  }
  static attnhost_error* enumerate_keys(attnhost_instance* in, int64_t b, int32_t h, int64_t q,
                                        attnhost_span_list* out) {
    return guard([&] { *out = self<Impl>(in).enumerate_keys(b, h, q); });
  }
  static attnhost_error* enumerate_queries(attnhost_instance* in, int64_t b, int32_t kvh, int64_t k,
                                           attnhost_span_list* out) {
    return guard([&] { *out = self<Impl>(in).enumerate_queries(b, kvh, k); });
  }
  static void destroy(attnhost_instance* in) noexcept {
    try {
      delete reinterpret_cast<Impl*>(in);
    } catch (...) {
    }
  }
  static const char* error_message(const attnhost_error* e) { return e->message.c_str(); }
  static int32_t error_code(const attnhost_error* e) { return e->code; }
  static void error_destroy(attnhost_error* e) {
    if (e && !e->is_static) delete e;
  }

  // "Release, optimized": the CMake configuration (attnhost::plugin_api passes it to every plugin
  // built against it as ATTNHOST_PLUGIN_CONFIG) and what the compiler did.
  static constexpr const char* kBuild = sizeof(ATTNHOST_PLUGIN_CONFIG) > 1
                                            ? ATTNHOST_PLUGIN_CONFIG ", " ATTNHOST_DETAIL_OPTIMIZED
                                            : ATTNHOST_DETAIL_OPTIMIZED;

  static constexpr bool has_backward = requires(Impl& i, const attnhost_backward_args& a) {
    i.backward(a);
  };

  static const attnhost_plugin_api* api() {
    static const attnhost_plugin_api table = {
        ATTNHOST_STRUCT_SIZE(attnhost_plugin_api, build),
        ATTNHOST_ABI_MAJOR,
        ATTNHOST_ABI_MINOR,
        &describe,
        &validate,
        &create,
        &layout,
        &forward,
        has_backward ? &backward : nullptr,
        &count_pairs,
        &enumerate_keys,
        &enumerate_queries,
        &destroy,
        &error_message,
        &error_code,
        &error_destroy,
        kBuild,
    };
    return &table;
  }
};

}  // namespace detail
}  // namespace attnhost

// The plugin returns its table whatever the host's version: the host compares majors and names
// both versions when they differ, which a refusal (NULL) could not.
#define ATTNHOST_EXPORT_PLUGIN(Impl)                                                     \
  extern "C" __attribute__((visibility("default"))) const attnhost_plugin_api*           \
  attnhost_plugin_entry(const attnhost_version* /*host*/) {                              \
    return ::attnhost::detail::Table<Impl>::api();                                       \
  }
