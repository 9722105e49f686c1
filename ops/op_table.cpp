// The one table of op families. Adding a family means adding its folder and one row here:
// the folder's define_<family>_ops declares its ops and registers the kernels of every
// backend (its CUDA kernels when built with CUDA). OpRegistry::self_check() then verifies
// every op (backward rules, gradient-check samples, CPU reference kernels, CUDA coverage).
#include "core/op_registry.h"

// One row per family, in registration order: X(folder) stands for define_<folder>_ops.
// (A macro so that the row also declares the function: one line per family, nothing else.)
#define QG_OP_FAMILIES(X) \
  X(graph_io)             \
  X(arith)                \
  X(linalg)               \
  X(activation)           \
  X(reduce)               \
  X(loss)                 \
  X(fake_quantize)        \
  X(observer)             \
  X(lsq)                  \
  X(quantize)             \
  X(dynamic_quant)        \
  X(int4)                 \
  X(nf4)                  \
  X(optim)                \
  X(fused)                \
  X(norm)                 \
  X(pool)                 \
  X(dropout)              \
  X(softmax)              \
  X(embedding)            \
  X(shape)                \
  X(conv)                 \
  X(fold)

namespace qg {

#define QG_DECLARE_FAMILY(folder) void define_##folder##_ops(OpRegistry&);
QG_OP_FAMILIES(QG_DECLARE_FAMILY)
#undef QG_DECLARE_FAMILY

namespace {
struct OpFamily {
  const char* folder;
  void (*define)(OpRegistry&);
};

#define QG_FAMILY_ROW(folder) {#folder, define_##folder##_ops},
constexpr OpFamily kOpFamilies[] = {QG_OP_FAMILIES(QG_FAMILY_ROW)};
#undef QG_FAMILY_ROW
}  // namespace

void register_all_ops(OpRegistry& registry) {
  for (const OpFamily& family : kOpFamilies) family.define(registry);
}

}  // namespace qg
