// Helpers for backward rules, which emit ordinary graph nodes.
#pragma once

#include "core/graph.h"

namespace qg {

// dy reduced (summed over broadcast dimensions) to `shape`; dy itself when shapes match.
ValueId sum_to_shape(Graph& g, ValueId dy, const Shape& shape);
// dy broadcast to `shape`; dy itself when shapes match.
ValueId broadcast_to_shape(Graph& g, ValueId dy, const Shape& shape);
// By value: the graph's value table grows (and moves) while backward rules add nodes.
Shape shape_of(const Graph& g, ValueId v);

}  // namespace qg
