#include "ops/common/grad_helpers.h"

namespace qg {

Shape shape_of(const Graph& g, ValueId v) {
  return g.value(v).type.shape;
}

ValueId sum_to_shape(Graph& g, ValueId dy, const Shape& shape) {
  if (shape_of(g, dy) == shape) return dy;
  return g.apply1("sum_to", {dy}, {{"shape", shape}});
}

ValueId broadcast_to_shape(Graph& g, ValueId dy, const Shape& shape) {
  if (shape_of(g, dy) == shape) return dy;
  return g.apply1("broadcast_to", {dy}, {{"shape", shape}});
}

}  // namespace qg
