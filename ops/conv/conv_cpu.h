// CPU kernels of the conv2d family (f32, f64): im2col per image and group, then Eigen GEMMs
// on row-major maps; col2im scatters dx back.
#pragma once

#include "core/tensor.h"
#include "ops/conv/conv_geometry.h"

namespace qg {

void conv2d_forward_cpu(const ConvGeometry& g, const Tensor& x, const Tensor& w, const Tensor& b,
                        Tensor& y);
void conv2d_backward_input_cpu(const ConvGeometry& g, const Tensor& dy, const Tensor& w,
                               Tensor& dx);
void conv2d_backward_weight_cpu(const ConvGeometry& g, const Tensor& dy, const Tensor& x,
                                Tensor& dw);
void conv2d_backward_bias_cpu(const Tensor& dy, Tensor& db);

}  // namespace qg
