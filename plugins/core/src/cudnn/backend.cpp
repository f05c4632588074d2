#include "backend.h"

#include <cstdio>

#include "attncore/attention.h"

// The handle attributes of the operation graph and the plan are marked deprecated in cuDNN 9's
// headers, and still the way to bind a handle with the 9.x libraries this runs on.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace attncore::cudnn {

std::string describe(cudnnStatus_t status, const std::string& what) {
  std::string s = "cuDNN " + what + ": " + cudnnGetErrorString(status);
  char last[512] = {0};
  cudnnGetLastErrorString(last, sizeof last);
  if (last[0]) {
    std::string m(last);
    for (char& c : m)
      if (c == '\n' || c == '\r') c = ' ';
    s += " (" + m + ")";
  }
  return s;
}

void check(cudnnStatus_t status, const std::string& what) {
  if (status != CUDNN_STATUS_SUCCESS) throw Error(describe(status, what));
}

Descriptor::Descriptor(cudnnBackendDescriptorType_t type, const char* name) : name_(name) {
  check(cudnnBackendCreateDescriptor(type, &d_), std::string("create ") + name);
}

Descriptor::~Descriptor() {
  if (d_) cudnnBackendDestroyDescriptor(d_);
}

void Descriptor::set(cudnnBackendAttributeName_t attr, cudnnBackendAttributeType_t type, int64_t count,
                     const void* value) {
  check(cudnnBackendSetAttribute(d_, attr, type, count, value),
        std::string("set attribute ") + std::to_string(int(attr)) + " of " + name_);
}

void Descriptor::finalize() { check(cudnnBackendFinalize(d_), std::string("finalize ") + name_); }

cudnnStatus_t Descriptor::try_finalize() { return cudnnBackendFinalize(d_); }

std::vector<int64_t> GraphBuilder::packed(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) s[i - 1] = s[i] * dims[i];
  return s;
}

int GraphBuilder::add_tensor(std::vector<int64_t> dims, std::vector<int64_t> strides, cudnnDataType_t type,
                             bool is_virtual, bool by_value) {
  Tensor t;
  t.desc = std::make_unique<Descriptor>(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
  t.uid = next_uid_++;
  t.dims = dims;
  t.by_value = by_value;
  t.desc->set_dtype(CUDNN_ATTR_TENSOR_DATA_TYPE, type);
  t.desc->set_i64s(CUDNN_ATTR_TENSOR_DIMENSIONS, dims);
  t.desc->set_i64s(CUDNN_ATTR_TENSOR_STRIDES, strides);
  t.desc->set_i64(CUDNN_ATTR_TENSOR_UNIQUE_ID, t.uid);
  t.desc->set_i64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16);
  if (is_virtual) t.desc->set_bool(CUDNN_ATTR_TENSOR_IS_VIRTUAL, true);
  if (by_value) t.desc->set_bool(CUDNN_ATTR_TENSOR_IS_BY_VALUE, true);
  t.desc->finalize();
  tensors_.push_back(std::move(t));
  return int(tensors_.size() - 1);
}

int GraphBuilder::tensor(std::vector<int64_t> dims, std::vector<int64_t> strides, cudnnDataType_t type,
                         bool is_virtual) {
  return add_tensor(std::move(dims), std::move(strides), type, is_virtual, false);
}

int GraphBuilder::scalar(float v) {
  f32_.push_back(v);
  const int t = add_tensor({1, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_FLOAT, false, true);
  by_value_.emplace_back(uid(t), &f32_.back());
  return t;
}

int GraphBuilder::scalar_i32(int32_t v) {
  i32_.push_back(v);
  const int t = add_tensor({1, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_INT32, false, true);
  by_value_.emplace_back(uid(t), &i32_.back());
  return t;
}

void GraphBuilder::pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t precision, int y, int x, int b, int t,
                             int64_t axis) {
  Descriptor& pw = parts_.emplace_back(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise");
  pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  pw.set_dtype(CUDNN_ATTR_POINTWISE_MATH_PREC, precision);
  if (axis >= 0) pw.set_i64(CUDNN_ATTR_POINTWISE_AXIS, axis);
  pw.finalize();
  Descriptor op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation");
  op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
  op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, tensor_desc(x));
  if (b >= 0) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, tensor_desc(b));
  if (t >= 0) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, tensor_desc(t));
  op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, tensor_desc(y));
  op.finalize();
  ops_.push_back(std::move(op));
}

