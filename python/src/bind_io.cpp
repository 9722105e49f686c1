// Tensor files through the C++ readers and writers (validated, see core/): safetensors,
// .npy. qatgraph.io builds state-dict import/export on these.
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>

#include "bindings.h"
#include "convert.h"
#include "core/npy.h"
#include "core/safetensors.h"

namespace qgpy {
namespace {

nb::dict to_python(const std::map<std::string, qg::Tensor>& tensors, nb::handle framework) {
  nb::dict d;
  for (const auto& [name, t] : tensors) d[name.c_str()] = from_tensor(t, framework);
  return d;
}

}  // namespace

void bind_io(nb::module_& m) {
  m.def(
      "load_safetensors",
      [](const std::string& path, nb::handle framework) {
        std::map<std::string, std::string> metadata;
        std::map<std::string, qg::Tensor> tensors = qg::load_safetensors(path, &metadata);
        return nb::make_tuple(to_python(tensors, framework), metadata);
      },
      nb::arg("path"), nb::arg("framework") = nb::none(),
      "Reads a safetensors file: (name -> array, metadata).");
  m.def(
      "save_safetensors",
      [](const std::string& path, nb::dict tensors,
         const std::map<std::string, std::string>& metadata) {
        qg::save_safetensors(path, to_cpu_tensors(tensors), metadata);
      },
      nb::arg("path"), nb::arg("tensors"),
      nb::arg("metadata") = std::map<std::string, std::string>{},
      "Writes name -> array as a safetensors file (atomically).");
  m.def(
      "load_npy",
      [](const std::string& path, nb::handle framework) {
        return from_tensor(qg::load_npy(path), framework);
      },
      nb::arg("path"), nb::arg("framework") = nb::none());
  m.def(
      "save_npy",
      [](const std::string& path, nb::handle value) {
        qg::Tensor t = to_tensor(value);
        qg::save_npy(path, t.device().is_cpu() ? t : t.to(qg::Device::cpu()));
      },
      nb::arg("path"), nb::arg("value"));
}

}  // namespace qgpy
