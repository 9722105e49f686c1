#include "autograd/grad.h"

#include <map>

#include "core/error.h"

namespace qg {

namespace {

// An integer value (quantized storage) receives a floating gradient of its own shape: the
// straight-through path quantize -> dequantize carries real-valued gradients through it.
bool gradient_type_ok(const TensorType& value, const TensorType& g) {
  return value == g || (is_integral(value.dtype) && is_floating(g.dtype) && value.shape == g.shape);
}

ValueId sum_contributions(Graph& g, const std::vector<ValueId>& parts) {
  ValueId acc = parts.at(0);
  for (size_t i = 1; i < parts.size(); ++i)
    acc = g.apply1("add", {acc, parts[i]}, {}, "grad_accumulate");
  return acc;
}

std::vector<ValueId> reverse_mode(Graph& g, ValueId output, ValueId seed,
                                  const std::vector<ValueId>& wrt, GradientMap* value_grads) {
  const std::vector<NodeId> order = g.topological_order();
  QG_CHECK(gradient_type_ok(g.value(output).type, g.value(seed).type), "grad", "seed ",
           g.value(seed).type.str(), " does not match the output ", g.value(output).type.str());
  for (ValueId w : wrt)
    QG_CHECK(is_floating(g.value(w).type.dtype), "grad",
             "cannot differentiate with respect to value ", w, " of dtype ",
             dtype_name(g.value(w).type.dtype));

  // 1. Forward: which values depend differentiably on some `wrt`.
  std::vector<bool> requires_grad(g.num_values(), false);
  for (ValueId w : wrt) requires_grad[w] = true;
  for (NodeId id : order) {
    const Node& n = g.node(id);
    if (!n.op->is_differentiable()) continue;
    bool any = false;
    for (size_t i = 0; i < n.inputs.size(); ++i)
      any = any || (n.op->differentiable_inputs[i] && requires_grad[n.inputs[i]]);
    if (any)
      for (ValueId out : n.outputs) requires_grad[out] = true;
  }

  // 2. Backward over the forward nodes in reverse order, accumulating contributions.
  std::map<ValueId, std::vector<ValueId>> contributions;
  contributions[output].push_back(seed);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const Node node = g.node(*it);  // copy: the graph grows below
    if (!node.op->is_differentiable()) continue;
    std::vector<ValueId> out_grads(node.outputs.size(), kNoValue);
    bool any_out = false;
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      auto c = contributions.find(node.outputs[i]);
      if (c == contributions.end()) continue;
      out_grads[i] = sum_contributions(g, c->second);
      c->second = {out_grads[i]};
      if (value_grads) (*value_grads)[node.outputs[i]] = out_grads[i];
      any_out = true;
    }
    std::vector<bool> needs(node.inputs.size(), false);
    bool any_in = false;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      needs[i] = node.op->differentiable_inputs[i] && requires_grad[node.inputs[i]];
      any_in = any_in || needs[i];
    }
    if (!any_out || !any_in) continue;
    BackwardContext ctx{g, node, out_grads, needs};
    std::vector<ValueId> in_grads = node.op->backward(ctx);
    QG_CHECK(in_grads.size() == node.inputs.size(), node.op->name, "backward rule returned ",
             in_grads.size(), " gradients for ", node.inputs.size(), " inputs");
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      if (!needs[i] || in_grads[i] == kNoValue) continue;
      const TensorType& want = g.value(node.inputs[i]).type;
      const TensorType& got = g.value(in_grads[i]).type;
      QG_CHECK(gradient_type_ok(want, got), node.op->name, "backward rule gave a ", got.str(),
               " gradient for input '", node.op->inputs[i], "' of type ", want.str());
      contributions[node.inputs[i]].push_back(in_grads[i]);
    }
  }

  // 3. One gradient per `wrt`.
  std::vector<ValueId> result;
  for (ValueId w : wrt) {
    auto c = contributions.find(w);
    result.push_back(c == contributions.end() ? g.apply1("full_like", {w}, {{"value", 0.0}})
                                              : sum_contributions(g, c->second));
  }
  return result;
}

ValueId loss_seed(Graph& g, ValueId loss) {
  QG_CHECK(is_floating(g.value(loss).type.dtype), "grad", "the loss must be floating point, got ",
           g.value(loss).type.str());
  return g.apply1("full_like", {loss}, {{"value", 1.0}}, "grad_seed");
}

}  // namespace

std::vector<ValueId> grad_with_seed(Graph& g, ValueId output, ValueId seed,
                                    const std::vector<ValueId>& wrt) {
  return reverse_mode(g, output, seed, wrt, nullptr);
}

std::vector<ValueId> grad(Graph& g, ValueId loss, const std::vector<ValueId>& wrt) {
  return reverse_mode(g, loss, loss_seed(g, loss), wrt, nullptr);
}

std::vector<ValueId> grad_with_value_grads(Graph& g, ValueId loss, const std::vector<ValueId>& wrt,
                                           GradientMap& value_grads) {
  return reverse_mode(g, loss, loss_seed(g, loss), wrt, &value_grads);
}

}  // namespace qg
