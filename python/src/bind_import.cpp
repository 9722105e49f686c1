// qatgraph.nn.import_weights: pretrained float weights (safetensors / .npz, PyTorch state_dict
// names) into a model's parameters and buffers, through nn/import_weights.h. Validation and
// the error that lists every unmatched name stay in C++; Python only chooses the name mapping.
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "convert.h"
#include "core/error.h"
#include "nn/import_weights.h"

namespace qgpy {
namespace {

using namespace qg::nn;

// None: the PyTorch rules alone. A dict: file name -> model name (None or "" leaves the
// tensor out), consulted before the PyTorch rules.
NameMapper mapper_from(nb::handle mapping) {
  if (mapping.is_none()) return torch_name_match;
  QG_CHECK(nb::isinstance<nb::dict>(mapping), "nn.import",
           "mapping must be a dict of file name -> model name (or None), got ",
           nb::cast<std::string>(nb::str(mapping.type())));
  std::map<std::string, std::string> table;
  for (auto [file_name, model_name] : nb::borrow<nb::dict>(mapping))
    table[nb::cast<std::string>(file_name)] =
        model_name.is_none() ? std::string() : nb::cast<std::string>(model_name);
  return name_table(std::move(table));
}

}  // namespace

void bind_import(nb::module_& m) {
  nb::module_ nn = nb::borrow<nb::module_>(m.attr("nn"));
  nb::class_<ImportReport>(nn, "ImportReport", "What import_weights loaded and left out.")
      .def_ro("loaded", &ImportReport::loaded, "(file name, model name) pairs")
      .def_ro("ignored", &ImportReport::ignored, "(file name, reason) pairs")
      .def_prop_ro("summary", &ImportReport::summary, "one line: how many loaded and ignored")
      .def("__repr__", [](const ImportReport& r) { return "<ImportReport " + r.summary() + ">"; });
  nn.def(
      "import_weights",
      [](qg::Executor& exec, nb::dict tensors, nb::handle mapping, const std::string& what) {
        return import_weights(exec, to_cpu_tensors(tensors), mapper_from(mapping), what);
      },
      nb::arg("executor"), nb::arg("tensors"), nb::arg("mapping") = nb::none(),
      nb::arg("what") = "weights",
      "Loads name -> array (PyTorch state_dict names) into every parameter and buffer of the "
      "executor's model; all or nothing. Raises qatgraph.Error listing every unmatched file "
      "tensor, missing parameter and shape mismatch.");
  nn.def(
      "import_weights_file",
      [](qg::Executor& exec, const std::string& path, nb::handle mapping) {
        return import_weights_file(exec, path, mapper_from(mapping));
      },
      nb::arg("executor"), nb::arg("path"), nb::arg("mapping") = nb::none(),
      "import_weights from a .safetensors or .npz file.");
  nn.def(
      "read_weight_file",
      [](const std::string& path, nb::handle framework) {
        nb::dict d;
        for (const auto& [name, t] : read_weight_file(path))
          d[name.c_str()] = from_tensor(t, framework);
        return d;
      },
      nb::arg("path"), nb::arg("framework") = nb::none(),
      "The named tensors of a .safetensors or .npz file.");
  nn.def(
      "torch_name_match",
      [](const std::string& file_name) {
        NameMatch match = torch_name_match(file_name);
        return std::make_pair(match.candidates, match.ignore_reason);
      },
      nb::arg("file_name"),
      "(model names tried in order, ignore reason) for one PyTorch state_dict name.");
}

}  // namespace qgpy
