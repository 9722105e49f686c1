// dynamic_range_quantize(x) -> (q, scale, zero_point): reduce and quantize in one op, for the
// tensor, channel, token and group scopes, symmetric or affine. Each scope's qparams come
// from its own finite values (non-finite ones are skipped by the reduction; NaN quantizes
// to the zero point, +/-Inf to the end codes). The outputs are fixed: zero_point is always
// produced and is all zero in symmetric mode, so graphs need not branch on the mode.
#include <limits>
#include <vector>

#include "core/graph.h"
#include "core/half.h"
#include "ops/common/quant_args.h"
#include "ops/common/quant_attrs.h"
#include "ops/common/quant_scope.h"
#include "ops/common/schema_helpers.h"
#include "ops/dynamic_quant/dynamic_quant_args.h"
#include "ops/dynamic_quant/dynamic_quant_cpu_runs.h"
#include "ops/dynamic_quant/dynamic_quant_math.h"
#include "ops/quantize/quantize_cpu.h"
#include "ops/quantize/quantize_math.h"
#include "ops/quantize/scope_runs.h"

namespace qg {
namespace {

// Defaults give the symmetric range [-127, 127] of SEMANTICS.md.
std::vector<AttrSpec> dynamic_attrs() {
  std::vector<AttrSpec> a = quant_range_attrs();
  for (AttrSpec& s : a)
    if (s.name == "signed" || s.name == "narrow_range") s.default_value.emplace(true);
  a = concat_attrs(a, scope_attrs());
  a.push_back(string_attr("mode", "symmetric", {"symmetric", "affine"},
                          "symmetric: scale = max|x| / qmax, zp = 0; affine: min/max range"));
  a.push_back(string_attr("out_dtype", "auto", {"auto", "i8", "u8"},
                          "storage dtype; auto: i8 when quant_min < 0, else u8"));
  return a;
}

std::vector<TensorType> infer_dynamic(const InferContext& ctx) {
  expect_float(ctx, 0);
  QuantRange r = quant_range_from_attrs(ctx.op, ctx.attrs);
  DType storage = quantize_storage_dtype(ctx.op, ctx.attrs, r);
  QG_CHECK(ctx.attrs.get_string("mode") != "symmetric" || (r.qmin < 0 && r.qmax > 0), ctx.op,
           "attribute 'mode' = symmetric needs a signed range around 0, got [", r.qmin, ", ",
           r.qmax, "]");
  ScopeLayout l = scope_layout(ctx.op, ctx.attrs, ctx.inputs[0].shape);
  return {TensorType{storage, ctx.inputs[0].shape}, TensorType{DType::f32, l.qparam_shape},
          TensorType{DType::i32, l.qparam_shape}};
}

template <typename T, typename Q>
void dynamic_typed(KernelContext& ctx, const QuantRange& r, const ScopeLayout& l) {
  using M = math_t<T>;
  const T* px = ctx.inputs[0].data<T>();
  Q* pq = ctx.outputs[0].data<Q>();
  const bool symmetric = ctx.args<DynamicQuantArgs>().symmetric;
  float* scale = ctx.outputs[1].data<float>();
  int32_t* zp = ctx.outputs[2].data<int32_t>();
  const M qmin = static_cast<M>(r.qmin), qmax = static_cast<M>(r.qmax);
  // Finite min/max per scope, in the math type; then the qparams of scope q in f32.
  std::vector<M> lo(l.num_qparams, std::numeric_limits<M>::infinity());
  std::vector<M> hi(l.num_qparams, -std::numeric_limits<M>::infinity());
  std::vector<M> inv(l.num_qparams), zpm(l.num_qparams);
  auto finish = [&](int64_t q) {
    dynq::QParams p =
        dynq::qparams(static_cast<float>(lo[q]), static_cast<float>(hi[q]), lo[q] <= hi[q],
                      symmetric, static_cast<int32_t>(r.qmin), static_cast<int32_t>(r.qmax));
    QG_CHECK(!p.overflow, ctx.op, "scope ", q, " has range [", lo[q], ", ", hi[q],
             "] whose width overflows f32; the affine scale is not finite");
    scale[q] = p.scale;
    zp[q] = p.zero_point;
    inv[q] = M(1) / static_cast<M>(p.scale);
    zpm[q] = static_cast<M>(p.zero_point);
  };
  // Token scope and groups along the last axis: every run is one whole scope, so reduce and
  // quantize it while it is still in cache (tasks of whole rows, on the thread pool).
  if (l.kind == ScopeKind::token || (l.kind == ScopeKind::group && l.inner == 1)) {
    parallel_scope_runs(l, [&](int64_t k0, int64_t len, int64_t q0, int64_t) {
      dynq_cpu::finite_range(px + k0, len, &lo[q0], &hi[q0]);
      finish(q0);
      dynq_cpu::quantize_run(px + k0, len, inv[q0], zpm[q0], qmin, qmax, pq + k0);
    });
    return;
  }
  // Other scopes: every range first. Runs of one scope (step 0) take the contiguous loops;
  // runs whose scope changes per element (step 1) go element by element. Per tensor, chunk
  // ranges are combined in chunk order; otherwise tasks own disjoint scopes.
  if (l.kind == ScopeKind::tensor) {
    struct Range {
      M lo, hi;
    };
    const Range r0{lo[0], hi[0]};
    const Range all = parallel_reduce(
        ctx.inputs[0].numel(), kElementGrain, r0,
        [&](int64_t b, int64_t e) {
          Range c = r0;
          dynq_cpu::finite_range(px + b, e - b, &c.lo, &c.hi);
          return c;
        },
        [](Range a, Range b) {
          return Range{b.lo < a.lo ? b.lo : a.lo, b.hi > a.hi ? b.hi : a.hi};
        });
    lo[0] = all.lo;
    hi[0] = all.hi;
  } else {
    parallel_scope_runs(l, [&](int64_t k0, int64_t len, int64_t q0, int64_t step) {
      if (step == 0) {
        dynq_cpu::finite_range(px + k0, len, &lo[q0], &hi[q0]);
        return;
      }
      for (int64_t j = 0; j < len; ++j)
        dynq_cpu::finite_range_scalar(px + k0 + j, 1, &lo[q0 + j], &hi[q0 + j]);
    });
  }
  for (int64_t q = 0; q < l.num_qparams; ++q) finish(q);
  parallel_for(ctx.inputs[0].numel(), kElementGrain, [&](int64_t b, int64_t e) {
    for_each_scope_run_in(l, b, e, [&](int64_t k0, int64_t len, int64_t q0, int64_t step) {
      if (step == 0) {
        dynq_cpu::quantize_run(px + k0, len, inv[q0], zpm[q0], qmin, qmax, pq + k0);
        return;
      }
      for (int64_t j = 0; j < len; ++j)
        pq[k0 + j] = static_cast<Q>(
            qstore::quantize<M>(static_cast<M>(px[k0 + j]), inv[q0 + j], zpm[q0 + j], qmin, qmax)
                .q);
    });
  });
}

void dynamic_range_quantize_cpu(KernelContext& ctx) {
  const QuantRange& r = ctx.args<QuantScopeArgs>().range;
  const ScopeLayout& l = ctx.args<QuantScopeArgs>().layout;
  dispatch_float(ctx.inputs[0].dtype(), "dynamic_range_quantize", [&](auto t) {
    if (ctx.outputs[0].dtype() == DType::i8)
      dynamic_typed<decltype(t), int8_t>(ctx, r, l);
    else
      dynamic_typed<decltype(t), uint8_t>(ctx, r, l);
  });
}

}  // namespace

void add_dynamic_quant_cuda_kernels(OpRegistry& r);  // dynamic_quant_cuda.cu
void add_dynamic_quant_crosscheck(OpRegistry& r);    // dynamic_quant_crosscheck.cpp

void define_dynamic_quant_ops(OpRegistry& r) {
  OpDef& op = r.define("dynamic_range_quantize");
  op.parse_args = parse_dynamic_quant_args;
  op.doc =
      "Reduce + quantize in one op: per-scope scale (and zero point) from the input's own "
      "range, then s8/u8 codes. Outputs q, scale (f32) and zero_point (i32, all zero when "
      "symmetric).";
  op.inputs = {"x"};
  op.outputs = {"q", "scale", "zero_point"};
  op.attrs = dynamic_attrs();
  op.infer = infer_dynamic;
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, dynamic_range_quantize_cpu});
#ifdef QG_WITH_CUDA
  add_dynamic_quant_cuda_kernels(r);
#endif
  add_dynamic_quant_crosscheck(r);
}

}  // namespace qg
