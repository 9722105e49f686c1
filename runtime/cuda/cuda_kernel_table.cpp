// Registers every family's CUDA kernels (built only with CUDA). One line per family, as in
// ops/op_table.cpp.
#ifdef QG_WITH_CUDA
#include "core/op_registry.h"

namespace qg {

void add_graph_io_cuda_kernels(OpRegistry&);
void add_optim_cuda_kernels(OpRegistry&);

void add_cuda_kernels(OpRegistry& r) {
  add_graph_io_cuda_kernels(r);
  add_optim_cuda_kernels(r);
}

}  // namespace qg
#endif
