// The sizes of one 2-D convolution in NCHW layout, resolved from the shapes and attributes
// and validated once (conv_geometry throws qg::Error naming the op, attribute and values).
// The CPU and CUDA kernels share it; it is host-only plain data.
#pragma once

#include <memory>
#include <string>

#include "core/attrs.h"
#include "core/kernel_args.h"
#include "core/tensor.h"

namespace qg {

struct ConvGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0;      // input x [N, C, H, W]
  int64_t o = 0, kh = 0, kw = 0;           // weight [O, C/groups, kH, kW]
  int64_t sh = 1, sw = 1, ph = 0, pw = 0;  // stride, padding
  int64_t dh = 1, dw = 1, groups = 1;      // dilation, groups
  int64_t ho = 0, wo = 0;                  // output [N, O, Ho, Wo]

  int64_t c_per_group() const { return c / groups; }
  int64_t o_per_group() const { return o / groups; }
  // Rows of one group's im2col matrix (C/groups * kH * kW) and its columns (Ho * Wo).
  int64_t col_rows() const { return c_per_group() * kh * kw; }
  int64_t col_cols() const { return ho * wo; }
  Shape x_shape() const { return {n, c, h, w}; }
  Shape w_shape() const { return {o, c / groups, kh, kw}; }
  Shape y_shape() const { return {n, o, ho, wo}; }
};

// Validates the int-list attributes' lengths and ranges (also used by the attribute
// validators) and the shapes of x and w; returns the resolved geometry.
ConvGeometry conv_geometry(const std::string& op, const Shape& x, const Shape& w,
                           const Attrs& attrs);

// The parsed arguments of conv2d and its backward ops: the geometry resolved once from the
// input shapes and the attributes (input_shape or weight_shape standing in for the tensor
// the backward op does not take).
struct ConvArgs : KernelArgs {
  ConvGeometry geometry;
};
std::shared_ptr<const KernelArgs> parse_conv_args(const ArgsSource& source);

}  // namespace qg
