// `qat steps --profile --floors`: beside each op's measured time, the least time its nodes
// could take on the device: the larger of their FLOPs at the peak GEMM rate and their bytes
// (every input and output read or written once, each state read and written) at the peak
// memory bandwidth. The ratio says which parts of a step are far from their floor.
#pragma once

#include <map>
#include <string>

#include "core/graph.h"

namespace qg::cli {

struct DevicePeaks {
  double tflops_16bit = 989;  // dense bf16/f16 tensor-core rate (H100/H200 SXM)
  double tops_int8 = 1979;    // dense int8 tensor-core rate (H100/H200 SXM: twice the 16-bit)
  double tflops_f32 = 67;     // f32 without TF32 (H100 SXM)
  double gbps = 3350;         // memory bandwidth (H100 SXM; H200: 4800)
};

// The work of one node: FLOPs of its GEMMs and attention (matmul: 2 M N K per batch;
// causal_attention: 2 B H T^2 D, half of the square being masked; its backward 2.5x that;
// int8_matmul and int8_matmul_ste: 2 M N K), the shares of them at the 16-bit and at the int8
// rate, and its bytes (int8_matmul_ste's: its codes, scales and y; it never reads x and w_fq).
struct NodeCost {
  double flops = 0, flops_16bit = 0, bytes = 0, flops_int8 = 0;
  NodeCost& operator+=(const NodeCost& o) {
    flops += o.flops;
    flops_16bit += o.flops_16bit;
    flops_int8 += o.flops_int8;
    bytes += o.bytes;
    return *this;
  }
  // Milliseconds at `peaks`: the slower of the compute and the memory floor.
  double floor_ms(const DevicePeaks& peaks) const;
};

NodeCost node_cost(const Graph& g, const Node& n);

// The model FLOPs of one language-model training step that MFU counts (PaLM's definition, as
// the bench scripts count them): 6 x parameters x tokens, plus the causal attention's forward
// and backward, 6 x 2 x layers x batch x seq^2 x hidden / 2 (its two products, half the square
// masked, the backward twice the forward). Not the FLOPs the step runs: node_cost counts those.
double llama_model_flops(int64_t parameters, int64_t layers, int64_t batch, int64_t seq,
                         int64_t hidden);

// Per op: measured ms per step (and nodes), and the summed cost of those nodes per step.
struct OpProfile {
  double ms = 0;
  int nodes = 0;
  NodeCost cost;
};

// The table, largest measured time first, with a total row: the step's measured time against
// the sum of its parts' floors.
void print_floor_table(const std::map<std::string, OpProfile>& per_op, const DevicePeaks& peaks);

}  // namespace qg::cli
