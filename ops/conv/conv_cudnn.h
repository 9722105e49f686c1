// conv2d through cuDNN (built when CMake finds cuDNN: QG_WITH_CUDNN). The CUDA kernels of
// the conv family call these when cudnn_conv::enabled(); otherwise they run the im2col +
// cuBLAS path. QG_CONV_BACKEND=im2col in the environment selects the im2col path at run time
// even when cuDNN is built in, so the two can be timed against each other in one build.
//
// Precision: f32 runs with CUDNN_FMA_MATH (no TF32), as PyTorch does with TF32 off, so the
// result agrees with the CPU reference to float rounding; f16/bf16 compute in f32. The
// context's precision flags may allow TF32 for f32. The work runs on the context's stream.
#pragma once

#include "core/tensor.h"
#include "device/device_context.h"
#include "ops/conv/conv_geometry.h"

namespace qg::cudnn_conv {

using Geometry = ConvGeometry;

// True when cuDNN is built in and not switched off by QG_CONV_BACKEND=im2col.
bool enabled();

// y = conv(x, w) (+ bias [o] broadcast over n, h, w when `bias` is defined).
void forward(const char* op, const Geometry& g, const Tensor& x, const Tensor& w,
             const Tensor* bias, Tensor& y, DeviceContext& context);
// dx = conv_transpose(dy, w): the gradient of forward with respect to x.
void backward_data(const char* op, const Geometry& g, const Tensor& dy, const Tensor& w, Tensor& dx,
                   DeviceContext& context);
// dw = the gradient of forward with respect to w.
void backward_filter(const char* op, const Geometry& g, const Tensor& dy, const Tensor& x,
                     Tensor& dw, DeviceContext& context);

}  // namespace qg::cudnn_conv
