// qatgraph.nn (the _core.nn submodule): QConfig recipes, the layer Builder, the digits
// models (build_model), optimizers as graph nodes, datasets and the Trainer.
#include <nanobind/stl/function.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "bindings.h"
#include "convert.h"
#include "nn/builder.h"
#include "nn/digits.h"
#include "nn/model.h"
#include "nn/optimizer.h"
#include "nn/qconfig.h"
#include "nn/trainer.h"

namespace qgpy {
namespace {

using namespace qg::nn;

void bind_qconfig(nb::module_& m) {
  nb::enum_<WeightQuant>(m, "WeightQuant")
      .value("none", WeightQuant::none)
      .value("int8", WeightQuant::int8)
      .value("int4", WeightQuant::int4)
      .value("int2", WeightQuant::int2)
      .value("nf4", WeightQuant::nf4);
  nb::enum_<ActQuant>(m, "ActQuant")
      .value("none", ActQuant::none)
      .value("uint8", ActQuant::uint8)
      .value("uint4", ActQuant::uint4)
      .value("int8_dynamic_token", ActQuant::int8_dynamic_token);
  nb::enum_<ObserverKind>(m, "ObserverKind")
      .value("minmax", ObserverKind::minmax)
      .value("moving_average", ObserverKind::moving_average);
  nb::class_<QConfig>(m, "QConfig", "Which fake-quantizers a model gets (nn/qconfig.h).")
      .def(nb::init<>())
      .def_rw("weight", &QConfig::weight)
      .def_rw("activation", &QConfig::activation)
      .def_rw("observer", &QConfig::observer)
      .def_rw("weight_scope", &QConfig::weight_scope)
      .def_rw("weight_group_size", &QConfig::weight_group_size)
      .def_rw("averaging_constant", &QConfig::averaging_constant)
      .def_rw("weight_averaging_constant", &QConfig::weight_averaging_constant)
      .def_rw("nf4_group_size", &QConfig::nf4_group_size)
      .def_static("float32", &QConfig::float32)
      .def_static("w8a8", &QConfig::w8a8)
      .def_static("w4a8", &QConfig::w4a8)
      .def_static("nf4a8", &QConfig::nf4a8)
      .def_static("w4a4", &QConfig::w4a4)
      .def_static("w2a8", &QConfig::w2a8)
      .def_static("w4a8_group", &QConfig::w4a8_group, nb::arg("group_size") = 32)
      .def_static("int8_dyn_act_int4_weight", &QConfig::int8_dyn_act_int4_weight,
                  nb::arg("group_size") = 32)
      .def_prop_ro("quantized", &QConfig::quantized)
      .def("__repr__", [](const QConfig& q) { return "<QConfig " + q.str() + ">"; });
}

void bind_builder(nb::module_& m) {
  nb::class_<Builder>(m, "Builder",
                      "Builds models layer by layer on a Graph; the QConfig decides the "
                      "quantizers (nn/builder.h). Keeps the graph alive.")
      .def(nb::init<qg::Graph&, QConfig, uint64_t>(), nb::arg("graph"), nb::arg("qconfig"),
           nb::arg("seed") = 1, nb::keep_alive<1, 2>())
      .def("quant_input", &Builder::quant_input, nb::arg("x"), nb::arg("name") = "input")
      .def(
          "act", [](Builder& b, qg::ValueId x, const std::string& name) { return b.act(x, name); },
          nb::arg("x"), nb::arg("name"))
      .def("gemm_input", &Builder::gemm_input, nb::arg("x"), nb::arg("name"))
      .def("weight", &Builder::weight, nb::arg("w"), nb::arg("layer"))
      .def("linear", &Builder::linear, nb::arg("x"), nb::arg("out_features"), nb::arg("name"),
           nb::arg("relu") = false, nb::arg("quantize_output") = true)
      .def("conv2d", &Builder::conv2d, nb::arg("x"), nb::arg("in_channels"),
           nb::arg("out_channels"), nb::arg("kernel"), nb::arg("name"), nb::arg("stride") = 1,
           nb::arg("padding") = 0, nb::arg("relu") = false, nb::arg("quantize_output") = true)
      .def("conv_bn", &Builder::conv_bn, nb::arg("x"), nb::arg("in_channels"),
           nb::arg("out_channels"), nb::arg("kernel"), nb::arg("name"), nb::arg("stride") = 1,
           nb::arg("padding") = 0, nb::arg("relu") = true)
      .def("max_pool2d", &Builder::max_pool2d, nb::arg("x"), nb::arg("kernel"), nb::arg("name"))
      .def("global_avg_pool", &Builder::global_avg_pool, nb::arg("x"), nb::arg("name"))
      .def("layer_norm", &Builder::layer_norm, nb::arg("x"), nb::arg("name"), nb::arg("eps") = 1e-5)
      .def("attention", &Builder::attention, nb::arg("x"), nb::arg("heads"), nb::arg("name"))
      .def("transformer_block", &Builder::transformer_block, nb::arg("x"), nb::arg("heads"),
           nb::arg("mlp_hidden"), nb::arg("name"))
      .def("token_embedding", &Builder::token_embedding, nb::arg("x"), nb::arg("d_model"),
           nb::arg("max_positions"), nb::arg("name"))
      .def("cross_entropy", &Builder::cross_entropy, nb::arg("logits"), nb::arg("labels"))
      .def("uniform_parameter", &Builder::uniform_parameter, nb::arg("name"), nb::arg("shape"),
           nb::arg("bound"))
      .def("filled_parameter", &Builder::filled_parameter, nb::arg("name"), nb::arg("shape"),
           nb::arg("value"), nb::arg("trainable") = true)
      .def("parameters", &Builder::parameters, "trainable parameter value ids, in creation order")
      .def_prop_ro("qconfig", &Builder::qconfig);
}

void bind_models(nb::module_& m) {
  nb::class_<MlpSpec>(m, "MlpSpec")
      .def(nb::init<>())
      .def_rw("in_features", &MlpSpec::in_features)
      .def_rw("hidden", &MlpSpec::hidden)
      .def_rw("classes", &MlpSpec::classes)
      .def_rw("batch", &MlpSpec::batch);
  nb::class_<CnnSpec>(m, "CnnSpec")
      .def(nb::init<>())
      .def_rw("image", &CnnSpec::image)
      .def_rw("channels", &CnnSpec::channels);
  nb::class_<TransformerSpec>(m, "TransformerSpec")
      .def(nb::init<>())
      .def_rw("tokens", &TransformerSpec::tokens)
      .def_rw("d_model", &TransformerSpec::d_model)
      .def_rw("heads", &TransformerSpec::heads)
      .def_rw("layers", &TransformerSpec::layers)
      .def_rw("mlp_hidden", &TransformerSpec::mlp_hidden)
      .def_rw("max_positions", &TransformerSpec::max_positions);
  nb::class_<ModelSpec>(m, "ModelSpec")
      .def(nb::init<>())
      .def(
          "__init__",
          [](ModelSpec* s, const std::string& kind) {
            new (s) ModelSpec();
            s->kind = kind;
          },
          nb::arg("kind"))
      .def_rw("kind", &ModelSpec::kind)
      .def_rw("mlp", &ModelSpec::mlp)
      .def_rw("cnn", &ModelSpec::cnn)
      .def_rw("transformer", &ModelSpec::transformer)
      .def("__repr__", [](const ModelSpec& s) { return "<ModelSpec " + s.str() + ">"; });
  nb::class_<Model>(m, "Model", "Value ids of a built model: x, labels, logits, loss.")
      .def_ro("x", &Model::x)
      .def_ro("labels", &Model::labels)
      .def_ro("logits", &Model::logits)
      .def_ro("loss", &Model::loss)
      .def_ro("batch", &Model::batch)
      .def_ro("classes", &Model::classes)
      .def_ro("parameters", &Model::parameters);
  m.def("build_model", &build_model, nb::arg("graph"), nb::arg("spec"), nb::arg("qconfig"),
        nb::arg("seed") = 1, "Builds an mlp, cnn or transformer on `graph` (nn/model.h).");
  m.def("model_kinds", &model_kinds);

  nb::class_<OptimizerConfig>(m, "OptimizerConfig")
      .def(nb::init<>())
      .def(
          "__init__",
          [](OptimizerConfig* c, const std::string& kind, double lr) {
            new (c) OptimizerConfig();
            c->kind = kind;
            c->lr = lr;
          },
          nb::arg("kind"), nb::arg("lr") = 1e-3)
      .def_rw("kind", &OptimizerConfig::kind)
      .def_rw("lr", &OptimizerConfig::lr)
      .def_rw("momentum", &OptimizerConfig::momentum)
      .def_rw("beta1", &OptimizerConfig::beta1)
      .def_rw("beta2", &OptimizerConfig::beta2)
      .def_rw("eps", &OptimizerConfig::eps)
      .def_rw("weight_decay", &OptimizerConfig::weight_decay);
  m.def("add_optimizer", &add_optimizer, nb::arg("graph"), nb::arg("loss"), nb::arg("params"),
        nb::arg("config"),
        "Differentiates `loss` and appends one optimizer node per parameter; returns the "
        "node ids to pass as Executor.run targets.");
}

void bind_training(nb::module_& m) {
  nb::class_<Dataset>(m, "Dataset", "Rows of features (float32) and integer labels.")
      .def(nb::init<>())
      .def(
          "__init__",
          [](Dataset* d, nb::handle x, nb::handle labels) {
            qg::Tensor tx = to_tensor(x).cast(qg::DType::f32);
            qg::Tensor ty = to_tensor(labels).cast(qg::DType::i64);
            QG_CHECK(tx.dim() == 2 && ty.dim() == 1 && tx.size(0) == ty.size(0), "nn.Dataset",
                     "x must be [n, features] and labels [n], got ", tx.str(), " and ", ty.str());
            new (d) Dataset();
            d->features = tx.size(1);
            d->x.assign(tx.data<float>(), tx.data<float>() + tx.numel());
            d->labels.assign(ty.data<int64_t>(), ty.data<int64_t>() + ty.numel());
          },
          nb::arg("x"), nb::arg("labels"))
      .def_ro("features", &Dataset::features)
      .def("__len__", &Dataset::size)
      .def_prop_ro("x",
                   [](const Dataset& d) {
                     qg::Tensor t = qg::Tensor::empty({d.size(), d.features}, qg::DType::f32);
                     std::memcpy(t.raw_data(), d.x.data(), t.nbytes());
                     return from_tensor(t, Framework::numpy);
                   })
      .def_prop_ro("labels", [](const Dataset& d) {
        return from_tensor(qg::Tensor::from_vector({d.size()}, d.labels), Framework::numpy);
      });
  m.def("load_digits", &load_digits, nb::arg("path") = "",
        "The UCI digits data (python3-sklearn's copy, or $QG_DIGITS_CSV, or `path`).");
  m.def(
      "split_dataset",
      [](const Dataset& all, double test_fraction, uint64_t seed) {
        Dataset train, test;
        split_dataset(all, test_fraction, seed, &train, &test);
        return std::make_pair(train, test);
      },
      nb::arg("data"), nb::arg("test_fraction"), nb::arg("seed") = 0,
      "A seeded shuffle split: returns (train, test).");

  nb::class_<TrainConfig>(m, "TrainConfig")
      .def(nb::init<>())
      .def_rw("model", &TrainConfig::model)
      .def_rw("mlp", &TrainConfig::mlp)
      .def_rw("cnn", &TrainConfig::cnn)
      .def_rw("transformer", &TrainConfig::transformer)
      .def_rw("freeze_bn_after", &TrainConfig::freeze_bn_after)
      .def_rw("drop_last", &TrainConfig::drop_last)
      .def_rw("qconfig", &TrainConfig::qconfig)
      .def_rw("optimizer", &TrainConfig::optimizer)
      .def_rw("seed", &TrainConfig::seed)
      .def_prop_rw(
          "device", [](const TrainConfig& c) { return c.device.str(); },
          [](TrainConfig& c, const std::string& d) { c.device = parse_device(d); });
  nb::class_<EpochMetrics>(m, "EpochMetrics")
      .def_ro("epoch", &EpochMetrics::epoch)
      .def_ro("step", &EpochMetrics::step)
      .def_ro("train_loss", &EpochMetrics::train_loss)
      .def_ro("train_accuracy", &EpochMetrics::train_accuracy)
      .def_ro("test_accuracy", &EpochMetrics::test_accuracy)
      .def_ro("seconds", &EpochMetrics::seconds)
      .def("__repr__", [](const EpochMetrics& e) {
        return "<EpochMetrics epoch " + std::to_string(e.epoch) + " loss " +
               std::to_string(e.train_loss) + " test " + std::to_string(e.test_accuracy) + ">";
      });
  nb::class_<StepInfo>(m, "StepInfo")
      .def_ro("epoch", &StepInfo::epoch)
      .def_ro("step_in_epoch", &StepInfo::step_in_epoch)
      .def_ro("steps_per_epoch", &StepInfo::steps_per_epoch)
      .def_ro("loss", &StepInfo::loss)
      .def_ro("accuracy", &StepInfo::accuracy);

  nb::class_<Trainer>(m, "Trainer",
                      "Trains a build_model model on datasets (nn/trainer.h). Keeps both "
                      "datasets alive.")
      .def(nb::init<const TrainConfig&, const Dataset&, const Dataset&>(), nb::arg("config"),
           nb::arg("train"), nb::arg("test"), nb::keep_alive<1, 3>(), nb::keep_alive<1, 4>())
      .def(
          "train_epoch",
          [](Trainer& t, std::function<void(const StepInfo&)> on_step) {
            return t.train_epoch(on_step ? on_step : std::function<void(const StepInfo&)>{});
          },
          nb::arg("on_step") = nb::none())
      .def("evaluate", &Trainer::evaluate, nb::arg("data"))
      .def(
          "predict",
          [](Trainer& t, const Dataset& d) {
            std::vector<float> logits = t.predict(d);
            int64_t classes = t.model().classes;
            qg::Tensor out = qg::Tensor::empty({d.size(), classes}, qg::DType::f32);
            std::memcpy(out.raw_data(), logits.data(), out.nbytes());
            return from_tensor(out, Framework::numpy);
          },
          nb::arg("data"), "Logits [n, classes] in eval mode.")
      .def("calibrate", &Trainer::calibrate, nb::arg("data"), nb::arg("batches"))
      .def("copy_parameters_from", &Trainer::copy_parameters_from, nb::arg("other"))
      .def("save_checkpoint", &Trainer::save_checkpoint, nb::arg("path"))
      .def("load_checkpoint", &Trainer::load_checkpoint, nb::arg("path"))
      .def(
          "integer_accuracy",
          [](Trainer& t, const Dataset& d) {
            int64_t bytes = 0;
            double acc = t.integer_accuracy(d, &bytes);
            return std::make_pair(acc, bytes);
          },
          nb::arg("data"), "(accuracy, model bytes) after conversion to integer weights.")
      .def("freeze_batch_norms", &Trainer::freeze_batch_norms)
      .def_prop_ro(
          "graph", [](Trainer& t) -> qg::Graph& { return t.graph(); },
          nb::rv_policy::reference_internal)
      .def_prop_ro(
          "executor", [](Trainer& t) -> qg::Executor& { return t.executor(); },
          nb::rv_policy::reference_internal)
      .def_prop_ro(
          "model", [](const Trainer& t) -> const Model& { return t.model(); },
          nb::rv_policy::reference_internal)
      .def_prop_ro("history", &Trainer::history)
      .def_prop_ro("epoch", &Trainer::epoch)
      .def_prop_ro("step", &Trainer::step);
}

}  // namespace

void bind_nn(nb::module_& m) {
  nb::module_ nn = m.def_submodule("nn", "the layer library, models and training (nn/)");
  bind_qconfig(nn);
  bind_builder(nn);
  bind_models(nn);
  bind_training(nn);
  bind_compile(nn);
}

}  // namespace qgpy
