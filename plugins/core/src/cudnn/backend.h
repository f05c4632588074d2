// A thin C++ layer over cuDNN's backend descriptors (cudnn_graph.h): an owning descriptor with
// typed setters, and a graph builder whose vocabulary is the one attention graphs are written in
// (tensors, pointwise, matmul, reduction, reshape), ending in a finalized execution plan.
#pragma once

#include <cudnn_graph.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace attncore::cudnn {

// One line: what failed, the status name, and cuDNN's own last error message when it has one.
std::string describe(cudnnStatus_t status, const std::string& what);
// Throws attncore::Error(describe(...)) unless status is success.
void check(cudnnStatus_t status, const std::string& what);

// Owns one backend descriptor.
class Descriptor {
 public:
  Descriptor(cudnnBackendDescriptorType_t type, const char* name);
  ~Descriptor();
  Descriptor(Descriptor&& o) noexcept : d_(o.d_), name_(o.name_) { o.d_ = nullptr; }
  Descriptor& operator=(Descriptor&&) = delete;
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  const char* name() const { return name_; }
  void set(cudnnBackendAttributeName_t attr, cudnnBackendAttributeType_t type, int64_t count, const void* value);
  void set_i64(cudnnBackendAttributeName_t attr, int64_t v) { set(attr, CUDNN_TYPE_INT64, 1, &v); }
  void set_i64s(cudnnBackendAttributeName_t attr, const std::vector<int64_t>& v) {
    set(attr, CUDNN_TYPE_INT64, int64_t(v.size()), v.data());
  }
  void set_bool(cudnnBackendAttributeName_t attr, bool v) { set(attr, CUDNN_TYPE_BOOLEAN, 1, &v); }
  void set_dtype(cudnnBackendAttributeName_t attr, cudnnDataType_t v) { set(attr, CUDNN_TYPE_DATA_TYPE, 1, &v); }
  void set_desc(cudnnBackendAttributeName_t attr, const Descriptor& v) {
    cudnnBackendDescriptor_t d = v.get();
    set(attr, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
  }
  void finalize();                 // throws
  cudnnStatus_t try_finalize();    // for the probes whose failure is an answer

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
  const char* name_;
};

// A finalized plan with the uids its variant pack binds.
struct Plan {
  std::unique_ptr<Descriptor> plan;
  int64_t workspace = 0;     // bytes cuDNN's engine needs
  std::string engine;        // e.g. "composite graph, engine 7 of 3 configs tried"
  std::vector<int64_t> by_value_uids;     // scalars bound to host memory
  std::vector<const void*> by_value_ptrs; // into the graph's scalar storage (kept alive here)
  std::shared_ptr<void> keep;             // the graph the plan was built from
};

// An operation graph under construction. Tensor handles are indices. Virtual tensors get packed
// strides unless given; every tensor is 16-byte aligned.
class GraphBuilder {
 public:
  int tensor(std::vector<int64_t> dims, std::vector<int64_t> strides, cudnnDataType_t type, bool is_virtual);
  int virt(std::vector<int64_t> dims, cudnnDataType_t type) { return tensor(dims, packed(dims), type, true); }
  int virt(std::vector<int64_t> dims, std::vector<int64_t> strides, cudnnDataType_t type) {
    return tensor(std::move(dims), std::move(strides), type, true);
  }
  int scalar(float v);
  int scalar_i32(int32_t v);
  int64_t uid(int t) const { return tensors_[size_t(t)].uid; }
  const std::vector<int64_t>& dims(int t) const { return tensors_[size_t(t)].dims; }

  // y = mode(x [, b [, t]]) computed in `precision`; axis only for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t precision, int y, int x, int b = -1, int t = -1,
                 int64_t axis = -1);
  // c = a @ b over the last two dims (batch dims broadcast); optional per-batch M/N/K overrides.
  void matmul(int a, int b, int c, int m_override = -1, int n_override = -1, int k_override = -1);
  void reduction(cudnnReduceTensorOp_t op, int x, int y);
  void reshape(int x, int y);
  // Any single operation built elsewhere (the fused SDPA_FWD operation).
  void add_operation(Descriptor op) { ops_.push_back(std::move(op)); }
  const Descriptor& tensor_desc(int t) const { return *tensors_[size_t(t)].desc; }

  // Finalizes the graph and the first engine config cuDNN's heuristics offer that finalizes as a
  // plan (mode A, then the fallback list). Throws attncore::Error with every status seen.
  static Plan build(std::shared_ptr<GraphBuilder> graph, cudnnHandle_t handle, const char* what);

  static std::vector<int64_t> packed(const std::vector<int64_t>& dims);

 private:
  struct Tensor {
    std::unique_ptr<Descriptor> desc;
    std::vector<int64_t> dims;
    int64_t uid = 0;
    bool by_value = false;
  };
  int add_tensor(std::vector<int64_t> dims, std::vector<int64_t> strides, cudnnDataType_t type, bool is_virtual,
                 bool by_value);
  std::vector<Tensor> tensors_;
  std::deque<Descriptor> ops_;
  std::deque<Descriptor> parts_;          // pointwise/matmul/reduction descriptors the ops point at
  std::deque<float> f32_;                 // by-value scalars (stable addresses)
  std::deque<int32_t> i32_;
  std::vector<std::pair<int64_t, const void*>> by_value_;
  int64_t next_uid_ = 1;
};

} // namespace attncore::cudnn
