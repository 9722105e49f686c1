// The extension module qatgraph._core; python/qatgraph/__init__.py re-exports it.
#include "bindings.h"
#include "core/error.h"

namespace nb = nanobind;

NB_MODULE(_core, m) {
  m.doc() = "qatgraph C++ core: graphs, autodiff, executors, the nn layer library";
  // qg::Error (bad input, named op and values) -> qatgraph.Error, a ValueError.
  nb::exception<qg::Error>(m, "Error", PyExc_ValueError).attr("__doc__") =
      "Bad input to qatgraph: names the op, what is wrong and the values.";

  nb::dict info;
  info["version"] = QG_VERSION;
#ifdef QG_WITH_CUDA
  info["cuda"] = true;
#else
  info["cuda"] = false;
#endif
  m.attr("build_info") = info;

  qgpy::bind_graph(m);
  qgpy::bind_runtime(m);
  qgpy::bind_nn(m);
  qgpy::bind_io(m);
  qgpy::bind_import(m);
  qgpy::bind_kernel(m);
  qgpy::bind_onnx(m);
}
