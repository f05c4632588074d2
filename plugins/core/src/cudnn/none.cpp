// attncore built without cuDNN (no CUDA, no cudnn_graph.h, or ATTNCORE_WITH_CUDNN=OFF): the cuDNN
// engine serves nothing and says so.
#include "attncore/cudnn.h"

namespace attncore {

namespace {
const char* kWhy = "cuDNN engine: attncore was built without cuDNN";
}

int cudnn_version() { return 0; }
std::string cudnn_version_string() { return "none (attncore was built without cuDNN)"; }
std::string cudnn_check(const ForwardParams&) { return kWhy; }
std::string cudnn_check(const BackwardParams&) { return kWhy; }
std::string cudnn_plan_info(const ForwardParams&) { return kWhy; }
std::string cudnn_plan_info(const BackwardParams&) { return kWhy; }
void forward_cudnn(const ForwardParams&, void*, const Workspace&) { throw Error(kWhy); }
void backward_cudnn(const BackwardParams&, void*, const Workspace&) { throw Error(kWhy); }

} // namespace attncore
