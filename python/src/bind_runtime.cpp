// qatgraph.Executor: runs a graph on the CPU or CUDA backend, feeds by name, fetches by
// value id or name, keeps parameters and observer statistics as persistent state.
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <set>
#include "bindings.h"
#include "convert.h"

#include "core/thread_pool.h"
#include "runtime/backend.h"
#include "runtime/compile.h"
#include "runtime/executor.h"

namespace qgpy {
namespace {

qg::Executor::Feeds to_feeds(const nb::dict& feeds) {
  qg::Executor::Feeds out;
  for (auto [name, value] : feeds) out[nb::cast<std::string>(name)] = to_tensor(value);
  return out;
}

std::vector<qg::ValueId> to_fetches(const qg::Graph& g, const nb::handle& fetches) {
  std::vector<qg::ValueId> ids;
  for (nb::handle f : fetches) {
    if (nb::isinstance<nb::str>(f))
      ids.push_back(g.at(nb::cast<std::string>(f)));
    else
      ids.push_back(nb::cast<qg::ValueId>(f));
  }
  return ids;
}

// The state_dict naming: a parameter by its name ("fc1.weight"); any other state as
// "<node>/<state>" ("fc1.weight.observer/min"), as checkpoints name them: by the nodes as
// built, so a compiled (fused) graph names its states as the plain one does.
std::map<std::string, qg::Tensor*> named_states(qg::Executor& ex) {
  const qg::Graph& g = ex.graph();
  std::map<std::string, std::string> parameter_keys;  // "<name>/value" -> "<name>"
  for (qg::NodeId id : g.parameters()) parameter_keys[g.node(id).name + "/value"] = g.node(id).name;
  std::map<std::string, qg::Tensor*> out;
  for (const auto& [key, t] : qg::state_index(ex)) {
    auto it = parameter_keys.find(key);
    out[it == parameter_keys.end() ? key : it->second] = t;
  }
  return out;
}

}  // namespace

void bind_runtime(nb::module_& m) {
  nb::class_<qg::Executor>(m, "Executor",
                           "Runs a Graph on 'cpu' or 'cuda[:N]'. The graph must outlive it (the "
                           "executor keeps a reference to it).")
      .def(
          "__init__",
          [](qg::Executor* self, const qg::Graph& g, const std::string& device) {
            new (self) qg::Executor(g, parse_device(device));
          },
          nb::arg("graph"), nb::arg("device") = "cpu", nb::keep_alive<1, 2>())
      .def(
          "run",
          [](qg::Executor& ex, nb::dict feeds, nb::handle fetches,
             const std::vector<qg::NodeId>& targets, nb::handle framework) {
            qg::Executor::Feeds in = to_feeds(feeds);
            std::vector<qg::ValueId> ids = to_fetches(ex.graph(), fetches);
            std::vector<qg::Tensor> out;
            {
              nb::gil_scoped_release release;
              out = ex.run(in, ids, targets);
            }
            nb::list results;
            for (const qg::Tensor& t : out) results.append(from_tensor(t, framework));
            return results;
          },
          nb::arg("feeds"), nb::arg("fetches"), nb::arg("targets") = std::vector<qg::NodeId>{},
          nb::arg("framework") = nb::none(),
          "Runs what `fetches` (value ids or names) and `targets` (node ids run for their "
          "effects, e.g. optimizer steps) need. Feeds: name -> array (NumPy, torch, DLPack; "
          "borrowed without a copy when C-contiguous and aligned). Returns a list of arrays: "
          "NumPy for CPU results and torch for CUDA ones unless framework='numpy', 'torch' or "
          "'dlpack'.")
      .def_prop_rw("training", &qg::Executor::training, &qg::Executor::set_training,
                   "training mode: observers record, batch norms use batch statistics")
      .def("set_training", &qg::Executor::set_training, nb::arg("training"),
           "Sets the training mode (the `training` property).")
      .def_prop_ro(
          "device", [](const qg::Executor& ex) { return ex.device().str(); },
          "the device it runs on: 'cpu' or 'cuda:N'")
      .def_prop_ro(
          "graph", [](const qg::Executor& ex) -> const qg::Graph& { return ex.graph(); },
          nb::rv_policy::reference_internal, "the graph this executor runs")
      .def(
          "parameter",
          [](qg::Executor& ex, const std::string& name, nb::handle framework) {
            return from_tensor(ex.parameter(name), framework);
          },
          nb::arg("name"), nb::arg("framework") = nb::none(),
          "A live view of a parameter's value (writes through to the executor's state).")
      .def(
          "set_parameter",
          [](qg::Executor& ex, const std::string& name, nb::handle value) {
            qg::Tensor& p = ex.parameter(name);
            qg::Tensor v = to_tensor(value);
            QG_CHECK(v.dtype() == p.dtype() && v.shape() == p.shape(), "executor", "parameter '",
                     name, "' is ", p.str(), ", the new value is ", v.str());
            qg::copy_bytes(p.raw_data(), p.device(), v.raw_data(), v.device(), p.nbytes());
          },
          nb::arg("name"), nb::arg("value"), "Copies `value` into a parameter's state.")
      .def(
          "state",
          [](qg::Executor& ex, nb::handle node, const std::string& name, nb::handle framework) {
            qg::NodeId id =
                nb::isinstance<nb::str>(node)
                    ? ex.graph().value(ex.graph().at(nb::cast<std::string>(node))).producer
                    : nb::cast<qg::NodeId>(node);
            return from_tensor(ex.state(id, name), framework);
          },
          nb::arg("node"), nb::arg("name"), nb::arg("framework") = nb::none(),
          "A live view of one state of a node (node id, or the name of one of its outputs).")
      .def(
          "state_dict",
          [](qg::Executor& ex, bool parameters_only, nb::handle framework) {
            std::set<std::string> parameters;
            for (qg::NodeId id : ex.graph().parameters())
              parameters.insert(ex.graph().node(id).name);
            nb::dict d;
            for (const auto& [key, t] : named_states(ex))
              if (!parameters_only || parameters.count(key))
                d[key.c_str()] = from_tensor(t->clone(), framework);
            return d;
          },
          nb::arg("parameters_only") = false, nb::arg("framework") = nb::none(),
          "Copies of every persistent state: parameters by name, other states as "
          "'<node>/<state>'.")
      .def(
          "load_state_dict",
          [](qg::Executor& ex, nb::dict values, bool strict) {
            const qg::Graph& g = ex.graph();
            std::map<std::string, qg::Tensor*> keys = named_states(ex);
            // Checked in full before anything is written, so a bad value changes nothing.
            std::vector<std::string> unused;
            std::vector<std::pair<qg::Tensor*, qg::Tensor>> writes;
            std::set<std::string> given;
            for (auto [key, value] : values) {
              std::string k = nb::cast<std::string>(key);
              auto it = keys.find(k);
              if (it == keys.end()) {
                unused.push_back(k);
                continue;
              }
              qg::Tensor& s = *it->second;
              qg::Tensor v = to_tensor(value);
              QG_CHECK(v.dtype() == s.dtype() && v.shape() == s.shape(), "load_state_dict",
                       "state '", k, "' is ", s.str(), ", the given value is ", v.str());
              writes.emplace_back(&s, v);
              given.insert(k);
            }
            if (strict) {
              QG_CHECK(unused.empty(), "load_state_dict", "no state named '", unused.front(),
                       "' in the graph (", unused.size(), " unknown keys)");
              size_t params_missing = 0;
              std::string first;
              for (qg::NodeId id : g.parameters())
                if (!given.count(g.node(id).name) && params_missing++ == 0) first = g.node(id).name;
              QG_CHECK(params_missing == 0, "load_state_dict", "parameter '", first,
                       "' is missing (", params_missing, " parameters missing)");
            }
            for (auto& [dst, v] : writes)
              qg::copy_bytes(dst->raw_data(), dst->device(), v.raw_data(), v.device(),
                             dst->nbytes());
            return unused;
          },
          nb::arg("state_dict"), nb::arg("strict") = true,
          "Copies values into the executor's states (keys as state_dict() names them). "
          "strict: every key must exist and every parameter be given. Returns unknown keys.");

  m.def("share_states", &qg::share_states, nb::arg("source"), nb::arg("target"),
        "Makes every persistent state of executor `target` (parameters, optimizer moments, "
        "observer statistics) the very tensor `source` holds under the same key: graphs built "
        "alike at two batch sizes then train one model. Call it before `target` runs; raises "
        "naming the key when one is missing or differs in dtype or shape.");
  m.def(
      "set_num_threads",
      [](nb::handle n) {
        int64_t threads = to_int(n, "set_num_threads: the thread count");
        QG_CHECK(threads >= 1, "threads", "the thread count must be >= 1, got ", threads);
        QG_CHECK(threads <= 4096, "threads", "the thread count must be <= 4096, got ", threads);
        qg::set_num_threads(static_cast<int>(threads));
      },
      nb::arg("n"),
      "Sets the number of CPU threads the CPU backend's kernels use (the caller included), as "
      "torch.set_num_threads. Results do not depend on it. QG_NUM_THREADS sets the starting "
      "value; raises while a parallel loop runs.");
  m.def(
      "get_num_threads", [] { return qg::num_threads(); },
      "The number of CPU threads the CPU backend's kernels use.");
  m.def(
      "cuda_available", [] { return qg::cuda_available(); },
      "True when the CUDA backend was built and a GPU is present.");
}

}  // namespace qgpy
