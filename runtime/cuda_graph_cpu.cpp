// CudaGraph without CUDA: every use says so (runtime/cuda/cuda_graph.cu is the real one).
#ifndef QG_WITH_CUDA
#include "core/error.h"
#include "runtime/cuda_graph.h"

namespace qg {

CudaGraph::~CudaGraph() = default;

void CudaGraph::reset() {}

void CudaGraph::capture(void*, const std::function<void()>&) {
  QG_FAIL("cuda_graph", "CUDA graph capture needs the CUDA backend; qatgraph was built without it");
}

void CudaGraph::replay(void*) const {
  QG_FAIL("cuda_graph", "CUDA graph replay needs the CUDA backend; qatgraph was built without it");
}

}  // namespace qg
#endif
