// The observer family: stateful nodes that watch a tensor and emit (scale, zero_point).
#include "ops/observer/observer_defs.h"

namespace qg {

void add_observer_cuda_kernels(OpRegistry& r);             // observer_cuda.cu
void add_percentile_observer_cuda_kernels(OpRegistry& r);  // percentile_observer_cuda.cu
void add_histogram_observer_cuda_kernels(OpRegistry& r);   // histogram_observer_cuda.cu
void add_observer_crosscheck(OpRegistry& r);               // observer_crosscheck.cpp

void define_observer_ops(OpRegistry& r) {
  define_minmax_observer(r);
  define_moving_average_observer(r);
  define_percentile_observer(r);
  define_histogram_observer(r);
#ifdef QG_WITH_CUDA
  add_observer_cuda_kernels(r);
  add_percentile_observer_cuda_kernels(r);
  add_histogram_observer_cuda_kernels(r);
#endif
  add_observer_crosscheck(r);
}

}  // namespace qg
