// rope(x [batch, heads, seq, head_dim], position_ids i64 [batch or 1, seq]) -> y: Llama's
// rotary position embedding (the rotate-half convention, inverse frequencies from
// `rope_theta`), applied to the queries or keys of attention; rope_math.h has the arithmetic.
// With `inverse` it rotates by the negative angle, which is the backward of the forward
// rotation (and the forward of the backward), so one op serves both directions.
#include <cmath>
#include <vector>

#include "core/graph.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "ops/common/schema_helpers.h"
#include "ops/rope/rope_args.h"
#include "ops/rope/rope_math.h"

namespace qg {
namespace {

AttrSpec theta_attr() {
  AttrSpec s = real_attr("rope_theta", 10000.0,
                         "the base of the inverse frequencies (Llama: rope_theta), held as f32");
  s.validate = [](const std::string& op, const Attr& v) {
    const double t = v.as_real();
    const float f = static_cast<float>(t);
    QG_CHECK(std::isfinite(t) && t > 0 && std::isfinite(f) && f > 0, op,
             "attribute 'rope_theta' = ", t, " must be positive and finite as an f32");
  };
  return s;
}

// x is [batch, heads, seq, head_dim] with an even head_dim of at most 2 * kRopeMaxHalf;
// position_ids is i64 [batch, seq] or [1, seq].
void check_inputs(const InferContext& ctx) {
  expect_float(ctx, 0);
  const TensorType& x = ctx.inputs[0];
  const TensorType& p = ctx.inputs[1];
  QG_CHECK(x.shape.size() == 4, ctx.op, "x must be [batch, heads, seq, head_dim], got ", x.str());
  const int64_t d = x.shape[3];
  QG_CHECK(d > 0 && d % 2 == 0 && d <= 2 * kRopeMaxHalf, ctx.op, "head_dim = ", d, " of x ",
           x.str(), " must be even, positive and at most ", 2 * kRopeMaxHalf);
  QG_CHECK(p.dtype == DType::i64, ctx.op, "position_ids must be i64, got ", p.str());
  QG_CHECK(p.shape.size() == 2 && (p.shape[0] == x.shape[0] || p.shape[0] == 1) &&
               p.shape[1] == x.shape[2],
           ctx.op, "position_ids must be [", x.shape[0], ", ", x.shape[2], "] or [1, ", x.shape[2],
           "] for x ", x.str(), ", got ", p.str());
}

std::shared_ptr<const KernelArgs> parse_args(const ArgsSource& s) {
  auto a = std::make_shared<RopeArgs>();
  const TensorType& x = s.inputs.at(0);
  RopeLayout& l = a->layout;
  l.batch = x.shape.at(0);
  l.heads = x.shape.at(1);
  l.seq = x.shape.at(2);
  l.dim = x.shape.at(3);
  l.positions_broadcast = s.inputs.at(1).shape.at(0) == 1;
  l.inverse = s.attrs.get_bool("inverse");
  rope_math::fill_inv_freq(l, s.attrs.get_real("rope_theta"));
  return a;
}

template <typename T>
void rope_typed(KernelContext& ctx) {
  using M = math_t<T>;
  const RopeLayout& l = ctx.args<RopeArgs>().layout;
  const T* x = ctx.inputs[0].data<T>();
  const int64_t* pos = ctx.inputs[1].data<int64_t>();
  T* y = ctx.outputs[0].data<T>();
  const int64_t half = l.dim / 2, pos_rows = l.positions_broadcast ? 1 : l.batch;
  // cos and sin (in T, widened to M) per position row, step and frequency.
  std::vector<M> cs(static_cast<size_t>(pos_rows * l.seq * half));
  std::vector<M> sn(cs.size());
  parallel_for(
      pos_rows * l.seq, std::max<int64_t>(1, kElementGrain / half),
      [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p)
          for (int64_t i = 0; i < half; ++i) {
            const float a = rope_math::angle_of(pos[p], l.inv_freq[i]);
            const M s = static_cast<M>(static_cast<T>(rope_math::sin_f32(a)));
            cs[p * half + i] = static_cast<M>(static_cast<T>(rope_math::cos_f32(a)));
            sn[p * half + i] = l.inverse ? -s : s;
          }
      },
      pos_rows * l.seq * half * 16);
  auto r = [](M v) { return static_cast<M>(static_cast<T>(v)); };  // one rounding to T
  const int64_t rows = l.batch * l.heads * l.seq;
  parallel_for(
      rows, std::max<int64_t>(1, kElementGrain / l.dim),
      [&](int64_t r0, int64_t r1) {
        for (int64_t row = r0; row < r1; ++row) {
          const int64_t b = row / (l.heads * l.seq), t = row % l.seq;
          const int64_t p = (l.positions_broadcast ? 0 : b) * l.seq + t;
          const M* c = cs.data() + p * half;
          const M* s = sn.data() + p * half;
          const T* in = x + row * l.dim;
          T* out = y + row * l.dim;
          for (int64_t j = 0; j < half; ++j) {
            const M x1 = static_cast<M>(in[j]), x2 = static_cast<M>(in[j + half]);
            out[j] = static_cast<T>(r(x1 * c[j]) + r(-x2 * s[j]));
            out[j + half] = static_cast<T>(r(x2 * c[j]) + r(x1 * s[j]));
          }
        }
      },
      rows * l.dim);
}

void rope_cpu(KernelContext& ctx) {
  if (ctx.inputs[0].numel() == 0) return;
  dispatch_float(ctx.inputs[0].dtype(), ctx.op.c_str(),
                 [&](auto tag) { rope_typed<decltype(tag)>(ctx); });
}

GradcheckSample sample(const std::string& label, Shape x, Shape p, std::vector<double> positions,
                       double theta) {
  GradcheckSample s(label, {GradcheckInput{x}, GradcheckInput{p, DType::i64, 0, 0, positions}},
                    {{"rope_theta", theta}});
  return s;
}

}  // namespace

