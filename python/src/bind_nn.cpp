// qatgraph.nn (the _core.nn submodule): QConfig recipes, the layer Builder, the digits
// models (build_model), optimizers as graph nodes, datasets and the Trainer.
#include <nanobind/stl/function.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "bindings.h"
#include "convert.h"
#include "data/digits.h"
#include "nn/builder.h"
#include "nn/llama_embedding.h"
#include "nn/model.h"
#include "nn/qconfig.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace qgpy {
namespace {

using namespace qg::nn;

// An op's attributes as the dict qatgraph's kernel calls take.
nb::dict attrs_dict(const qg::Attrs& attrs) {
  nb::dict d;
  for (const auto& [key, a] : attrs.items()) {
    switch (a.type()) {
      case qg::AttrType::integer:
        d[key.c_str()] = a.as_int();
        break;
      case qg::AttrType::real:
        d[key.c_str()] = a.as_real();
        break;
      case qg::AttrType::boolean:
        d[key.c_str()] = a.as_bool();
        break;
      case qg::AttrType::string:
        d[key.c_str()] = a.as_string();
        break;
      default:
        d[key.c_str()] = a.as_ints();
    }
  }
  return d;
}

void bind_qconfig(nb::module_& m) {
  nb::enum_<WeightQuant>(m, "WeightQuant", "The weight quantizer a QConfig gives every layer.")
      .value("none", WeightQuant::none, "float weights")
      .value("int8", WeightQuant::int8, "symmetric signed 8-bit codes, zero point 0")
      .value("int4", WeightQuant::int4, "symmetric signed 4-bit codes (-8..7)")
      .value("int3", WeightQuant::int3, "symmetric signed 3-bit codes (-4..3), dynamic only")
      .value("int2", WeightQuant::int2, "symmetric signed 2-bit codes (-2..1)")
      .value("nf4", WeightQuant::nf4, "NormalFloat-4 codes per group of nf4_group_size weights");
  nb::enum_<ActQuant>(m, "ActQuant", "The activation quantizer a QConfig gives every layer.")
      .value("none", ActQuant::none, "float activations")
      .value("uint8", ActQuant::uint8,
             "static per-tensor affine 0..255 after each layer (observer)")
      .value("uint4", ActQuant::uint4, "static per-tensor affine 0..15 after each layer (observer)")
      .value("int8_dynamic_token", ActQuant::int8_dynamic_token,
             "dynamic per-token asymmetric int8 on each GEMM input (torchao 8da4w)");
  nb::enum_<ObserverKind>(m, "ObserverKind", "The observer of static quantizers.")
      .value("minmax", ObserverKind::minmax, "running min and max over every batch seen")
      .value("moving_average", ObserverKind::moving_average,
             "moving averages of the batch min and max (PyTorch's QAT default)");
  nb::enum_<WeightMapping>(m, "WeightMapping", "How dynamic weights map to codes.")
      .value("symmetric", WeightMapping::symmetric, "signed codes, zero point 0")
      .value("float_zero", WeightMapping::float_zero,
             "unsigned codes with a bf16 float zero point (torchao's int4 weight-only QAT)");
  nb::class_<QConfig>(m, "QConfig", "Which fake-quantizers a model gets (nn/qconfig.h).")
      .def(nb::init<>())
      .def_rw("weight", &QConfig::weight, "the weight quantizer (WeightQuant)")
      .def_rw("activation", &QConfig::activation, "the activation quantizer (ActQuant)")
      .def_rw("observer", &QConfig::observer, "the observer of static quantizers (ObserverKind)")
      .def_rw("weight_scope", &QConfig::weight_scope,
              "weight qparams per \"channel\" (output row), \"tensor\" or \"group\"")
      .def_rw("weight_group_size", &QConfig::weight_group_size,
              "scope \"group\": inputs per qparam along each row")
      .def_rw("averaging_constant", &QConfig::averaging_constant,
              "moving-average activation observers' weight of a new batch")
      .def_rw("weight_averaging_constant", &QConfig::weight_averaging_constant,
              "moving-average weight observers' weight of a new batch (1.0: follow the weights)")
      .def_rw("nf4_group_size", &QConfig::nf4_group_size, "NF4: weights per absmax block")
      .def_rw("dynamic_weights", &QConfig::dynamic_weights,
              "weight qparams from the current weights every step (torchao's QAT), no observer")
      .def_rw("weight_mapping", &QConfig::weight_mapping,
              "dynamic weights: symmetric or float_zero (WeightMapping)")
      .def_rw("embedding_weight", &QConfig::embedding_weight,
              "the Llama token embedding's codes: none, int8 or int4 (WeightQuant)")
      .def_rw("embedding_group_size", &QConfig::embedding_group_size,
              "embedding weights per scale along the hidden dim")
      .def_rw("learned_weight_ranges", &QConfig::learned_weight_ranges,
              "dynamic symmetric weights: trainable scales per group/channel, torchao's range "
              "learning, initialised to the dynamic qparams")
      .def_rw("integer_forward", &QConfig::integer_forward,
              "dynamic symmetric recipes: each linear's forward GEMM on the int8 codes "
              "(int8_matmul_ste, the deployed arithmetic), the STE backward through the "
              "fake-quantized operands")
      .def_static("float32", &QConfig::float32, "No quantizer: a float model.")
      .def_static("w8a8", &QConfig::w8a8,
                  "int8 per-channel weights, uint8 activations (torch.ao's default QAT qconfig).")
      .def_static("w4a8", &QConfig::w4a8, "int4 per-channel weights, uint8 activations.")
      .def_static("nf4a8", &QConfig::nf4a8, "NF4 weights, uint8 activations.")
      .def_static("w4a4", &QConfig::w4a4, "int4 weights, uint4 activations.")
      .def_static("w2a8", &QConfig::w2a8, "int2 weights, uint8 activations.")
      .def_static("w4a8_group", &QConfig::w4a8_group, nb::arg("group_size") = 32,
                  "Group-wise int4 weights (group_size inputs per scale), uint8 activations.")
      .def_static("int8_dyn_act_int4_weight", &QConfig::int8_dyn_act_int4_weight,
                  nb::arg("group_size") = 32,
                  "torchao's Int8DynActInt4Weight (8da4w): dynamic per-token int8 GEMM "
                  "inputs, group-wise int4 weights whose qparams follow the weights.")
      .def_static("int8_dyn_act_int8_weight", &QConfig::int8_dyn_act_int8_weight,
                  "w8a8 dynamic: 8da4w's activations, per-channel symmetric int8 weights.")
      .def_static("int4_weight_only", &QConfig::int4_weight_only, nb::arg("group_size") = 128,
                  "torchao's Int4WeightOnlyQATQuantizer: uint4 weights per group with a bf16 "
                  "float zero point; float activations.")
      .def_static("int8_dyn_act_intx_weight", &QConfig::int8_dyn_act_intx_weight, nb::arg("bits"),
                  nb::arg("group_size") = 32,
                  "8da4w's activations with symmetric bits-bit weights per group (2, 3 or 4).")
      .def("validate", &QConfig::validate,
           "Raises qatgraph.Error for a combination no quantizer implements.")
      .def(
          "dynamic_activation_attrs",
          [](const QConfig& q) { return attrs_dict(dynamic_activation_attrs(q)); },
          "The dynamic_fake_quantize attributes of the GEMM-input quantizer (a dict).")
      .def(
          "dynamic_weight_attrs",
          [](const QConfig& q, const std::string& dtype) {
            return attrs_dict(dynamic_weight_attrs(q, qg::dtype_from_name(dtype)));
          },
          nb::arg("dtype") = "f32",
          "The dynamic_fake_quantize attributes of the weight quantizer on weights of this "
          "dtype (\"f32\", \"bf16\", \"f16\"), a dict.")
      .def(
          "embedding_weight_attrs",
          [](const QConfig& q, const std::string& dtype) {
            return attrs_dict(
                dynamic_weight_attrs(embedding_weight_qconfig(q), qg::dtype_from_name(dtype)));
          },
          nb::arg("dtype") = "f32",
          "The dynamic_fake_quantize attributes of the token embedding's quantizer on a table "
          "of this dtype (nn/llama_embedding.h), a dict.")
      .def_prop_ro("quantized", &QConfig::quantized, "True when any quantizer is set")
      .def("__repr__", [](const QConfig& q) { return "<QConfig " + q.str() + ">"; });
  m.def("parse_recipe", &parse_recipe, nb::arg("name"), nb::arg("group_size") = 32,
        "The QConfig of a language-model recipe by name (8da4w, 8da3w, 8da2w, "
        "int4_weight_only, w8a8_dynamic, float); group_size one of 32, 64, 128, 256.");
  m.def("recipe_names", &recipe_names, "The names parse_recipe takes.");
}

void bind_builder(nb::module_& m) {
  nb::class_<Builder>(m, "Builder",
                      "Builds models layer by layer on a Graph; the QConfig decides the "
                      "quantizers (nn/builder.h). Keeps the graph alive.")
      .def(nb::init<qg::Graph&, QConfig, uint64_t>(), nb::arg("graph"), nb::arg("qconfig"),
           nb::arg("seed") = 1, nb::keep_alive<1, 2>())
      .def("quant_input", &Builder::quant_input, nb::arg("x"), nb::arg("name") = "input",
           "Static activation fake-quant of a graph input (PyTorch's QuantStub under QAT).")
      .def(
          "act", [](Builder& b, qg::ValueId x, const std::string& name) { return b.act(x, name); },
          nb::arg("x"), nb::arg("name"),
          "The static activation quantizer (observer, fake-quantize) of a layer output; "
          "identity without static activation quantization.")
      .def("gemm_input", &Builder::gemm_input, nb::arg("x"), nb::arg("name"),
           "The dynamic per-token quantizer of a GEMM input; identity without one.")
      .def("weight", &Builder::weight, nb::arg("w"), nb::arg("layer"),
           "The QConfig's weight quantizer on w ([out, in, ...]); recorded for conversion.")
      .def("linear", &Builder::linear, nb::arg("x"), nb::arg("out_features"), nb::arg("name"),
           nb::arg("relu") = false, nb::arg("quantize_output") = true, nb::arg("bias") = true,
           "y = x W^T + b over the last axis of x, weight quantizer, optional fused ReLU and "
           "output quantizer; parameters '<name>.weight', '<name>.bias' (none without bias).")
      .def("conv2d", &Builder::conv2d, nb::arg("x"), nb::arg("in_channels"),
           nb::arg("out_channels"), nb::arg("kernel"), nb::arg("name"), nb::arg("stride") = 1,
           nb::arg("padding") = 0, nb::arg("relu") = false, nb::arg("quantize_output") = true,
           "conv2d with bias over x [N, in_channels, H, W]: weight quantizer, optional fused "
           "ReLU and output quantizer.")
      .def("conv_bn", &Builder::conv_bn, nb::arg("x"), nb::arg("in_channels"),
           nb::arg("out_channels"), nb::arg("kernel"), nb::arg("name"), nb::arg("stride") = 1,
           nb::arg("padding") = 0, nb::arg("relu") = true,
           "Conv2d + BatchNorm2d (+ ReLU) folded for QAT, as torch.ao.nn.intrinsic.qat."
           "ConvBnReLU2d.")
      .def("max_pool2d", &Builder::max_pool2d, nb::arg("x"), nb::arg("kernel"), nb::arg("name"),
           "Max pooling with a square kernel and stride = kernel over [N, C, H, W].")
      .def("global_avg_pool", &Builder::global_avg_pool, nb::arg("x"), nb::arg("name"),
           "Mean over H and W: [N, C, H, W] -> [N, C].")
      .def("layer_norm", &Builder::layer_norm, nb::arg("x"), nb::arg("name"), nb::arg("eps") = 1e-5,
           "LayerNorm over the last axis with learned gain and bias.")
      .def("attention", &Builder::attention, nb::arg("x"), nb::arg("heads"), nb::arg("name"),
           "Multi-head self-attention over x [N, T, D].")
      .def("transformer_block", &Builder::transformer_block, nb::arg("x"), nb::arg("heads"),
           nb::arg("mlp_hidden"), nb::arg("name"),
           "Pre-norm block: x + MHSA(LN(x)), then x + MLP(LN(x)) with GELU.")
      .def("token_embedding", &Builder::token_embedding, nb::arg("x"), nb::arg("d_model"),
           nb::arg("max_positions"), nb::arg("name"),
           "Tokens [N, T, F] -> a linear embedding to d_model plus a learned positional "
           "table of max_positions rows.")
      .def("cross_entropy", &Builder::cross_entropy, nb::arg("logits"), nb::arg("labels"),
           "Mean softmax cross-entropy of logits [N, classes] against i64 labels [N].")
      .def("uniform_parameter", &Builder::uniform_parameter, nb::arg("name"), nb::arg("shape"),
           nb::arg("bound"),
           "A trainable parameter drawn from U(-bound, bound) by the builder's seeded stream.")
      .def("filled_parameter", &Builder::filled_parameter, nb::arg("name"), nb::arg("shape"),
           nb::arg("value"), nb::arg("trainable") = true,
           "A parameter filled with `value` (trainable=False: a buffer, not in parameters()).")
      .def("parameters", &Builder::parameters, "trainable parameter value ids, in creation order")
      .def_prop_ro("qconfig", &Builder::qconfig, "the QConfig the layers get");
}

void bind_models(nb::module_& m) {
  nb::class_<MlpSpec>(
      m, "MlpSpec",
      "The MLP of build_model; in_features, classes and batch also size the other kinds.")
      .def(nb::init<>())
      .def_rw("in_features", &MlpSpec::in_features, "features per row (64 for digits)")
      .def_rw("hidden", &MlpSpec::hidden, "widths of the hidden layers")
      .def_rw("classes", &MlpSpec::classes, "number of classes (logits per row)")
      .def_rw("batch", &MlpSpec::batch, "rows per training step");
  nb::class_<CnnSpec>(m, "CnnSpec",
                      "The CNN of build_model: conv-bn-relu blocks on square one-channel images.")
      .def(nb::init<>())
      .def_rw("image", &CnnSpec::image,
              "side of the square one-channel images (in_features = image * image)")
      .def_rw("channels", &CnnSpec::channels, "output channels of the conv blocks");
  nb::class_<TransformerSpec>(m, "TransformerSpec",
                              "The transformer of build_model: rows of features read as tokens.")
      .def(nb::init<>())
      .def_rw("tokens", &TransformerSpec::tokens, "tokens per row (in_features must divide by it)")
      .def_rw("d_model", &TransformerSpec::d_model, "embedding width")
      .def_rw("heads", &TransformerSpec::heads, "attention heads")
      .def_rw("layers", &TransformerSpec::layers, "transformer blocks")
      .def_rw("mlp_hidden", &TransformerSpec::mlp_hidden, "hidden width of each block's MLP")
      .def_rw("max_positions", &TransformerSpec::max_positions, "rows of the positional table");
  nb::class_<ModelSpec>(
      m, "ModelSpec",
      "Which model build_model builds: kind ('mlp', 'cnn', 'transformer') and its spec.")
      .def(nb::init<>())
      .def(
          "__init__",
          [](ModelSpec* s, const std::string& kind) {
            new (s) ModelSpec();
            s->kind = kind;
          },
          nb::arg("kind"))
      .def_rw("kind", &ModelSpec::kind, "'mlp', 'cnn' or 'transformer'")
      .def_rw("mlp", &ModelSpec::mlp, "MlpSpec (in_features, classes, batch for every kind)")
      .def_rw("cnn", &ModelSpec::cnn, "CnnSpec")
      .def_rw("transformer", &ModelSpec::transformer, "TransformerSpec")
      .def("__repr__", [](const ModelSpec& s) { return "<ModelSpec " + s.str() + ">"; });
  nb::class_<Model>(m, "Model", "Value ids of a built model: x, labels, logits, loss.")
      .def_ro("x", &Model::x, "the input value id")
      .def_ro("labels", &Model::labels, "the labels value id")
      .def_ro("logits", &Model::logits, "the logits value id")
      .def_ro("loss", &Model::loss, "the loss value id")
      .def_ro("batch", &Model::batch, "rows per step")
      .def_ro("classes", &Model::classes, "logits per row")
      .def_ro("parameters", &Model::parameters, "trainable parameter value ids");
  m.def("build_model", &build_model, nb::arg("graph"), nb::arg("spec"), nb::arg("qconfig"),
        nb::arg("seed") = 1, "Builds an mlp, cnn or transformer on `graph` (nn/model.h).");
  m.def("model_kinds", &model_kinds, "The model kinds build_model knows.");

  nb::class_<OptimizerConfig>(
      m, "OptimizerConfig",
      "The optimizer of add_optimizer, nn.compile and Trainer: adam, adamw or sgd.")
      .def(nb::init<>())
      .def(
          "__init__",
          [](OptimizerConfig* c, const std::string& kind, double lr) {
            new (c) OptimizerConfig();
            c->kind = kind;
            c->lr = lr;
          },
          nb::arg("kind"), nb::arg("lr") = 1e-3)
      .def_rw("kind", &OptimizerConfig::kind, "'adam', 'adamw' or 'sgd'")
      .def_rw("lr", &OptimizerConfig::lr, "learning rate")
      .def_rw("momentum", &OptimizerConfig::momentum, "sgd momentum")
      .def_rw("beta1", &OptimizerConfig::beta1, "adam beta1")
      .def_rw("beta2", &OptimizerConfig::beta2, "adam beta2")
      .def_rw("eps", &OptimizerConfig::eps, "adam epsilon")
      .def_rw("weight_decay", &OptimizerConfig::weight_decay,
              "weight decay: decoupled for adamw, an L2 term for adam and sgd")
      .def_rw("clip_grad_norm", &OptimizerConfig::clip_grad_norm,
              "clip the gradients' total L2 norm to this (adam, adamw; 0: off)")
      .def_rw("runtime_lr", &OptimizerConfig::runtime_lr,
              "adam: read the rate from the 'optimizer.lr' variable, as adamw does");
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
      .def_ro("features", &Dataset::features, "features per row")
      .def("__len__", &Dataset::size)
      .def_prop_ro(
          "x",
          [](const Dataset& d) {
            qg::Tensor t = qg::Tensor::empty({d.size(), d.features}, qg::DType::f32);
            std::memcpy(t.raw_data(), d.x.data(), t.nbytes());
            return from_tensor(t, Framework::numpy);
          },
          "a copy of the features as a float32 array [n, features]")
      .def_prop_ro(
          "labels",
          [](const Dataset& d) {
            return from_tensor(qg::Tensor::from_vector({d.size()}, d.labels), Framework::numpy);
          },
          "a copy of the labels as an int64 array [n]");
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

  nb::class_<TrainConfig>(
      m, "TrainConfig",
      "What Trainer trains: the model, QConfig, optimizer, seed, device, drop_last.")
      .def(nb::init<>())
      .def_rw("model", &TrainConfig::model, "'mlp', 'cnn' or 'transformer'")
      .def_rw("mlp", &TrainConfig::mlp, "MlpSpec (in_features, classes and batch for every kind)")
      .def_rw("cnn", &TrainConfig::cnn, "CnnSpec")
      .def_rw("transformer", &TrainConfig::transformer, "TransformerSpec")
      .def_rw("freeze_bn_after", &TrainConfig::freeze_bn_after,
              "freeze batch-norm statistics after this many steps; < 0 never")
      .def_rw("drop_last", &TrainConfig::drop_last,
              "skip each epoch's last partial batch (True, as DataLoader(drop_last=True)); False "
              "trains on it through a step compiled at its size")
      .def_rw("qconfig", &TrainConfig::qconfig, "the QConfig")
      .def_rw("optimizer", &TrainConfig::optimizer, "the OptimizerConfig")
      .def_rw("seed", &TrainConfig::seed, "seed of initialisation and batch order")
      .def_prop_rw(
          "device", [](const TrainConfig& c) { return c.device.str(); },
          [](TrainConfig& c, const std::string& d) { c.device = parse_device(d); },
          "'cpu' or 'cuda[:N]'");
  nb::class_<EpochMetrics>(m, "EpochMetrics", "What one epoch of Trainer.train_epoch measured.")
      .def_ro("epoch", &EpochMetrics::epoch, "epoch number, from 1")
      .def_ro("step", &EpochMetrics::step, "optimizer steps taken so far")
      .def_ro("train_loss", &EpochMetrics::train_loss, "mean training loss of the epoch")
      .def_ro("train_accuracy", &EpochMetrics::train_accuracy, "training accuracy of the epoch")
      .def_ro("test_accuracy", &EpochMetrics::test_accuracy, "test accuracy after the epoch")
      .def_ro("seconds", &EpochMetrics::seconds, "wall time of the epoch")
      .def("__repr__", [](const EpochMetrics& e) {
        return "<EpochMetrics epoch " + std::to_string(e.epoch) + " loss " +
               std::to_string(e.train_loss) + " test " + std::to_string(e.test_accuracy) + ">";
      });
  nb::class_<StepInfo>(m, "StepInfo",
                       "Progress passed to Trainer.train_epoch's on_step after each step.")
      .def_ro("epoch", &StepInfo::epoch, "epoch number, from 1")
      .def_ro("step_in_epoch", &StepInfo::step_in_epoch,
              "steps taken in this epoch, this one included")
      .def_ro("steps_per_epoch", &StepInfo::steps_per_epoch, "steps this epoch takes")
      .def_ro("loss", &StepInfo::loss, "running mean loss of the epoch")
      .def_ro("accuracy", &StepInfo::accuracy, "running accuracy of the epoch");

  nb::class_<Trainer>(m, "Trainer",
                      "Trains a build_model model on datasets (train/trainer.h). Keeps both "
                      "datasets alive.")
      .def(nb::init<const TrainConfig&, const Dataset&, const Dataset&>(), nb::arg("config"),
           nb::arg("train"), nb::arg("test"), nb::keep_alive<1, 3>(), nb::keep_alive<1, 4>())
      .def(
          "train_epoch",
          [](Trainer& t, std::function<void(const StepInfo&)> on_step) {
            return t.train_epoch(on_step ? on_step : std::function<void(const StepInfo&)>{});
          },
          nb::arg("on_step") = nb::none(),
          "One pass over the training data in a fresh seeded order (the last partial batch "
          "dropped unless config.drop_last is False); on_step(StepInfo) after each step. "
          "Returns the EpochMetrics, test accuracy measured after the pass.")
      .def("evaluate", &Trainer::evaluate, nb::arg("data"),
           "Accuracy on `data` in eval mode (observers frozen); every row counts once.")
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
      .def("calibrate", &Trainer::calibrate, nb::arg("data"), nb::arg("batches"),
           "Forward passes in training mode without updates, so observers record ranges.")
      .def("copy_parameters_from", &Trainer::copy_parameters_from, nb::arg("other"),
           "Copies every parameter and buffer from a trainer of the same architecture.")
      .def("save_checkpoint", &Trainer::save_checkpoint, nb::arg("path"),
           "Writes the config and every state to a checkpoint file.")
      .def("load_checkpoint", &Trainer::load_checkpoint, nb::arg("path"),
           "Loads a checkpoint of the same architecture; a failed load changes nothing.")
      .def(
          "integer_accuracy",
          [](Trainer& t, const Dataset& d) {
            int64_t bytes = 0;
            double acc = t.integer_accuracy(d, &bytes);
            return std::make_pair(acc, bytes);
          },
          nb::arg("data"), "(accuracy, model bytes) after conversion to integer weights.")
      .def("freeze_batch_norms", &Trainer::freeze_batch_norms,
           "Stops every batch norm's running statistics from updating.")
      .def_prop_ro(
          "graph", [](Trainer& t) -> qg::Graph& { return t.graph(); },
          nb::rv_policy::reference_internal, "the compiled graph at the configured batch")
      .def_prop_ro(
          "executor", [](Trainer& t) -> qg::Executor& { return t.executor(); },
          nb::rv_policy::reference_internal, "the executor holding every state")
      .def_prop_ro(
          "model", [](const Trainer& t) -> const Model& { return t.model(); },
          nb::rv_policy::reference_internal, "the Model's value ids")
      .def_prop_ro("history", &Trainer::history, "EpochMetrics of every epoch so far")
      .def_prop_ro("epoch", &Trainer::epoch, "epochs trained so far")
      .def_prop_ro("step", &Trainer::step, "optimizer steps taken so far");
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
