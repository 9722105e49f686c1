#include "device/cuda/cuda_check.h"
#include "runtime/cuda_graph.h"

namespace qg {

namespace {

cudaGraph_t as_graph(void* p) {
  return static_cast<cudaGraph_t>(p);
}
cudaGraphExec_t as_exec(void* p) {
  return static_cast<cudaGraphExec_t>(p);
}

}  // namespace

CudaGraph::~CudaGraph() {
  // Destruction may run during teardown or unwinding: errors are not raised here.
  if (exec_ != nullptr) (void)cudaGraphExecDestroy(as_exec(exec_));
  if (graph_ != nullptr) (void)cudaGraphDestroy(as_graph(graph_));
}

void CudaGraph::reset() {
  if (exec_ != nullptr) QG_CUDA_CHECK("cuda_graph", cudaGraphExecDestroy(as_exec(exec_)));
  if (graph_ != nullptr) QG_CUDA_CHECK("cuda_graph", cudaGraphDestroy(as_graph(graph_)));
  exec_ = graph_ = nullptr;
  num_nodes_ = 0;
}

void CudaGraph::capture(void* stream_ptr, const std::function<void()>& enqueue) {
  QG_CHECK(stream_ptr != nullptr, "cuda_graph",
           "capture needs a CUDA stream (the legacy default stream cannot be captured)");
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  reset();
  // Work enqueued before the capture is not part of it; let it finish first.
  QG_CUDA_CHECK("cuda_graph", cudaStreamSynchronize(stream));
  QG_CUDA_CHECK("cuda_graph", cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  cudaGraph_t graph = nullptr;
  try {
    enqueue();
  } catch (...) {
    // End the capture so the stream is usable again; the partial graph is discarded.
    if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph != nullptr)
      (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw;
  }
  QG_CUDA_CHECK("cuda_graph", cudaStreamEndCapture(stream, &graph));
  graph_ = graph;
  size_t n = 0;
  QG_CUDA_CHECK("cuda_graph", cudaGraphGetNodes(graph, nullptr, &n));
  num_nodes_ = static_cast<int>(n);
  cudaGraphExec_t exec = nullptr;
  QG_CUDA_CHECK("cuda_graph", cudaGraphInstantiate(&exec, graph, 0));
  exec_ = exec;
  // Uploading now keeps the one-time setup cost out of the first replay.
  QG_CUDA_CHECK("cuda_graph", cudaGraphUpload(exec, stream));
}

void CudaGraph::replay(void* stream) const {
  QG_CHECK(exec_ != nullptr, "cuda_graph", "replay before a successful capture");
  QG_CUDA_CHECK("cuda_graph", cudaGraphLaunch(as_exec(exec_), static_cast<cudaStream_t>(stream)));
}

}  // namespace qg
