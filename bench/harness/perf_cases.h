// The performance cases of PERF.md, shared by the Google Benchmark suites and `qat bench`:
// each builds a small graph around one input x, runs fused (passes on) or unfused, and is
// timed against a device copy of x's bytes in the same process.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/graph.h"
#include "device/device_context.h"

namespace qg::bench {

struct PerfCase {
  std::string name;  // e.g. "obs+fq per-tensor"
  Shape shape;
  DType dtype = DType::f32;
  bool fusable = false;  // has a fused_observe_quantize variant
  // Builds the graph around input "x" and returns the values to fetch.
  std::function<std::vector<ValueId>(Graph&, ValueId x)> build;
  std::string label() const;  // "obs+fq per-tensor f32[8192, 4096]"
};

// The PERF.md cases at the PERF.md shapes (GPU) or the CPU shape [1024, 4096]; a non-empty
// `shape_2d` replaces the 2-D shapes (the CPU thread-scaling run uses [8192, 4096]).
std::vector<PerfCase> perf_cases(DeviceType device, bool quick, const Shape& shape_2d = {});

struct Measurement {
  std::string case_label;
  std::string variant;  // "fused", "unfused" or "-"
  double us = 0;        // median time per launch
  double copy_us = 0;   // median device copy of x's bytes, same process
  int kernels = 0;      // kernel launches per step
  double ratio() const { return us / copy_us; }
  // CPU only (0 on CUDA): the bytes the launch's kernels read and write (kernel_bytes), and
  // copies on the thread pool in the element-wise kernels' chunks (pool_copy_us) of x's
  // bytes and of half the moved bytes (a copy reads and writes each byte: the same traffic).
  int64_t moved_bytes = 0;
  double pool_copy_us = 0;
  double pool_copy_moved_us = 0;
  double gbps() const { return moved_bytes / us / 1e3; }  // achieved, bytes read + written
};

// The bytes the kernels of `nodes` read and write when each reads every input once and
// writes every output once: inputs plus outputs of every node that runs a kernel (sources
// and graph inputs run none, views move nothing). Node states (observer statistics, flags:
// a few bytes per qparam) are not counted.
int64_t kernel_bytes(const Graph& graph, const std::vector<NodeId>& nodes);

// One variant of a case, set up once on a device: the graph (fused or not), its executor
// and a StaticRun over rotating random inputs. launch(i) runs step i.
class CaseRunner {
 public:
  CaseRunner(const PerfCase& c, Device device, bool fused);
  ~CaseRunner();
  void launch(int i);
  int kernels() const;
  int64_t input_bytes() const { return bytes_; }
  int64_t moved_bytes() const;           // kernel_bytes of the nodes a launch runs
  const DeviceContext& context() const;  // where launch() enqueues its work

 private:
  struct Impl;
  Impl* impl_;
  int64_t bytes_;
};

// Times one case (median of `reps` launches after warm-up; inputs rotated when they would
// fit in cache). Returns the fused and unfused measurements when the case is fusable (the
// fused one only with `fused_only`).
std::vector<Measurement> measure(const PerfCase& c, Device device, int reps,
                                 bool fused_only = false);

}  // namespace qg::bench
