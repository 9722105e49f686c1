// Moving a trained model's state between graphs, and conversion to integer weights as a
// pass over a model's forward graph (torch.ao's convert):
//   * each weight quantizer's fake-quant chain is replaced by constant integer codes and the
//     storage format's dequantize op: int8 codes (i8) + dequantize, packed INT4 (int4, and
//     int2 codes in nibbles: there is no 2-bit storage op) +
//     int4_unpack_dequantize, packed NF4 + nf4_unpack_dequantize. The codes come from the
//     weight and qparams the fake-quant graph computes in eval mode, so the converted graph
//     reads exactly the fake-quantized weights;
//   * each folded conv-bn's batch norm becomes a per-channel bias (eval-mode folding: the
//     weight codes already hold gamma / sqrt(running_var + eps); the bias is
//     beta - running_mean * gamma / sqrt(running_var + eps));
//   * activation quantizers stay, with their observers frozen (eval mode), and dynamic
//     per-token quantizers stay dynamic.
// Model bytes are read from the converted graph: every parameter and constant the logits
// need, plus each live observer's qparams (f32 scale + i32 zero point).
#pragma once

#include <memory>
#include <vector>

#include "nn/llama.h"
#include "nn/model.h"
#include "runtime/executor.h"

namespace qg::nn {

// Copies every node state of `to`'s graph (parameters, buffers, observer statistics, flags;
// constants excluded) from the node of the same name in `from`'s graph. Throws when one is
// missing there or differs in dtype/shape.
void copy_states(Executor& from, Executor& to);

// One forward-only instance of a model at a given batch, with its own executor.
struct ModelInstance {
  std::unique_ptr<Graph> graph;
  Model model;
  std::unique_ptr<Executor> exec;
};
// Builds `spec` at `batch` rows (seed irrelevant once states are copied in) on `device`.
ModelInstance build_instance(ModelSpec spec, int64_t batch, const QConfig& qconfig, Device device);

// The conversion pass on an instance whose states hold a trained model (modifies its graph
// and rebuilds its executor). Returns the model bytes.
int64_t convert_to_integer(ModelInstance& inst, const QConfig& qconfig);

// The same for a Llama decoder (nn/llama.h): every projection and an untied lm_head get
// integer weight codes (8da4w, 8da3w, 8da2w: packed INT4 nibbles per group; w8a8_dynamic:
// int8 per channel; int4_weight_only: unsigned INT4 nibbles per group with the group's float
// zero added after the dequantize, nn/convert_float_zero.h) and their dequantize op, and the
// dynamic per-token activation quantizers stay as they are, so the converted logits equal the
// QAT model's eval-mode logits bit for bit. A quantized token embedding
// (QConfig::embedding_weight) becomes its codes the same way (packed INT4 nibbles or int8, one
// scale per group along the hidden dim) with its dequantize op before the gather; a float one
// stays float. A float zero point on weights stored in other than f32 is a named error.
// Under the integer forward (QConfig::integer_forward) each projection's int8_matmul_ste
// becomes int8_matmul on constant weight codes and scales (codes of <= 4 bits stored as packed
// INT4 nibbles and unpacked to int8 for the GEMM; int8 codes as they are), so the converted
// logits equal the QAT model's bit for bit on the CPU and on the GPU alike.
struct LlamaInstance {
  std::unique_ptr<Graph> graph;
  LlamaModel model;
  std::unique_ptr<Executor> exec;
};
LlamaInstance build_llama_instance(const LlamaConfig& config, int64_t batch, int64_t seq,
                                   const QConfig& qconfig, Device device,
                                   const PrecisionPolicy& precision = PrecisionPolicy::f32());
int64_t convert_to_integer(LlamaInstance& inst, const QConfig& qconfig);

}  // namespace qg::nn
