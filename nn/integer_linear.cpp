// The integer forward of a linear (QConfig::integer_forward):
//
//   x ─► dynamic_fake_quantize ─► x_fq ─► (cast) ─► x_compute ─┐   (the backward's operands,
//          ├► a_scale, a_zero                                   │    as in the float forward)
//   x ─► quantize(a_scale, a_zero) ─► a codes (i8) ────────────┤
//   W ─► dynamic_fake_quantize ─► W_fq ─► (cast) ─► W_compute ─┤
//          └► w_scale, w_zero (0)                               ├─► int8_matmul_ste ─► y
//   W ─► quantize(w_scale, w_zero) ─► w codes (i8) ────────────┘
//
// quantize computes clamp(rint(v * (1 / scale)) + zero_point) in the math type, the code
// dynamic_fake_quantize's integer modes dequantize, from the same qparams: so the codes are
// exactly the ones the fake-quant operands stand for, and the mask of the STE is theirs.
#include "core/error.h"
#include "nn/builder.h"

namespace qg::nn {

ValueId Builder::integer_matmul(ValueId operand, ValueId x_compute, ValueId w_compute,
                                const std::string& name) {
  QG_CHECK(!weights_.empty() && weights_.back().layer == name, "nn.linear", "layer '", name,
           "': the integer forward needs the layer's weight quantizer");
  WeightQuantizer& wq = weights_.back();
  const NodeId act = g_.value(operand).producer;
  QG_CHECK(act >= 0 && g_.node(act).op->name == "dynamic_fake_quantize", "nn.linear", "layer '",
           name,
           "': the integer forward needs a per-token dynamic_fake_quantize on a 2-D or 3-D "
           "input; its operand comes from ",
           act >= 0 ? g_.node(act).op->name : std::string("no node"));
  // Copies, not references: the applies below grow the graph's node table.
  const ValueId x_src = g_.node(act).inputs[0], a_scale = g_.node(act).outputs[2],
                a_zero = g_.node(act).outputs[3];
  auto cached = operand_codes_.find(operand);
  ValueId a_codes;
  if (cached != operand_codes_.end()) {
    a_codes = cached->second;
  } else {
    Attrs a{{"quant_min", -128},
            {"quant_max", 127},
            {"scope", std::string("channel")},
            {"axis", 0},
            {"out_dtype", std::string("i8")}};
    a_codes = g_.apply("quantize", {x_src, a_scale, a_zero}, a, name + ".in.codes")[0];
    operand_codes_[operand] = a_codes;
  }
  const Node& wd = g_.node(wq.observer);
  const ValueId w_scale = wd.outputs[2], w_zero = wd.outputs[3];
  const int64_t group = wd.attrs.get_int("group_size");
  const int64_t bits = qc_.weight_bits();
  Attrs wa{{"quant_min", -(int64_t{1} << (bits - 1))},
           {"quant_max", (int64_t{1} << (bits - 1)) - 1},
           {"out_dtype", std::string("i8")}};
  if (group == 0) {
    wa.set("scope", std::string("channel"));
    wa.set("axis", 0);
  } else {
    wa.set("scope", std::string("group"));
    wa.set("axis", 1);
    wa.set("group_size", group);
  }
  const ValueId w_codes =
      g_.apply("quantize", {wq.source, w_scale, w_zero}, wa, name + ".weight.codes")[0];
  const ValueId y = g_.apply1("int8_matmul_ste",
                              {x_compute, w_compute, a_codes, a_scale, a_zero, w_codes, w_scale},
                              {{"group_size", group}}, name + ".int8_matmul");
  wq.integer_gemm = g_.value(y).producer;
  return y;
}

}  // namespace qg::nn
