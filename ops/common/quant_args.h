// The parsed arguments of the quantization ops that take a quantization range and a scope:
// read from the attributes once per call site (ParseArgsFn), so the kernels of
// fake_quantize, lsq, quantize/dequantize and dynamic quantize read plain fields.
#pragma once

#include <memory>

#include "core/kernel_args.h"
#include "ops/common/quant_attrs.h"
#include "ops/common/quant_scope.h"

namespace qg {

struct QuantScopeArgs : KernelArgs {
  QuantRange range;    // the op's default when it declares no range attributes
  ScopeLayout layout;  // laid out over the shape of the input the scope applies to
};

// A parser laying the scope out over input `data_input`'s shape (the tensor being quantized:
// x for the forward ops, x or q for their backward ops). Throws the scope's or range's
// qg::Error naming the op.
ParseArgsFn quant_scope_parser(size_t data_input);

}  // namespace qg
