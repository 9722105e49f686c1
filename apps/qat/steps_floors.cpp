#include "apps/qat/steps_floors.h"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace qg::cli {
namespace {

double type_bytes(const TensorType& t) {
  return static_cast<double>(t.numel()) * static_cast<double>(dtype_size(t.dtype));
}

bool narrow(DType d) {
  return d == DType::bf16 || d == DType::f16;
}

// 2 M N K per batch: the output's elements times 2 K, K being the reduced axis of a.
double matmul_flops(const Graph& g, const Node& n) {
  const TensorType& a = g.value(n.inputs.at(0)).type;
  const TensorType& y = g.value(n.outputs.at(0)).type;
  if (a.shape.size() < 2) return 0;
  const bool ta = n.attrs.has("transpose_a") && n.attrs.get_bool("transpose_a");
  const int64_t k = ta ? a.shape[a.shape.size() - 2] : a.shape.back();
  return 2.0 * static_cast<double>(y.numel()) * static_cast<double>(k);
}

// q [B, H, T, D]: QK^T and PV over the causal half, 2 x (2 B H T^2 D) / 2.
double attention_flops(const Graph& g, const Node& n) {
  const TensorType& q = g.value(n.inputs.at(0)).type;
  if (q.shape.size() != 4) return 0;
  const double t = static_cast<double>(q.shape[2]);
  return 2.0 * static_cast<double>(q.numel()) * t;
}

}  // namespace

double NodeCost::floor_ms(const DevicePeaks& p) const {
  const double compute = flops_16bit / (p.tflops_16bit * 1e12) + flops_int8 / (p.tops_int8 * 1e12) +
                         (flops - flops_16bit - flops_int8) / (p.tflops_f32 * 1e12);
  const double memory = bytes / (p.gbps * 1e9);
  return 1e3 * std::max(compute, memory);
}

NodeCost node_cost(const Graph& g, const Node& n) {
  NodeCost c;
  const std::string& op = n.op->name;
  const bool int8_gemm = op == "int8_matmul" || op == "int8_matmul_ste";
  // int8_matmul_ste's first two inputs are there for its backward only.
  const size_t first_read = op == "int8_matmul_ste" ? 2 : 0;
  for (size_t i = first_read; i < n.inputs.size(); ++i)
    c.bytes += type_bytes(g.value(n.inputs[i]).type);
  // A node that aliases its input (reshape, an in-place bucket) writes nothing new.
  if (!n.op->aliases_input)
    for (ValueId v : n.outputs) c.bytes += type_bytes(g.value(v).type);
  for (const StateSpec& s : n.states) c.bytes += 2 * type_bytes(s.type);
  if (op == "reshape" || op == "constant" || op == "input" || op == "parameter" || op == "variable")
    c.bytes = 0;
  if (op == "matmul" || op == "batched_matmul") c.flops = matmul_flops(g, n);
  if (op == "causal_attention") c.flops = attention_flops(g, n);
  if (op == "causal_attention_backward") c.flops = 2.5 * attention_flops(g, n);
  if (int8_gemm) {
    const TensorType& y = g.value(n.outputs.at(0)).type;
    c.flops = c.flops_int8 =
        2.0 * static_cast<double>(y.numel()) *
        static_cast<double>(g.value(n.inputs.at(first_read)).type.shape.back());
  } else if (c.flops > 0 && narrow(g.value(n.inputs.at(0)).type.dtype)) {
    c.flops_16bit = c.flops;
  }
  return c;
}

void print_floor_table(const std::map<std::string, OpProfile>& per_op, const DevicePeaks& peaks) {
  std::vector<std::pair<std::string, OpProfile>> rows(per_op.begin(), per_op.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  double ms = 0, floor = 0;
  for (const auto& [op, p] : rows) {
    ms += p.ms;
    floor += p.cost.floor_ms(peaks);
  }
  std::printf(
      "  floors (peaks: %.0f TFLOP/s 16-bit, %.0f TOP/s int8, %.0f TFLOP/s f32, %.0f GB/s; FLOPs "
      "of GEMMs and attention, bytes of every input, output and state):\n",
      peaks.tflops_16bit, peaks.tops_int8, peaks.tflops_f32, peaks.gbps);
  std::printf("    %-32s %6s %10s %10s %9s %10s %9s\n", "op", "nodes", "ms", "floor ms", "x floor",
              "GFLOP", "GB");
  for (const auto& [op, p] : rows) {
    const double f = p.cost.floor_ms(peaks);
    std::printf("    %-32s %6d %10.3f %10.4f %9.2f %10.4g %9.4g\n", op.c_str(), p.nodes, p.ms, f,
                f > 0 ? p.ms / f : 0.0, p.cost.flops / 1e9, p.cost.bytes / 1e9);
  }
  std::printf("    %-32s %6s %10.3f %10.3f %9.2f\n", "step (sum of the parts)", "", ms, floor,
              floor > 0 ? ms / floor : 0.0);
}

double llama_model_flops(int64_t parameters, int64_t layers, int64_t batch, int64_t seq,
                         int64_t hidden) {
  const double tokens = static_cast<double>(batch) * static_cast<double>(seq);
  const double attention = 6.0 * 2.0 * static_cast<double>(layers) * static_cast<double>(batch) *
                           static_cast<double>(seq) * static_cast<double>(seq) *
                           static_cast<double>(hidden) / 2.0;
  return 6.0 * static_cast<double>(parameters) * tokens + attention;
}

}  // namespace qg::cli
