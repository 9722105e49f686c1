// CPU-vs-GPU cross-check: runs a graph on the CUDA backend and checks every node against
// the CPU reference kernel run on the very same inputs (the GPU's own input values, copied
// back), so a node is judged on its own arithmetic and drift from an upstream float
// reduction cannot masquerade as a quantization mismatch. Stateful nodes are checked too:
// the CPU kernel starts from the GPU's state before the step and both updated states must
// agree. The first diverging node (in execution order) is reported with the output, the
// flat index, both values and the error.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "runtime/executor.h"

namespace qg {

// How one output is compared: bit-exact (NaN matches any NaN) or by relative error.
struct CompareRule {
  bool exact = true;
  double tolerance = 0;  // max |gpu - cpu| / max(max |cpu|, tiny), when not exact
};

// Exact for everything (quantized values, masks, codes, packed bytes, scales, zero points,
// element-wise float math) except the outputs an op's definition marks as rounded
// (OpDef::crosscheck.rounded_outputs: matmul, sums, losses, LSQ scale/zp gradients, ...),
// which get 1e-5 in f32/f64 and a few storage ulps in f16/bf16.
CompareRule compare_rule(const std::string& op, int output, DType dtype);

struct CrosscheckMismatch {
  std::string node;  // node name (or "#id")
  std::string op;
  std::string output;  // output or state name
  int64_t index = -1;  // flat element index (-1: dtype/shape/raised mismatch)
  double cpu = 0, gpu = 0;
  double error = 0, tolerance = 0;
  std::string detail;
  std::string str() const;
};

struct CrosscheckReport {
  bool passed = false;
  int steps = 0;
  int nodes_checked = 0;
  int values_compared = 0;
  double max_error = 0;      // largest relative error seen among tolerance-compared outputs
  bool both_raised = false;  // the graph is invalid on both backends (consistent errors)
  std::string raised;        // the error text when both raised
  std::optional<CrosscheckMismatch> first;
};

struct CrosscheckOptions {
  int steps = 2;  // runs per backend: state updates of a second step are checked too
  bool training = true;
  int device_index = 0;
};

// Requires a CUDA device (throws qg::Error otherwise).
CrosscheckReport crosscheck(const Graph& graph, const Executor::Feeds& feeds,
                            const CrosscheckOptions& options = {});

// Compares two host tensors under `rule`; on a mismatch fills `m` (index, values, error).
bool compare_tensors(const Tensor& cpu, const Tensor& gpu, const CompareRule& rule,
                     CrosscheckMismatch& m, double& max_error);

}  // namespace qg
