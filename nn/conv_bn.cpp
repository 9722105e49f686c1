// Conv2d + BatchNorm2d (+ ReLU) folded for QAT exactly as torch.ao.nn.intrinsic.qat.ConvBn2d
// / ConvBnReLU2d (torch 1.13) compute it:
//   running_std  = sqrt(running_var + eps)
//   scale_factor = gamma / running_std
//   w_fold       = W * scale_factor[:, None, None, None]
//                  (these three: one conv_bn_fold_weight node, ops/fold, same roundings)
//   conv         = conv2d(x, weight_quant(w_fold), 0)
//   conv         = conv / scale_factor[None, :, None, None]
//   y            = batch_norm(conv)   (batch statistics in training, updating the running
//                                      ones; running statistics in eval or once frozen)
//   y            = relu(y), then the output activation quantizer.
// With float weights (no weight quantizer) there is nothing to fold for, and the block is
// plain conv -> batch_norm (-> relu). The conv has no bias of its own (the batch norm's beta plays
// that part). Parameters:
// "<name>.weight" [O, C, k, k], "<name>.bn.weight" (gamma), "<name>.bn.bias" (beta);
// buffers "<name>.bn.running_mean", "<name>.bn.running_var" (graph parameters the optimizer
// never sees; the batch_norm node "<name>.bn" updates them and holds the `frozen` state).
#include <cmath>

#include "core/error.h"
#include "nn/builder.h"

namespace qg::nn {

ValueId Builder::conv_bn(ValueId x, int64_t in_channels, int64_t out_channels, int64_t kernel,
                         const std::string& name, int64_t stride, int64_t padding, bool relu) {
  check_conv_input(g_, x, in_channels, "nn.conv_bn", name);
  QG_CHECK(out_channels > 0 && kernel > 0 && stride > 0 && padding >= 0, "nn.conv_bn", "layer '",
           name, "': out_channels ", out_channels, ", kernel ", kernel, ", stride ", stride,
           ", padding ", padding, " must be positive (padding >= 0)");
  const double eps = 1e-5;
  double bound = 1.0 / std::sqrt(static_cast<double>(in_channels * kernel * kernel));
  ConvBnLayer rec;
  rec.name = name;
  rec.eps = eps;
  ValueId w =
      uniform_parameter(name + ".weight", {out_channels, in_channels, kernel, kernel}, bound);
  rec.gamma = filled_parameter(name + ".bn.weight", {out_channels}, 1.0);
  rec.beta = filled_parameter(name + ".bn.bias", {out_channels}, 0.0);
  rec.running_mean = filled_parameter(name + ".bn.running_mean", {out_channels}, 0.0, false);
  rec.running_var = filled_parameter(name + ".bn.running_var", {out_channels}, 1.0, false);

  ValueId zero_bias = g_.constant(Tensor::zeros({out_channels}, DType::f32), name + ".zero_bias");
  ValueId xin = gemm_input(x, name + ".in");
  const Attrs conv_attrs{{"stride", Shape{stride, stride}}, {"padding", Shape{padding, padding}}};
  ValueId conv;
  if (qc_.weight == WeightQuant::none) {
    // No weight quantizer, so nothing to fold for: conv -> batch_norm as torch's float
    // Conv2d + BatchNorm2d compute it. The fold's rescaling of the output would only add two
    // passes over the activations (and the gradient of the scale) for the same result.
    rec.folded = false;
    rec.conv = conv = g_.apply1("conv2d", {xin, w, zero_bias}, conv_attrs, name + ".conv");
  } else {
    // One node for the fold (ops/fold): the same roundings as the generic chain
    // add(running_var, eps) -> sqrt -> div -> reshape -> mul, and one backward node.
    auto fold = g_.apply("conv_bn_fold_weight", {w, rec.gamma, rec.running_var}, {{"eps", eps}},
                         name + ".fold");
    rec.fold_node = g_.value(fold[0]).producer;
    ValueId w_fold = fold[0], scale_factor = fold[1];
    rec.conv =
        g_.apply1("conv2d", {xin, weight(w_fold, name), zero_bias}, conv_attrs, name + ".conv");
    // conv / scale_factor[None, :, None, None] as one op whose backward is one pass.
    conv = g_.apply1("channel_div", {rec.conv, scale_factor}, {}, name + ".unscale");
  }
  auto bn = g_.apply("batch_norm", {conv, rec.gamma, rec.beta, rec.running_mean, rec.running_var},
                     {{"momentum", 0.1}, {"eps", eps}}, name + ".bn");
  rec.bn_out = bn[0];
  rec.bn_node = g_.value(bn[0]).producer;
  conv_bns_.push_back(rec);
  ValueId y = rec.bn_out;
  if (relu) y = g_.apply1("relu", {y}, {}, name + ".relu");
  return act(y, name + ".out");
}

}  // namespace qg::nn
