// CPU kernels of the quantize / dequantize family and the attribute resolution they share
// with the op declarations.
#pragma once

#include "core/op_schema.h"
#include "ops/common/quant_attrs.h"

namespace qg {

// The s8/u8 storage dtype of quantize: `out_dtype` ("auto" picks i8 for ranges with
// qmin < 0, else u8), checked to hold [qmin, qmax] and bits <= 8.
DType quantize_storage_dtype(const std::string& op, const Attrs& attrs, const QuantRange& r);
// The integer range of an s8/u8 storage dtype.
QuantRange storage_range(DType dtype);

void quantize_cpu(KernelContext& ctx);
void quantize_backward_cpu(KernelContext& ctx);
void dequantize_cpu(KernelContext& ctx);
void dequantize_backward_cpu(KernelContext& ctx);

}  // namespace qg
