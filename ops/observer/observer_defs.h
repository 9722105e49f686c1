// The observer family's op definitions, one function per op (each in its own file), and
// the family entry point listed in ops/op_table.cpp.
#pragma once

#include "core/op_registry.h"

namespace qg {

void define_minmax_observer(OpRegistry& r);
void define_moving_average_observer(OpRegistry& r);
void define_percentile_observer(OpRegistry& r);
void define_histogram_observer(OpRegistry& r);

}  // namespace qg
