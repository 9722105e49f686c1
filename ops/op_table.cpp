// The one table of op families. Adding a family means adding its folder and one row here;
// OpRegistry::self_check() then verifies every op it defines (backward rules, gradient-check
// samples, CPU reference kernels).
#include "core/op_registry.h"

namespace qg {

void define_graph_io_ops(OpRegistry&);
void define_arith_ops(OpRegistry&);
void define_linalg_ops(OpRegistry&);
void define_activation_ops(OpRegistry&);
void define_reduce_ops(OpRegistry&);
void define_loss_ops(OpRegistry&);
void define_fake_quantize_ops(OpRegistry&);
void define_observer_ops(OpRegistry&);
void define_lsq_ops(OpRegistry&);
void define_quantize_ops(OpRegistry&);
void define_dynamic_quant_ops(OpRegistry&);
void define_int4_ops(OpRegistry&);
void define_nf4_ops(OpRegistry&);
void define_optim_ops(OpRegistry&);
void define_fused_ops(OpRegistry&);
void define_norm_ops(OpRegistry&);
void define_pool_ops(OpRegistry&);
void define_dropout_ops(OpRegistry&);
void define_softmax_ops(OpRegistry&);
void define_embedding_ops(OpRegistry&);
void define_shape_ops(OpRegistry&);
void define_conv_ops(OpRegistry&);
void define_fold_ops(OpRegistry&);

#ifdef QG_WITH_CUDA
void add_cuda_kernels(OpRegistry&);  // runtime/cuda: registers every family's CUDA kernels
#endif

namespace {
struct OpFamily {
  const char* folder;
  void (*define)(OpRegistry&);
};

// Size deduced, so adding a row is the only edit.
constexpr OpFamily kOpFamilies[] = {
    {"graph_io", define_graph_io_ops},
    {"arith", define_arith_ops},
    {"linalg", define_linalg_ops},
    {"activation", define_activation_ops},
    {"reduce", define_reduce_ops},
    {"loss", define_loss_ops},
    {"fake_quantize", define_fake_quantize_ops},
    {"observer", define_observer_ops},
    {"lsq", define_lsq_ops},
    {"quantize", define_quantize_ops},
    {"dynamic_quant", define_dynamic_quant_ops},
    {"int4", define_int4_ops},
    {"nf4", define_nf4_ops},
    {"optim", define_optim_ops},
    {"fused", define_fused_ops},
    {"norm", define_norm_ops},
    {"pool", define_pool_ops},
    {"dropout", define_dropout_ops},
    {"softmax", define_softmax_ops},
    {"embedding", define_embedding_ops},
    {"shape", define_shape_ops},
    {"conv", define_conv_ops},
    {"fold", define_fold_ops},
};
}  // namespace

void register_all_ops(OpRegistry& registry) {
  for (const OpFamily& family : kOpFamilies) family.define(registry);
#ifdef QG_WITH_CUDA
  add_cuda_kernels(registry);
#endif
}

}  // namespace qg
