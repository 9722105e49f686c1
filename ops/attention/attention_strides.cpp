#include "ops/attention/attention_strides.h"

#include <string>

#include "core/error.h"

namespace qg {
namespace {

int64_t stride_of(const Tensor& t, int axis) {
  return t.shape()[axis] == 1 ? 0 : t.strides()[axis];
}

// The batch, head and seq strides of input `i`; `rows_of_vectors` for the inputs with a
// head_dim axis, which must be contiguous (the kernels read a row as consecutive elements).
RowStrides row_strides(const KernelContext& ctx, size_t i, const char* name, bool rows_of_vectors) {
  const Tensor& t = ctx.inputs.at(i);
  if (rows_of_vectors) {
    QG_CHECK(t.shape()[3] == 1 || t.strides()[3] == 1, ctx.op, "input ", i, " ('", name,
             "') has strides ", shape_str(t.strides()), " for shape ", shape_str(t.shape()),
             "; its head_dim axis (the last) must have stride 1");
  }
  return {stride_of(t, 0), stride_of(t, 1), stride_of(t, 2)};
}

}  // namespace

AttentionStrides attention_strides(const KernelContext& ctx) {
  AttentionStrides s;
  s.q = row_strides(ctx, 0, "q", true);
  s.k = row_strides(ctx, 1, "k", true);
  s.v = row_strides(ctx, 2, "v", true);
  if (ctx.inputs.size() == 6) {
    s.o = row_strides(ctx, 3, "o", true);
    s.lse = row_strides(ctx, 4, "lse", false);
    s.dout = row_strides(ctx, 5, "do", true);
  }
  return s;
}

}  // namespace qg
