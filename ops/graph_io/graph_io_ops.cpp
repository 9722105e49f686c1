// Source and plumbing ops: graph inputs (fed by name), constants, parameters and variables
// (persistent state), stop_gradient, and full_like (gradient seeds and zero gradients).
#include "core/op_registry.h"

#include "core/error.h"
#include "core/graph.h"
#include "ops/common/schema_helpers.h"
#include "ops/graph_io/graph_io_args.h"

namespace qg {
namespace {

std::vector<TensorType> no_infer(const InferContext& ctx) {
  QG_FAIL(ctx.op, "source ops are created by Graph::input/constant/parameter");
}

void define_input(OpRegistry& r) {
  OpDef& op = r.define("input");
  op.doc = "A graph input, fed by name at run time.";
  op.outputs = {"value"};
  op.attrs = {string_attr("dtype", std::nullopt, {}, "declared dtype"),
              ints_attr("shape", std::nullopt, "declared shape")};
  op.is_source = true;
  op.infer = no_infer;
  op.parse_args = no_kernel_args;  // the declared type is the output's
  op.kernels.push_back({DeviceType::cpu, {}, [](KernelContext& ctx) {
                          QG_CHECK(ctx.feed != nullptr && ctx.feed->defined(), "input",
                                   "missing graph input '", ctx.label(), "': it was not fed");
                          const Tensor& f = *ctx.feed;
                          const Tensor& decl = ctx.outputs[0];
                          QG_CHECK(f.dtype() == decl.dtype() && f.shape() == decl.shape(), "input",
                                   "graph input '", ctx.label(), "' is declared ",
                                   dtype_name(decl.dtype()), shape_str(decl.shape()),
                                   " but was fed ", dtype_name(f.dtype()), shape_str(f.shape()));
                          ctx.outputs[0] = f;
                        }});
}

// Constants and parameters hand out their state tensor (uploaded once to the device).
void hand_out_state(KernelContext& ctx) {
  ctx.outputs[0] = ctx.states.at(0);
}

void define_constant(OpRegistry& r) {
  OpDef& op = r.define("constant");
  op.doc = "A constant tensor, uploaded once to the executor's device.";
  op.outputs = {"value"};
  op.is_source = true;
  op.infer = no_infer;
  op.kernels.push_back({DeviceType::cpu, {}, hand_out_state});
}

void define_parameter(OpRegistry& r) {
  OpDef& op = r.define("parameter");
  op.doc = "A trainable tensor held as persistent state; optimizers update it in place.";
  op.outputs = {"value"};
  op.is_source = true;
  op.infer = no_infer;
  op.kernels.push_back({DeviceType::cpu, {}, hand_out_state});
}

void define_variable(OpRegistry& r) {
  OpDef& op = r.define("variable");
  op.doc =
      "A persistent tensor that is not trained; the caller writes it between runs (the "
      "optimizer's learning rate).";
  op.outputs = {"value"};
  op.is_source = true;
  op.infer = no_infer;
  op.kernels.push_back({DeviceType::cpu, {}, hand_out_state});
}

void define_stop_gradient(OpRegistry& r) {
  OpDef& op = r.define("stop_gradient");
  op.doc = "Identity in the forward pass; no gradient flows through it.";
  op.aliases_input = true;
  op.inputs = {"x"};
  op.outputs = {"y"};
  op.infer = [](const InferContext& ctx) { return same_as_input(ctx); };
  op.kernels.push_back(
      {DeviceType::cpu, {}, [](KernelContext& ctx) { ctx.outputs[0] = ctx.inputs[0]; }});
}

void define_full_like(OpRegistry& r) {
  OpDef& op = r.define("full_like");
  op.doc = "A tensor shaped and typed like x, filled with `value` (x's data is not read).";
  op.inputs = {"x"};
  op.outputs = {"y"};
  op.attrs = {real_attr("value", 0.0, "fill value")};
  op.infer = [](const InferContext& ctx) { return same_as_input(ctx); };
  op.parse_args = [](const ArgsSource& s) -> std::shared_ptr<const KernelArgs> {
    auto args = std::make_shared<FullLikeArgs>();
    args->value = s.attrs.get_real("value");
    return args;
  };
  op.kernels.push_back({DeviceType::cpu, {}, [](KernelContext& ctx) {
                          ctx.outputs[0].fill(ctx.args<FullLikeArgs>().value);
                        }});
}

}  // namespace

void add_graph_io_cuda_kernels(OpRegistry& r);  // graph_io_cuda.cu

void define_graph_io_ops(OpRegistry& r) {
  define_input(r);
  define_constant(r);
  define_parameter(r);
  define_variable(r);
  define_stop_gradient(r);
  define_full_like(r);
#ifdef QG_WITH_CUDA
  add_graph_io_cuda_kernels(r);
#endif
}

}  // namespace qg