void add_rope_cuda_kernels(OpRegistry& r);  // rope_cuda.cu
void add_rope_crosscheck(OpRegistry& r);    // rope_crosscheck.cpp

void define_rope_ops(OpRegistry& r) {
  OpDef& op = r.define("rope");
  op.doc =
      "Llama's rotary position embedding (rotate-half) of x [batch, heads, seq, head_dim] at "
      "position_ids [batch or 1, seq]: x * cos + rotate_half(x) * sin; `inverse` rotates back.";
  op.inputs = {"x", "position_ids"};
  op.outputs = {"y"};
  op.attrs = {theta_attr(),
              bool_attr("inverse", false, "rotate by the negative angle (the backward)")};
  op.parse_args = parse_args;
  op.differentiable_inputs = {true, false};
  op.infer = [](const InferContext& ctx) {
    check_inputs(ctx);
    return std::vector<TensorType>{ctx.inputs[0]};
  };
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, rope_cpu});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    Attrs a;
    a.set("rope_theta", c.node.attrs.get_real("rope_theta"));
    a.set("inverse", !c.node.attrs.get_bool("inverse"));
    return {c.graph.apply1("rope", {c.grad_or_zeros(0), c.node.inputs[1]}, a), kNoValue};
  };
  op.gradcheck_samples = [] {
    return std::vector<GradcheckSample>{
        sample("[2,3,4,8] positions [2,4]", {2, 3, 4, 8}, {2, 4}, {0, 1, 2, 3, 7, 3, 100, 5}, 1e4),
        sample("[2,2,3,2] positions shared [1,3], theta 500000", {2, 2, 3, 2}, {1, 3}, {4, 0, 2048},
               5e5),
    };
  };
#ifdef QG_WITH_CUDA
  add_rope_cuda_kernels(r);
#endif
  add_rope_crosscheck(r);
}

}  // namespace qg
