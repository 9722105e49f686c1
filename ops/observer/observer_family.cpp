// The observer family: stateful nodes that watch a tensor and emit (scale, zero_point).
#include "ops/observer/observer_defs.h"

namespace qg {

void add_observer_crosscheck(OpRegistry& r);  // observer_crosscheck.cpp

void define_observer_ops(OpRegistry& r) {
  define_minmax_observer(r);
  define_moving_average_observer(r);
  define_percentile_observer(r);
  define_histogram_observer(r);
  add_observer_crosscheck(r);
}

}  // namespace qg
