// Graph building, autodiff and the op registry: qatgraph.Graph, grad, ops, op_info, run_op.
// Values and nodes are the integer ids the C++ API uses.
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <memory>
#include <mutex>

#include "autograd/grad.h"
#include "bindings.h"
#include "convert.h"
#include "core/graph.h"
#include "core/op_registry.h"
#include "runtime/executor.h"
#include "runtime/op_call.h"

namespace qgpy {
namespace {

qg::TensorType tensor_type(const std::string& dtype, const std::vector<int64_t>& shape) {
  return {qg::dtype_from_name(dtype), shape};
}

nb::dict value_info(const qg::Graph& g, qg::ValueId id) {
  const qg::Value& v = g.value(id);
  nb::dict d;
  d["name"] = v.name;
  d["dtype"] = qg::dtype_name(v.type.dtype);
  d["shape"] = v.type.shape;
  d["producer"] = v.producer;
  d["index"] = v.index;
  return d;
}

nb::dict node_info(const qg::Graph& g, qg::NodeId id) {
  const qg::Node& n = g.node(id);
  nb::dict attrs;
  for (const auto& [k, a] : n.attrs.items()) attrs[k.c_str()] = attr_to_python(a);
  std::vector<std::string> states;
  for (const qg::StateSpec& s : n.states) states.push_back(s.name);
  nb::dict d;
  d["op"] = n.op->name;
  d["name"] = n.name;
  d["inputs"] = n.inputs;
  d["outputs"] = n.outputs;
  d["attrs"] = attrs;
  d["states"] = states;
  d["dead"] = n.dead;
  return d;
}

// The device context run_op calls kernels on: one per device for the process, made on first
// use (its stream, library handles and error buffer live as long as the module).
qg::DeviceContext& op_context(const qg::Device& device) {
  static std::map<std::pair<int, int>, std::unique_ptr<qg::DeviceContext>> contexts;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = contexts[{static_cast<int>(device.type), device.index}];
  if (!slot) slot = qg::make_device_context(device);
  return *slot;
}

// Runs one op's kernel on the given tensors directly (no graph, no executor): a Python-side
// kernel call (qatgraph.torch builds its autograd functions on it). `states` (state name ->
// tensor) seeds the op's persistent state, which otherwise starts as a fresh node's; the
// states after the run come back with the outputs.
nb::tuple run_op(const std::string& op, nb::list inputs, nb::handle attrs,
                 const std::string& device, bool training, nb::handle states,
                 nb::handle framework) {
  const qg::Device dev = parse_device(device);
  std::vector<qg::Tensor> tensors;
  std::vector<qg::TensorType> types;
  for (size_t i = 0; i < inputs.size(); ++i) {
    qg::Tensor t = to_tensor(inputs[i]);
    types.push_back({t.dtype(), t.shape()});
    tensors.push_back(t.device() == dev ? t : t.to(dev));
  }
  qg::PreparedOp prepared(op, to_attrs(attrs), types, dev.type);
  std::vector<qg::Tensor> st = prepared.initial_states(dev);
  const std::vector<qg::StateSpec>& specs = prepared.state_specs();
  if (!states.is_none()) {
    for (auto [key, value] : nb::cast<nb::dict>(states)) {
      const std::string name = nb::cast<std::string>(key);
      size_t k = 0;
      while (k < specs.size() && specs[k].name != name) ++k;
      QG_CHECK(k < specs.size(), op, "has no state '", name, "'");
      qg::Tensor given = to_tensor(value);
      QG_CHECK(given.dtype() == specs[k].type.dtype && given.shape() == specs[k].type.shape, op,
               "state '", name, "' must be ", specs[k].type.str(), ", got ", given.str());
      st[k] = given.to(dev);
    }
  }
  std::vector<qg::Tensor> results;
  {
    nb::gil_scoped_release release;
    qg::DeviceContext& context = op_context(dev);
    results = prepared.run(context, tensors, st, training);
    context.check_errors(nullptr);  // waits; raises what a GPU kernel recorded
  }
  nb::list py_outs;
  for (const qg::Tensor& t : results) py_outs.append(from_tensor(t, framework));
  nb::dict py_states;
  for (size_t i = 0; i < st.size(); ++i)
    py_states[specs[i].name.c_str()] = from_tensor(st[i].clone(), framework);
  return nb::make_tuple(py_outs, py_states);
}

}  // namespace

void bind_graph(nb::module_& m) {
  nb::class_<qg::Graph>(m, "Graph",
                        "A computation graph. Values and nodes are integer ids; ops are applied "
                        "by name with attributes as a dict (see qatgraph.ops()).")
      .def(nb::init<>())
      .def(
          "input",
          [](qg::Graph& g, const std::string& name, const std::string& dtype,
             const std::vector<int64_t>& shape) {
            return g.input(name, tensor_type(dtype, shape));
          },
          nb::arg("name"), nb::arg("dtype"), nb::arg("shape"),
          "A graph input fed by name at run time: input('x', 'f32', [64, 784]).")
      .def(
          "constant",
          [](qg::Graph& g, nb::handle value, const std::string& name) {
            return g.constant(to_tensor(value), name);
          },
          nb::arg("value"), nb::arg("name") = "", "A constant (the value is copied).")
      .def(
          "parameter",
          [](qg::Graph& g, const std::string& name, nb::handle init) {
            return g.parameter(name, to_tensor(init));
          },
          nb::arg("name"), nb::arg("init"),
          "A trainable tensor (floating point) kept as executor state; init is copied.")
      .def(
          "apply",
          [](qg::Graph& g, const std::string& op, const std::vector<qg::ValueId>& inputs,
             nb::handle attrs,
             const std::string& name) { return g.apply(op, inputs, to_attrs(attrs), name); },
          nb::arg("op"), nb::arg("inputs"), nb::arg("attrs") = nb::none(), nb::arg("name") = "",
          "Appends one node; returns its output value ids.")
      .def(
          "apply1",
          [](qg::Graph& g, const std::string& op, const std::vector<qg::ValueId>& inputs,
             nb::handle attrs,
             const std::string& name) { return g.apply1(op, inputs, to_attrs(attrs), name); },
          nb::arg("op"), nb::arg("inputs"), nb::arg("attrs") = nb::none(), nb::arg("name") = "",
          "apply() for single-output ops: returns the output value id.")
      .def("value", &value_info, nb::arg("id"), "name, dtype, shape and producer of a value")
      .def("node", &node_info, nb::arg("id"), "op, name, inputs, outputs, attrs, states of a node")
      .def("set_name", &qg::Graph::set_name, nb::arg("id"), nb::arg("name"),
           "Names a value (fetch and find it by that name).")
      .def("mark_output", &qg::Graph::mark_output, nb::arg("id"),
           "Marks a value as a graph output: kept (not fused away) and fetchable.")
      .def("find", &qg::Graph::find, nb::arg("name"), "value id by name, -1 when absent")
      .def("at", &qg::Graph::at, nb::arg("name"), "value id by name; raises when absent")
      .def("inputs", &qg::Graph::inputs, "the input value ids, in creation order")
      .def("parameters", &qg::Graph::parameters, "the parameter nodes (node ids)")
      .def(
          "parameter_names",
          [](const qg::Graph& g) {
            std::vector<std::string> names;
            for (qg::NodeId n : g.parameters()) names.push_back(g.node(n).name);
            return names;
          },
          "the parameters' names, in creation order")
      .def_prop_ro("num_nodes", &qg::Graph::num_nodes, "nodes ever appended (dead ones included)")
      .def_prop_ro("num_values", &qg::Graph::num_values, "values ever created")
      .def("validate", &qg::Graph::validate,
           "Checks the structure (no dangling input, no use before definition, no cycle); "
           "raises qatgraph.Error.")
      .def("dump", &qg::Graph::dump, "The graph as text, one node per line.")
      .def("__repr__", [](const qg::Graph& g) {
        return "<qatgraph.Graph: " + std::to_string(g.num_live_nodes()) + " nodes, " +
               std::to_string(g.num_values()) + " values>";
      });

  m.def("grad", &qg::grad, nb::arg("graph"), nb::arg("loss"), nb::arg("wrt"),
        "Appends the backward graph of `loss` and returns the gradient value ids of `wrt`.");
  m.def("grad_with_seed", &qg::grad_with_seed, nb::arg("graph"), nb::arg("output"), nb::arg("seed"),
        nb::arg("wrt"),
        "grad() with an explicit seed: appends the backward graph of `output` with incoming "
        "gradient `seed` (a value of output's type) and returns the gradient ids of `wrt`.");

  m.def(
      "ops",
      [] {
        std::vector<std::string> names;
        for (const qg::OpDef* op : qg::OpRegistry::instance().all()) names.push_back(op->name);
        return names;
      },
      "Names of every registered op.");
  m.def(
      "op_info",
      [](const std::string& name) {
        const qg::OpDef& op = qg::OpRegistry::instance().get(name);
        nb::list attrs;
        for (const qg::AttrSpec& a : op.attrs) {
          nb::dict d;
          d["name"] = a.name;
          d["type"] = qg::attr_type_name(a.type);
          d["default"] = a.default_value ? attr_to_python(*a.default_value) : nb::none();
          d["doc"] = a.doc;
          attrs.append(d);
        }
        nb::dict d;
        d["name"] = op.name;
        d["doc"] = op.doc;
        d["inputs"] = op.inputs;
        d["outputs"] = op.outputs;
        d["attrs"] = attrs;
        d["differentiable"] = op.is_differentiable();
        return d;
      },
      nb::arg("name"),
      "An op's schema: name, doc, inputs, outputs, attrs (name, type, default, doc), "
      "differentiable.");
  m.def("run_op", &run_op, nb::arg("op"), nb::arg("inputs"), nb::arg("attrs") = nb::none(),
        nb::arg("device") = "cpu", nb::arg("training") = true, nb::arg("states") = nb::none(),
        nb::arg("framework") = nb::none(),
        "Runs one op on tensors: returns (outputs, states after the run).");
}

}  // namespace qgpy
