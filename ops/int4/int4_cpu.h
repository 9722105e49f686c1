// CPU kernels of the INT4 family (declared in int4_op.cpp).
#pragma once

#include "core/op_schema.h"
#include "ops/common/quant_scope.h"

namespace qg {

// The [outer, axis_len, inner] group layout of `shape` for the attributes axis and
// group_size (the same layout as fake_quantize's group scope: the last group of each row
// may be shorter). Throws naming the op for a bad axis or group_size.
ScopeLayout int4_group_layout(const std::string& op, const Attrs& attrs, const Shape& shape);

// Shape inference shared by the 4-bit unpack ops (INT4, NF4): validates the `shape`
// attribute and that input 0 is a 1-D u8 buffer of exactly the bytes that shape needs;
// returns the logical shape.
Shape check_packed_codes(const InferContext& ctx);

void int4_quantize_pack_cpu(KernelContext& ctx);
void int4_unpack_dequantize_cpu(KernelContext& ctx);

}  // namespace qg
