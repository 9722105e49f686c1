// qatgraph.nn.compile: the compiled training step every caller of the C++ API uses
// (runtime/compile.h) — autograd, the optimizer nodes, the fusion passes, the memory plan and
// a CUDA-graph replay on the GPU — for graphs built from Python.
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "convert.h"
#include "runtime/compile.h"
#include "train/optimizer.h"

namespace qgpy {
namespace {

qg::Executor::Feeds feeds_of(const nb::dict& feeds) {
  qg::Executor::Feeds out;
  for (auto [name, value] : feeds) out[nb::cast<std::string>(name)] = to_tensor(value);
  return out;
}

nb::list results_of(const std::vector<qg::Tensor>& got, nb::handle framework) {
  nb::list out;
  // Copies: the compiled step overwrites its fetched buffers on its next run.
  for (const qg::Tensor& t : got) out.append(from_tensor(t.clone(), framework));
  return out;
}

}  // namespace

void bind_compile(nb::module_& nn) {
  nb::enum_<qg::RunPath>(nn, "RunPath", "How a run mode of a CompiledStep last ran.")
      .value("executor", qg::RunPath::executor, "the executor's validated run (the first)")
      .value("launch", qg::RunPath::launch, "a StaticRun over the memory plan, kernel by kernel")
      .value("replay", qg::RunPath::replay, "a replay of the captured CUDA graph");
  nb::class_<qg::CompiledStep>(nn, "CompiledStep",
                               "A graph compiled for repeated runs (qatgraph.nn.compile).")
      .def(
          "train",
          [](qg::CompiledStep& s, nb::dict feeds, const std::vector<qg::ValueId>& fetches,
             nb::handle framework) {
            qg::Executor::Feeds in = feeds_of(feeds);
            std::vector<qg::Tensor> got;
            {
              nb::gil_scoped_release release;
              got = s.train(in, fetches);
              s.synchronize();
            }
            return results_of(got, framework);
          },
          nb::arg("feeds"), nb::arg("fetches") = std::vector<qg::ValueId>{},
          nb::arg("framework") = nb::none(),
          "One training step (forward, backward, optimizer). Feeds omitted keep the values "
          "last fed. Returns copies of the fetched values.")
      .def(
          "forward",
          [](qg::CompiledStep& s, nb::dict feeds, const std::vector<qg::ValueId>& fetches,
             bool training, nb::handle framework) {
            qg::Executor::Feeds in = feeds_of(feeds);
            std::vector<qg::Tensor> got;
            {
              nb::gil_scoped_release release;
              got = s.forward(in, fetches, training);
              s.synchronize();
            }
            return results_of(got, framework);
          },
          nb::arg("feeds"), nb::arg("fetches"), nb::arg("training") = false,
          nb::arg("framework") = nb::none(),
          "Forward only: eval mode, or calibration with training=True.")
      .def_prop_ro(
          "executor", [](qg::CompiledStep& s) -> qg::Executor& { return s.executor(); },
          nb::rv_policy::reference_internal, "the executor holding the states")
      .def_prop_ro("updates", &qg::CompiledStep::updates, "the optimizer's update node ids")
      .def(
          "passes",
          [](const qg::CompiledStep& s) {
            nb::dict d;
            for (const qg::PassRecord& r : s.passes()) d[r.name.c_str()] = r.ran ? r.rewrites : -1;
            return d;
          },
          "Rewrites per pass (-1: switched off).")
      .def("last_path", &qg::CompiledStep::last_path, nb::arg("fetches"), nb::arg("update"),
           nb::arg("training"),
           "RunPath of the last run of the mode that fetches `fetches` with these flags.");
  nn.def(
      "compile",
      [](qg::Graph& g, qg::ValueId loss, const std::vector<qg::ValueId>& params,
         const qg::nn::OptimizerConfig& optimizer, const std::string& device,
         const std::vector<qg::ValueId>& outputs) {
        qg::CompileOptions options;
        options.device = parse_device(device);
        options.outputs = outputs;
        if (loss != qg::kNoValue) options.outputs.push_back(loss);
        qg::TrainingSpec spec;
        if (loss != qg::kNoValue) spec = {loss, params, qg::nn::optimizer_nodes(optimizer), {}};
        return new qg::CompiledStep(g, spec, options);
      },
      nb::arg("graph"), nb::arg("loss") = qg::kNoValue,
      nb::arg("params") = std::vector<qg::ValueId>{},
      nb::arg("optimizer") = qg::nn::OptimizerConfig{}, nb::arg("device") = "cpu",
      nb::arg("outputs") = std::vector<qg::ValueId>{}, nb::keep_alive<0, 1>(),
      "Compiles `graph` in place: gradients of `loss` for `params`, the optimizer's nodes, the "
      "fusion passes (QG_DISABLE_PASSES applies), the memory plan and, on CUDA, a captured "
      "step. `outputs` lists the values runs may fetch (kept out of fusions). Without a loss "
      "the step is forward-only.");
}

}  // namespace qgpy
