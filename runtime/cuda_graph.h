// A CUDA graph: the kernels one callable enqueues on a stream, captured once and replayed as
// a single launch. Small training steps are launch-bound; a replay costs one launch instead
// of one per kernel. What was captured reads and writes fixed addresses, so everything it
// touches must stay allocated at the same place (StaticRun's arena and scratch pool do that).
//
// Built without CUDA, capture() and replay() throw qg::Error.
#pragma once

#include <functional>

namespace qg {

class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Captures what `enqueue` puts on `stream` (a cudaStream_t; nothing runs while capturing)
  // and instantiates it, replacing an earlier capture. Capture is in global mode, so an
  // allocation, a synchronisation or a host copy inside `enqueue` fails the capture with
  // CUDA's error instead of being baked into the graph. If `enqueue` throws, the capture is
  // ended and discarded and the exception propagates.
  void capture(void* stream, const std::function<void()>& enqueue);
  // Enqueues one replay on `stream`; asynchronous like any launch.
  void replay(void* stream) const;
  bool captured() const { return exec_ != nullptr; }
  int num_nodes() const { return num_nodes_; }  // kernels (and other nodes) captured

 private:
  void reset();
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
  int num_nodes_ = 0;
};

}  // namespace qg
