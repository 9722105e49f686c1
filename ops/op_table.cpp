// The one table of op families. Adding a family means adding its folder and one row here:
// the folder's define_<family>_ops declares its ops and registers the kernels of every
// backend (its CUDA kernels when built with CUDA). OpRegistry::self_check() then verifies
// every op (backward rules, gradient-check samples, CPU reference kernels, CUDA coverage).
#include "core/op_registry.h"

namespace qg {
namespace {

struct OpFamily {
  const char* folder;
  void (*define)(OpRegistry&);
};

}  // namespace

// A row: the folder and a call of its define_<folder>_ops, declared in the row itself so
// that the row is the only line a new family adds here. (Outside the unnamed namespace: a
// function declared in a block belongs to the enclosing namespace, which must be qg.)
// clang-format off
#define QG_OP_FAMILY(folder)                 \
  {#folder, [](OpRegistry& r) {              \
     void define_##folder##_ops(OpRegistry&); \
     define_##folder##_ops(r);                \
   }}

// In registration order; the size is deduced.
constexpr OpFamily kOpFamilies[] = {
    QG_OP_FAMILY(graph_io),
    QG_OP_FAMILY(arith),
    QG_OP_FAMILY(linalg),
    QG_OP_FAMILY(int8_matmul),
    QG_OP_FAMILY(activation),
    QG_OP_FAMILY(reduce),
    QG_OP_FAMILY(loss),
    QG_OP_FAMILY(fake_quantize),
    QG_OP_FAMILY(observer),
    QG_OP_FAMILY(lsq),
    QG_OP_FAMILY(quantize),
    QG_OP_FAMILY(dynamic_quant),
    QG_OP_FAMILY(dynamic_fake_quantize),
    QG_OP_FAMILY(int4),
    QG_OP_FAMILY(nf4),
    QG_OP_FAMILY(optim),
    QG_OP_FAMILY(fused),
    QG_OP_FAMILY(norm),
    QG_OP_FAMILY(rms_norm),
    QG_OP_FAMILY(rope),
    QG_OP_FAMILY(attention),
    QG_OP_FAMILY(pool),
    QG_OP_FAMILY(dropout),
    QG_OP_FAMILY(softmax),
    QG_OP_FAMILY(embedding),
    QG_OP_FAMILY(shape),
    QG_OP_FAMILY(conv),
    QG_OP_FAMILY(fold),
    QG_OP_FAMILY(cast),
    QG_OP_FAMILY(collective),
};
// clang-format on

#undef QG_OP_FAMILY

void register_all_ops(OpRegistry& registry) {
  for (const OpFamily& family : kOpFamilies) family.define(registry);
}

}  // namespace qg
