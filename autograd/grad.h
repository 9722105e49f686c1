// Reverse-mode autodiff as graph rewriting: grad() appends the backward graph built from
// each op's registered backward rule and returns the gradient values.
#pragma once

#include <map>
#include <vector>

#include "core/graph.h"

namespace qg {

// Gradients of `loss` (seeded with ones of its shape) with respect to each of `wrt`.
// Fan-out contributions are summed with `add` nodes; ops that are not differentiable and
// `stop_gradient` block the flow; a `wrt` the loss does not depend on gets zeros.
std::vector<ValueId> grad(Graph& graph, ValueId loss, const std::vector<ValueId>& wrt);

// As above with an explicit seed (the gradient of `output`), for vector-Jacobian products.
std::vector<ValueId> grad_with_seed(Graph& graph, ValueId output, ValueId seed,
                                    const std::vector<ValueId>& wrt);

// Forward value -> the value holding its whole (summed) gradient.
using GradientMap = std::map<ValueId, ValueId>;

// grad(), also filling `value_grads` with the gradient of every output of a differentiable
// node that got one (activation recomputation orders its work after them).
std::vector<ValueId> grad_with_value_grads(Graph& graph, ValueId loss,
                                           const std::vector<ValueId>& wrt,
                                           GradientMap& value_grads);

}  // namespace qg
