// ONNX QDQ export from Python (export/onnx/), as `qat export` does it: the trained model
// converted to integer weights (nn/convert.h), then exported and checked by ONNX. Only this
// file sees QG_WITH_ONNX (python/CMakeLists.txt), so a module built without libonnx-dev
// compiles the same everywhere else and these functions raise a clear qatgraph.Error.
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "core/error.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/trainer.h"

#ifdef QG_WITH_ONNX
#include "export/onnx/onnx_export.h"
#endif

namespace qgpy {
namespace {

using namespace qg::nn;
using Metadata = std::vector<std::pair<std::string, std::string>>;

#ifndef QG_WITH_ONNX
[[noreturn]] void no_onnx() {
  QG_FAIL("export.onnx",
          "this qatgraph module was built without ONNX support: CMake found no libonnx-dev / "
          "libprotobuf-dev (scripts/install_deps.sh installs them; then rebuild)");
}
#endif

// A checkpoint's meta section ("key value" lines that Trainer::save_checkpoint writes) as the
// TrainConfig that wrote it, on the CPU. Keys it lacks keep TrainConfig's defaults;
// Trainer::load_checkpoint then checks that the model and recipe match.
TrainConfig config_from_checkpoint(const std::string& path) {
  const std::map<std::string, std::string> meta = read_checkpoint_meta(path);
  QG_CHECK(meta.count("model") != 0, "export.onnx", "checkpoint ", path,
           " does not name its model (an older checkpoint): build a Trainer with its "
           "TrainConfig, load_checkpoint, and export that");
  TrainConfig c;
  auto get = [&](const char* key, auto&& set) {
    auto it = meta.find(key);
    if (it == meta.end()) return;
    try {
      set(it->second);
    } catch (const qg::Error&) {
      throw;
    } catch (const std::exception&) {  // std::stoll's
      QG_FAIL("export.onnx", "checkpoint ", path, ": meta '", key, "' = '", it->second,
              "' is not valid");
    }
  };
  auto ints = [](const std::string& s) {
    std::vector<int64_t> v;
    for (size_t start = 0; start < s.size();) {
      size_t end = s.find(',', start);
      if (end == std::string::npos) end = s.size();
      v.push_back(std::stoll(s.substr(start, end - start)));
      start = end + 1;
    }
    return v;
  };
  auto one = [](const std::string& s) { return std::stoll(s); };
  get("model", [&](const std::string& s) { c.model = s; });
  get("in_features", [&](const std::string& s) { c.mlp.in_features = one(s); });
  get("classes", [&](const std::string& s) { c.mlp.classes = one(s); });
  get("hidden", [&](const std::string& s) { c.mlp.hidden = ints(s); });
  get("batch", [&](const std::string& s) { c.mlp.batch = one(s); });
  get("channels", [&](const std::string& s) { c.cnn.channels = ints(s); });
  get("d_model", [&](const std::string& s) { c.transformer.d_model = one(s); });
  get("heads", [&](const std::string& s) { c.transformer.heads = one(s); });
  get("blocks", [&](const std::string& s) { c.transformer.layers = one(s); });
  get("mlp_hidden", [&](const std::string& s) { c.transformer.mlp_hidden = one(s); });
  get("weight", [&](const std::string& s) { c.qconfig.weight = parse_weight_quant(s); });
  get("activation", [&](const std::string& s) { c.qconfig.activation = parse_act_quant(s); });
  get("observer", [&](const std::string& s) { c.qconfig.observer = parse_observer(s); });
  get("scope", [&](const std::string& s) { c.qconfig.weight_scope = s; });
  get("group_size",
      [&](const std::string& s) { c.qconfig.weight_group_size = static_cast<int>(one(s)); });
  get("weight_qparams", [&](const std::string& s) { c.qconfig.dynamic_weights = s == "dynamic"; });
  get("weight_mapping",
      [&](const std::string& s) { c.qconfig.weight_mapping = parse_weight_mapping(s); });
  get("optimizer", [&](const std::string& s) { c.optimizer.kind = s; });
  get("freeze_bn_after", [&](const std::string& s) { c.freeze_bn_after = one(s); });
  get("seed", [&](const std::string& s) { c.seed = std::stoull(s); });
  c.device = qg::Device::cpu();
  return c;
}

#ifdef QG_WITH_ONNX
nb::dict write_result(const qg::onnx_export::Result& r, const std::string& path) {
  write_file_atomic(path, r.bytes);
  nb::dict d;
  d["path"] = path;
  d["bytes"] = r.bytes.size();
  d["nodes"] = r.nodes;
  d["initializers"] = r.initializers;
  d["initializer_bytes"] = r.initializer_bytes;
  d["op_counts"] = r.op_counts;
  d["warnings"] = r.warnings;
  return d;
}

// What `qat export` writes for a trained model: converted to integer weights, with the model
// and recipe as metadata. The converted graph is built at data's size when given (its logits
// on data come back as "logits", `qat export --reference`'s), else at the training batch; the
// ONNX batch axis is dynamic either way.
nb::dict export_trainer(Trainer& t, const std::string& path, const Dataset* data) {
  const TrainConfig& config = t.config();
  ModelInstance inst = build_instance(config.spec(), data ? data->size() : config.mlp.batch,
                                      config.qconfig, qg::Device::cpu());
  copy_states(t.executor(), *inst.exec);
  convert_to_integer(inst, config.qconfig);
  nb::object logits = nb::none();
  if (data != nullptr) {
    std::vector<float> rows = run_logits(*inst.exec, inst.model, *data, 0);
    logits = from_tensor(qg::Tensor::from_vector<float>({data->size(), inst.model.classes}, rows),
                         Framework::numpy);
  }
  qg::onnx_export::Options opt;
  opt.graph_name = "qatgraph_" + config.model;
  opt.doc = "qatgraph " + config.spec().str() + ", " + config.qconfig.str() +
            ". int4/int2 weight codes are stored exactly as int8 (ONNX 1.12 has no 4-bit type).";
  opt.metadata = {{"qatgraph.model", config.spec().str()},
                  {"qatgraph.qconfig", config.qconfig.str()},
                  {"qatgraph.epoch", std::to_string(t.epoch())},
                  {"qatgraph.step", std::to_string(t.step())}};
  nb::dict result = write_result(
      qg::onnx_export::export_graph(*inst.graph, *inst.exec, inst.model.x, inst.model.logits, opt),
      path);
  result["logits"] = logits;
  return result;
}
#endif

}  // namespace

void bind_onnx(nb::module_& m) {
#ifdef QG_WITH_ONNX
  m.attr("onnx_available") = true;
  m.attr("onnx_opset") = qg::onnx_export::kOpset;
#else
  m.attr("onnx_available") = false;
  m.attr("onnx_opset") = nb::none();
#endif
  nb::module_ nn = nb::borrow<nb::module_>(m.attr("nn"));
  nn.def("config_from_checkpoint", &config_from_checkpoint, nb::arg("path"),
         "The TrainConfig (on the CPU) that a Trainer checkpoint's meta section describes.");

  m.def(
      "export_onnx_trainer",
      [](Trainer& t, const std::string& path, const Dataset* data) -> nb::dict {
#ifdef QG_WITH_ONNX
        return export_trainer(t, path, data);
#else
        (void)t, (void)path, (void)data;
        no_onnx();
#endif
      },
      nb::arg("trainer"), nb::arg("path"), nb::arg("data") = nb::none(),
      "Exports a trained model, converted to integer weights, as an ONNX QDQ model.");
  m.def(
      "export_onnx_checkpoint",
      [](const std::string& checkpoint, const std::string& path, const Dataset* data) -> nb::dict {
#ifdef QG_WITH_ONNX
        TrainConfig config = config_from_checkpoint(checkpoint);
        // The Trainer only holds the data; one batch of zeros satisfies its checks.
        Dataset rows;
        rows.features = config.mlp.in_features;
        rows.x.assign(config.mlp.batch * rows.features, 0.0f);
        rows.labels.assign(config.mlp.batch, 0);
        Trainer t(config, rows, rows);
        t.load_checkpoint(checkpoint);
        return export_trainer(t, path, data);
#else
        (void)checkpoint, (void)path, (void)data;
        no_onnx();
#endif
      },
      nb::arg("checkpoint"), nb::arg("path"), nb::arg("data") = nb::none(),
      "`qat export --onnx path checkpoint`: a Trainer checkpoint as an ONNX QDQ model.");
  m.def(
      "export_onnx_graph",
      [](qg::Executor& exec, qg::ValueId input, qg::ValueId output, const std::string& path,
         const std::string& graph_name, const std::string& doc,
         const Metadata& metadata) -> nb::dict {
#ifdef QG_WITH_ONNX
        qg::onnx_export::Options opt{graph_name, doc, metadata};
        return write_result(qg::onnx_export::export_graph(exec.graph(), exec, input, output, opt),
                            path);
#else
        (void)exec, (void)input, (void)output, (void)path, (void)graph_name, (void)doc,
            (void)metadata;
        no_onnx();
#endif
      },
      nb::arg("executor"), nb::arg("input"), nb::arg("output"), nb::arg("path"),
      nb::arg("graph_name") = "qatgraph", nb::arg("doc") = "", nb::arg("metadata") = Metadata{},
      "Exports the executor's graph from `input` to `output` as it is (no integer "
      "conversion) as an ONNX QDQ model.");
}

}  // namespace qgpy
