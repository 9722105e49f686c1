// The graph of the fuse_scaled_softmax tests (tests/passes on the CPU, tests/gpu_fused on the
// GPU): attention's scaled softmax and its gradient.
#pragma once

#include <vector>

#include "autograd/grad.h"
#include "core/graph.h"

namespace qg::testing {

// Inputs "x" and "w" of `shape`; y = softmax(mul(x, scale)) over the last axis (mul(scale, x)
// with `scale_first`); dx = d sum(y * w) / dx. y and dx are named "y" and "dx".
inline void build_scaled_softmax(Graph& g, DType dtype, const Shape& shape, const Tensor& scale,
                                 bool scale_first) {
  ValueId x = g.input("x", {dtype, shape});
  ValueId w = g.input("w", {dtype, shape});
  ValueId s = g.constant(scale, "scale");
  ValueId t =
      g.apply1("mul", scale_first ? std::vector<ValueId>{s, x} : std::vector<ValueId>{x, s});
  ValueId y = g.apply1("softmax", {t}, {{"axis", -1}});
  ValueId dx = grad(g, g.apply1("sum", {g.apply1("mul", {y, w})}), {x})[0];
  g.set_name(y, "y");
  g.set_name(dx, "dx");
}

}  // namespace qg::testing