void GraphBuilder::matmul(int a, int b, int c, int m_override, int n_override, int k_override) {
  Descriptor& mm = parts_.emplace_back(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul");
  mm.set_dtype(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT);
  mm.finalize();
  Descriptor op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation");
  op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, tensor_desc(a));
  op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, tensor_desc(b));
  op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, tensor_desc(c));
  op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
  if (m_override >= 0) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, tensor_desc(m_override));
  if (n_override >= 0) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, tensor_desc(n_override));
  if (k_override >= 0) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, tensor_desc(k_override));
  op.finalize();
  ops_.push_back(std::move(op));
}

void GraphBuilder::reduction(cudnnReduceTensorOp_t mode, int x, int y) {
  Descriptor& red = parts_.emplace_back(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction");
  red.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
  red.set_dtype(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT);
  red.finalize();
  Descriptor op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation");
  op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, tensor_desc(x));
  op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, tensor_desc(y));
  op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, red);
  op.finalize();
  ops_.push_back(std::move(op));
}

void GraphBuilder::reshape(int x, int y) {
  Descriptor op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation");
  op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, tensor_desc(x));
  op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, tensor_desc(y));
  op.finalize();
  ops_.push_back(std::move(op));
}

namespace {
// Everything a plan was made from, kept as long as the plan: cuDNN's descriptors point at each other.
struct Kept {
  std::shared_ptr<GraphBuilder> graph_builder;
  std::unique_ptr<Descriptor> graph, heuristics;
  std::vector<Descriptor> configs;
};
}  // namespace

Plan GraphBuilder::build(std::shared_ptr<GraphBuilder> g, cudnnHandle_t handle, const char* what) {
  auto kept = std::make_shared<Kept>();
  kept->graph_builder = g;
  kept->graph = std::make_unique<Descriptor>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
  Descriptor& graph = *kept->graph;
  std::vector<cudnnBackendDescriptor_t> ops;
  for (const Descriptor& op : g->ops_) ops.push_back(op.get());
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops.size()), ops.data());
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  if (cudnnStatus_t s = graph.try_finalize(); s != CUDNN_STATUS_SUCCESS)
    throw Error(describe(s, std::string(what) + ": the operation graph (" + std::to_string(ops.size()) +
                                " operations) did not finalize"));
  std::string tried;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    const char* mode_name = mode == CUDNN_HEUR_MODE_A ? "heuristics A" : "fallback heuristics";
    auto heur_owner = std::make_unique<Descriptor>(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics");
    Descriptor& heur = *heur_owner;
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (cudnnStatus_t s = heur.try_finalize(); s != CUDNN_STATUS_SUCCESS) {
      tried += std::string("; ") + describe(s, mode_name);
      continue;
    }
    int64_t count = 0;
    if (cudnnStatus_t s = cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr);
        s != CUDNN_STATUS_SUCCESS || count <= 0) {
      tried += std::string("; ") + mode_name + ": no engine config";
      continue;
    }
    std::vector<Descriptor> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config");
      raw.push_back(configs.back().get());
    }
    check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                   &count, raw.data()),
          "read the engine configs");
    std::string last;
    for (int64_t i = 0; i < count; ++i) {
      auto plan = std::make_unique<Descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
      plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
      plan->set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[size_t(i)]);
      if (cudnnStatus_t s = plan->try_finalize(); s != CUDNN_STATUS_SUCCESS) {
        last = describe(s, "plan");
        continue;
      }
      Plan p;
      check(cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                     nullptr, &p.workspace),
            "read the plan's workspace size");
      p.plan = std::move(plan);
      p.engine = std::string(mode_name) + " config " + std::to_string(i + 1) + " of " + std::to_string(count);
      for (auto [u, ptr] : g->by_value_) {
        p.by_value_uids.push_back(u);
        p.by_value_ptrs.push_back(ptr);
      }
      kept->heuristics = std::move(heur_owner);
      kept->configs = std::move(configs);
      p.keep = kept;
      return p;
    }
    tried += std::string("; ") + mode_name + ": " + std::to_string(count) + " configs, none finalized (last: " +
             last + ")";
  }
  throw Error(std::string(what) + ": no execution plan" + tried);
}

} // namespace attncore::cudnn
