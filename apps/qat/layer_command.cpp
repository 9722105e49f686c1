// `qat layer conv_bn`: runs one layer of the nn library on .npy files, for conformance
// scripts that compare a layer (not one op) with PyTorch. Reads <dir>/x.npy and, for every
// parameter of the layer, <dir>/<parameter name>.npy when present (the layer is named
// "layer": layer.weight, layer.bn.weight, layer.bn.bias, layer.bn.running_mean,
// layer.bn.running_var); runs `--steps` forward passes in training mode (or one in eval mode
// with --eval) and writes <dir>/y.npy, <dir>/weight_fq.npy (the fake-quantized folded weight
// as [out, in * k * k]) and <dir>/<buffer>.out.npy for the running statistics.
#include <sys/stat.h>

#include <memory>

#include "apps/qat/commands.h"
#include "core/error.h"
#include "core/npy.h"
#include "nn/builder.h"
#include "runtime/executor.h"

namespace qg::cli {
namespace {

struct LayerArgs {
  std::string kind, dir, weight_bits = "8", act_bits = "32", scope = "channel";
  int64_t out_channels = 0, kernel = 3, stride = 1, padding = 0;
  int steps = 1;
  bool eval = false, no_relu = false;
};

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

void run_layer(const LayerArgs& a) {
  QG_CHECK(a.kind == "conv_bn", "layer", "layer kind '", a.kind, "' is not one of conv_bn");
  QG_CHECK(a.steps > 0, "layer", "--steps ", a.steps, " must be positive");
  Tensor x = load_npy(a.dir + "/x.npy");
  QG_CHECK(x.shape().size() == 4 && x.dtype() == DType::f32, "layer", a.dir,
           "/x.npy must be f32 [N, C, H, W], got ", x.str());
  nn::QConfig qc;
  qc.weight = nn::parse_weight_quant(a.weight_bits);
  qc.activation = nn::parse_act_quant(a.act_bits);
  qc.weight_scope = a.scope;
  Graph g;
  nn::Builder b(g, qc, 1);
  ValueId xin = g.input("x", {DType::f32, x.shape()});
  ValueId y = b.conv_bn(xin, x.shape()[1], a.out_channels, a.kernel, "layer", a.stride, a.padding,
                        !a.no_relu);
  Executor ex(g);
  for (NodeId id : g.parameters()) {
    const std::string& name = g.value(g.node(id).outputs[0]).name;
    const std::string path = a.dir + "/" + name + ".npy";
    if (!exists(path)) continue;
    Tensor t = load_npy(path);
    Tensor& dst = ex.parameter(name);
    QG_CHECK(t.dtype() == dst.dtype() && t.shape() == dst.shape(), "layer", path, " holds ",
             t.str(), ", the layer's '", name, "' is ", dst.str());
    dst = t;
  }
  ex.set_training(!a.eval);
  std::vector<ValueId> fetch = {y};
  if (!b.weight_quantizers().empty()) fetch.push_back(b.weight_quantizers()[0].quantized);
  std::vector<Tensor> out;
  for (int s = 0; s < (a.eval ? 1 : a.steps); ++s) out = ex.run({{"x", x}}, fetch);
  save_npy(a.dir + "/y.npy", out[0]);
  if (out.size() > 1) save_npy(a.dir + "/weight_fq.npy", out[1]);
  for (const char* buf : {"layer.bn.running_mean", "layer.bn.running_var"})
    save_npy(a.dir + "/" + buf + ".out.npy", ex.parameter(buf));
}

}  // namespace

void add_layer_command(CLI::App& app) {
  auto a = std::make_shared<LayerArgs>();
  auto* cmd = app.add_subcommand("layer", "Run one nn layer (conv_bn) on .npy files");
  cmd->add_option("kind", a->kind, "Layer kind: conv_bn")->required();
  cmd->add_option("--dir", a->dir, "Folder of x.npy and <parameter>.npy files")->required();
  cmd->add_option("--out-channels", a->out_channels, "Output channels")->required();
  cmd->add_option("--kernel", a->kernel, "Square kernel size")->capture_default_str();
  cmd->add_option("--stride", a->stride, "Stride")->capture_default_str();
  cmd->add_option("--padding", a->padding, "Padding")->capture_default_str();
  cmd->add_option("--weight-bits", a->weight_bits, "32, 8, 4, 2 or nf4")->capture_default_str();
  cmd->add_option("--act-bits", a->act_bits, "32, 8 or 4")->capture_default_str();
  cmd->add_option("--scope", a->scope, "channel or tensor")->capture_default_str();
  cmd->add_option("--steps", a->steps, "Training-mode forward passes")->capture_default_str();
  cmd->add_flag("--eval", a->eval, "One eval-mode pass (running statistics)");
  cmd->add_flag("--no-relu", a->no_relu, "ConvBn2d instead of ConvBnReLU2d");
  cmd->callback([a] { run_layer(*a); });
}

}  // namespace qg::cli
