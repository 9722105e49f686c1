// Registers every family's CUDA kernels (built only with CUDA). One line per family, as in
// ops/op_table.cpp. Every CUDA kernel is then wrapped in one device check, so a tensor on
// the wrong device (or inputs spread over several devices) is a qg::Error naming the op,
// never a kernel dereferencing host memory.
#ifdef QG_WITH_CUDA
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/graph.h"
#include "core/op_registry.h"

namespace qg {

void add_graph_io_cuda_kernels(OpRegistry&);
void add_arith_cuda_kernels(OpRegistry&);
void add_linalg_cuda_kernels(OpRegistry&);
void add_activation_cuda_kernels(OpRegistry&);
void add_reduce_cuda_kernels(OpRegistry&);
void add_loss_cuda_kernels(OpRegistry&);
void add_fake_quantize_cuda_kernels(OpRegistry&);
void add_observer_cuda_kernels(OpRegistry&);
void add_lsq_cuda_kernels(OpRegistry&);
void add_quantize_cuda_kernels(OpRegistry&);
void add_dynamic_quant_cuda_kernels(OpRegistry&);
void add_int4_cuda_kernels(OpRegistry&);
void add_nf4_cuda_kernels(OpRegistry&);
void add_percentile_observer_cuda_kernels(OpRegistry&);
void add_histogram_observer_cuda_kernels(OpRegistry&);
void add_fused_cuda_kernels(OpRegistry&);
void add_fused_ste_backward_cuda_kernels(OpRegistry&);
void add_fused_ste_optimizer_cuda_kernels(OpRegistry&);
void add_fused_ste_chain_cuda_kernels(OpRegistry&);
void add_fused_ste_producer_cuda_kernels(OpRegistry&);
void add_optim_cuda_kernels(OpRegistry&);
void add_norm_cuda_kernels(OpRegistry&);
void add_channel_div_bn_cuda_kernels(OpRegistry&);
void add_pool_cuda_kernels(OpRegistry&);
void add_dropout_cuda_kernels(OpRegistry&);
void add_softmax_cuda_kernels(OpRegistry&);
void add_embedding_cuda_kernels(OpRegistry&);
void add_shape_cuda_kernels(OpRegistry&);
void add_conv_cuda_kernels(OpRegistry&);
void add_fold_cuda_kernels(OpRegistry&);

namespace {

// Every defined input and state must sit on the one CUDA device the op runs on: inputs
// spread over several devices are "mixed devices"; inputs all on the host (or on another
// device than the outputs the executor allocated) are "on the wrong device". Source ops
// allocate their outputs on the host and hand out states, so they are exempt.
void check_devices(const KernelContext& ctx) {
  std::set<std::pair<int, int>> inputs;
  std::ostringstream where;
  auto key = [](const Tensor& t) {
    return std::make_pair(static_cast<int>(t.device().type), t.device().index);
  };
  const OpDef& op = *ctx.node.op;
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    const Tensor& t = ctx.inputs[i];
    if (!t.defined()) continue;
    inputs.insert(key(t));
    where << " input '" << (i < op.inputs.size() ? op.inputs[i] : std::to_string(i)) << "' "
          << t.str() << ";";
  }
  for (size_t i = 0; i < ctx.states.size(); ++i) {
    const Tensor& t = ctx.states[i];
    if (!t.defined()) continue;
    inputs.insert(key(t));
    where << " state '" << (i < ctx.node.states.size() ? ctx.node.states[i].name : "?") << "' "
          << t.str() << ";";
  }
  if (inputs.size() > 1)
    QG_FAIL(ctx.op,
            "mixed devices in one op (every tensor must be on one CUDA device):", where.str());
  std::set<std::pair<int, int>> outputs;
  for (const Tensor& t : ctx.outputs)
    if (t.defined()) outputs.insert(key(t));
  bool host_input = !inputs.empty() && inputs.begin()->first == static_cast<int>(DeviceType::cpu);
  bool elsewhere = !inputs.empty() && !outputs.empty() && inputs != outputs;
  if (host_input || elsewhere || outputs.size() > 1) {
    for (const Tensor& t : ctx.outputs) where << " output " << t.str() << ";";
    QG_FAIL(ctx.op, "tensor on the wrong device for this CUDA kernel:", where.str());
  }
}

void wrap_with_device_check(OpRegistry& r) {
  for (const OpDef* def : r.all()) {
    OpDef& op = r.get_mutable(def->name);
    if (op.is_source) continue;
    for (KernelDef& k : op.kernels) {
      if (k.device != DeviceType::cuda) continue;
      KernelFn inner = k.fn;
      k.fn = [inner](KernelContext& ctx) {
        check_devices(ctx);
        inner(ctx);
      };
    }
  }
}

}  // namespace

void add_cuda_kernels(OpRegistry& r) {
  add_graph_io_cuda_kernels(r);
  add_arith_cuda_kernels(r);
  add_linalg_cuda_kernels(r);
  add_activation_cuda_kernels(r);
  add_reduce_cuda_kernels(r);
  add_loss_cuda_kernels(r);
  add_fake_quantize_cuda_kernels(r);
  add_observer_cuda_kernels(r);
  add_lsq_cuda_kernels(r);
  add_quantize_cuda_kernels(r);
  add_dynamic_quant_cuda_kernels(r);
  add_int4_cuda_kernels(r);
  add_nf4_cuda_kernels(r);
  add_percentile_observer_cuda_kernels(r);
  add_histogram_observer_cuda_kernels(r);
  add_fused_cuda_kernels(r);
  add_fused_ste_backward_cuda_kernels(r);
  add_fused_ste_optimizer_cuda_kernels(r);
  add_fused_ste_chain_cuda_kernels(r);
  add_fused_ste_producer_cuda_kernels(r);
  add_optim_cuda_kernels(r);
  add_norm_cuda_kernels(r);
  add_channel_div_bn_cuda_kernels(r);
  add_pool_cuda_kernels(r);
  add_dropout_cuda_kernels(r);
  add_softmax_cuda_kernels(r);
  add_embedding_cuda_kernels(r);
  add_shape_cuda_kernels(r);
  add_conv_cuda_kernels(r);
  add_fold_cuda_kernels(r);
  wrap_with_device_check(r);
}

}  // namespace qg
#endif
