// CPU kernels of the INT4 family (declared in int4_op.cpp).
#pragma once

#include <algorithm>
#include <cstring>

#include "core/op_schema.h"
#include "core/thread_pool.h"
#include "ops/common/quant_scope.h"
#include "ops/quantize/scope_runs.h"

namespace qg {

// The [outer, axis_len, inner] group layout of `shape` for the attributes axis and
// group_size (the same layout as fake_quantize's group scope: the last group of each row
// may be shorter). Throws naming the op for a bad axis or group_size.
ScopeLayout int4_group_layout(const std::string& op, const Attrs& attrs, const Shape& shape);

// Shape inference shared by the 4-bit unpack ops (INT4, NF4): validates the `shape`
// attribute and that input 0 is a 1-D u8 buffer of exactly the bytes that shape needs;
// returns the logical shape.
Shape check_packed_codes(const InferContext& ctx);

// Calls fn(o0, o1) on the thread pool for blocks of outer rows of `row` elements, each block
// starting at an even element index so that no two blocks write one packed byte; a block
// zeroes its bytes first (nibbles are OR-ed in). The blocks depend on the shape alone.
template <typename Fn>
void parallel_packed_rows(int64_t outer, int64_t row, uint8_t* packed, const Fn& fn) {
  int64_t grain = std::max<int64_t>(1, kElementGrain / std::max<int64_t>(row, 1));
  if (row & 1) grain += grain & 1;
  parallel_for(
      outer, grain,
      [&](int64_t o0, int64_t o1) {
        const int64_t b = o0 * row / 2, e = (o1 * row + 1) / 2;
        // Rows of zero elements have no bytes (and `packed` may then be null).
        if (e > b) std::memset(packed + b, 0, static_cast<size_t>(e - b));
        fn(o0, o1);
      },
      outer * row);
}

// Calls fn(k0, len, qparams index, step) for the runs of elements [begin, end) of a
// 4-bit unpack, in chunks that are whole packed bytes, on the thread pool.
template <typename Fn>
void parallel_unpack_runs(const ScopeLayout& l, const Fn& fn) {
  parallel_for(l.outer * l.axis_len * l.inner, kElementGrain,
               [&](int64_t b, int64_t e) { for_each_scope_run_in(l, b, e, fn); });
}

void int4_quantize_pack_cpu(KernelContext& ctx);
void int4_unpack_dequantize_cpu(KernelContext& ctx);

}  // namespace qg
