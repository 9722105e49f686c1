// int8_matmul(a, a_scale, a_zero, w, w_scale) -> y: the integer GEMM of the deployed 8da4w and
// w8a8 linears, y = a_scale * sum over groups of w_scale * (exact int32 dot of (a - a_zero)
// and w), in the order int8_matmul_math.h fixes.
// int8_matmul_ste(x, w_fq, a, a_scale, a_zero, w, w_scale) -> y: the same forward for QAT,
// whose backward is the float GEMM's (dx = dy w_fq, dw_fq = dy^T x) through the fake-quantized
// operands x and w_fq: the straight-through estimator of an integer forward. The forward
// never reads x or w_fq; they are inputs so that autograd finds what the backward needs.
#include <cmath>
#include <string>

#include "core/graph.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "ops/cast/cast_element.h"
#include "ops/common/quant_attrs.h"
#include "ops/common/schema_helpers.h"
#include "ops/int8_matmul/int8_matmul_args.h"
#include "ops/int8_matmul/int8_matmul_math.h"

namespace qg {
namespace {

const std::vector<std::string> kOutNames = {"f32", "bf16", "f16", "f64"};

// The integer operands start at input `c`: a, a_scale, a_zero, w, w_scale.
struct Operands {
  int a, a_scale, a_zero, w, w_scale;
  explicit Operands(int c) : a(c), a_scale(c + 1), a_zero(c + 2), w(c + 3), w_scale(c + 4) {}
};

// Shapes, dtypes and (for constant inputs) values; returns the parsed sizes.
Int8MatmulArgs check(const std::string& op, const std::vector<TensorType>& in, const Attrs& attrs,
                     int first, const std::vector<const Tensor*>* constants = nullptr) {
  const Operands o(first);
  auto expect = [&](int i, DType d, const char* what) {
    QG_CHECK(in[i].dtype == d, op, what, " must be ", dtype_name(d), ", got ", in[i].str());
  };
  expect(o.a, DType::i8, "a (activation codes)");
  expect(o.w, DType::i8, "w (weight codes)");
  expect(o.a_scale, DType::f32, "a_scale");
  expect(o.a_zero, DType::i32, "a_zero");
  expect(o.w_scale, DType::f32, "w_scale");
  const Shape &as = in[o.a].shape, &ws = in[o.w].shape;
  QG_CHECK(as.size() == 2 && ws.size() == 2, op, "a and w must be 2-D ([M, K] and [N, K]), got a ",
           in[o.a].str(), " and w ", in[o.w].str());
  QG_CHECK(as[1] == ws[1], op, "a is [M, K] = ", shape_str(as),
           " but w is [N, K] = ", shape_str(ws), ": K differs");
  Int8MatmulArgs r;
  r.m = as[0];
  r.n = ws[0];
  r.k = as[1];
  QG_CHECK(r.m > 0 && r.n > 0 && r.k > 0, op, "empty GEMM: a ", shape_str(as), ", w ",
           shape_str(ws));
  const int64_t g = attrs.get_int("group_size");
  r.group = g == 0 ? r.k : g;
  QG_CHECK(r.k % r.group == 0, op, "attribute 'group_size' = ", g, " does not divide K = ", r.k);
  QG_CHECK(r.group <= int8mm::kMaxGroup, op, "a group of ", r.group,
           " codes can overflow the exact int32 sum; at most ", int8mm::kMaxGroup,
           " per weight scale (use group_size)");
  const int64_t groups = r.k / r.group;
  QG_CHECK(in[o.a_scale].shape == Shape{r.m} && in[o.a_zero].shape == Shape{r.m}, op,
           "a_scale and a_zero must be [M] = [", r.m, "], got ", in[o.a_scale].str(), " and ",
           in[o.a_zero].str());
  const Shape& ss = in[o.w_scale].shape;
  QG_CHECK(ss == (Shape{r.n, groups}) || (groups == 1 && ss == Shape{r.n}), op,
           "w_scale must be [N, K / group] = [", r.n, ", ", groups, "]",
           groups == 1 ? " (or [N])" : "", ", got ", in[o.w_scale].str());
  if (constants != nullptr) {
    for (int i : {o.a_scale, o.w_scale})
      if (const Tensor* s = (*constants)[i])
        for (int64_t j = 0; j < s->numel(); ++j) check_scale_value(op, s->at(j), j);
    if (const Tensor* z = (*constants)[o.a_zero])
      for (int64_t j = 0; j < z->numel(); ++j)
        QG_CHECK(z->at(j) >= -128 && z->at(j) <= 127, op, "a_zero[", j, "] = ", z->at(j),
                 " is outside the int8 codes' range [-128, 127]");
  }
  r.codes = first;
  return r;
}

std::shared_ptr<const KernelArgs> parse(const ArgsSource& s, int first) {
  auto a = std::make_shared<Int8MatmulArgs>(check(s.op, s.inputs, s.attrs, first));
  a->out = first == 0 ? dtype_from_name(s.attrs.get_string("out_dtype")) : s.inputs[0].dtype;
  return a;
}

template <typename O>
void cpu_typed(KernelContext& ctx) {
  const Int8MatmulArgs& a = ctx.args<Int8MatmulArgs>();
  const Operands o(a.codes);
  const int8_t* codes = ctx.inputs[o.a].data<int8_t>();
  const float* sa = ctx.inputs[o.a_scale].data<float>();
  const int32_t* za = ctx.inputs[o.a_zero].data<int32_t>();
  const int8_t* w = ctx.inputs[o.w].data<int8_t>();
  const float* sw = ctx.inputs[o.w_scale].data<float>();
  // Checked here, not only for constants: a zero point outside int8 could overflow the exact
  // sum, and a bad scale would silently poison every output of its row or group.
  for (int64_t i = 0; i < a.m; ++i) {
    QG_CHECK(za[i] >= -128 && za[i] <= 127, ctx.op, "a_zero[", i, "] = ", za[i],
             " is outside the int8 codes' range [-128, 127]");
    check_scale_value(ctx.op, sa[i], i);
  }
  const int64_t groups = a.k / a.group;
  for (int64_t i = 0; i < a.n * groups; ++i) check_scale_value(ctx.op, sw[i], i);
  O* y = ctx.outputs[0].data<O>();
  std::vector<int16_t> w16(w, w + a.n * a.k);
  parallel_for(
      a.m, 1,
      [&](int64_t b, int64_t e) {
        std::vector<int16_t> u(static_cast<size_t>(a.k));
        for (int64_t m = b; m < e; ++m) {
          for (int64_t j = 0; j < a.k; ++j)
            u[j] = static_cast<int16_t>(int32_t{codes[m * a.k + j]} - za[m]);
          for (int64_t n = 0; n < a.n; ++n)
            y[m * a.n + n] = cast_element<O>(int8mm::dot_row(u.data(), w16.data() + n * a.k,
                                                             sw + n * groups, a.k, a.group, sa[m]));
        }
      },
      a.m * a.n * a.k);
}

void int8_matmul_cpu(KernelContext& ctx) {
  dispatch_float(ctx.args<Int8MatmulArgs>().out, ctx.op.c_str(),
                 [&](auto tag) { cpu_typed<decltype(tag)>(ctx); });
}

std::vector<AttrSpec> group_attr() {
  return {int_attr("group_size", 0,
                   "codes of k per weight scale (w_scale is [N, K / group_size]); 0: all of K "
                   "(per output channel)",
                   0)};
}

// The gradient check's reference: the float GEMM's gradients through x and w_fq.
std::vector<Tensor> ste_reference(const std::vector<Tensor>& in, const Tensor& dy, const Attrs&) {
  const int64_t m = in[0].size(0), k = in[0].size(1), n = in[1].size(0);
  Tensor dx = Tensor::zeros({m, k}, DType::f64), dw = Tensor::zeros({n, k}, DType::f64);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t l = 0; l < k; ++l) {
        dx.data<double>()[i * k + l] += dy.at(i * n + j) * in[1].at(j * k + l);
        dw.data<double>()[j * k + l] += dy.at(i * n + j) * in[0].at(i * k + l);
      }
  std::vector<Tensor> out = {dx, dw};
  out.resize(in.size());
  return out;
}

// Codes spread over their ranges with a fixed pattern (the gradient check draws only floats).
std::vector<double> pattern(int64_t n, int64_t lo, int64_t hi, int64_t step) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<double>(lo + (i * step) % (hi - lo + 1));
  return v;
}

}  // namespace

void add_int8_matmul_cuda_kernels(OpRegistry& r);  // int8_matmul_cuda.cu
void add_int8_matmul_crosscheck(OpRegistry& r);    // int8_matmul_crosscheck.cpp

void define_int8_matmul_ops(OpRegistry& r) {
  const std::vector<std::string> codes = {"a", "a_scale", "a_zero", "w", "w_scale"};
  OpDef& mm = r.define("int8_matmul");
  mm.doc =
      "y = a_scale * sum over groups of w_scale * exact int32 (a - a_zero) . w: int8 activation "
      "codes [M, K] (per-row scale and zero point) times symmetric int8 weight codes [N, K] (one "
      "scale per group of K), the deployed 8da4w / w8a8 GEMM.";
  mm.inputs = codes;
  mm.outputs = {"y"};
  mm.attrs = group_attr();
  mm.attrs.push_back(string_attr("out_dtype", std::string("f32"), kOutNames, "y's dtype"));
  mm.parse_args = [](const ArgsSource& s) { return parse(s, 0); };
  mm.infer = [](const InferContext& ctx) {
    const Int8MatmulArgs a = check(ctx.op, ctx.inputs, ctx.attrs, 0, &ctx.constant_inputs);
    return std::vector<TensorType>{
        {dtype_from_name(ctx.attrs.get_string("out_dtype")), {a.m, a.n}}};
  };
  mm.kernels.push_back({DeviceType::cpu, KernelDTypes::for_inputs({{DType::i8}}), int8_matmul_cpu});

  OpDef& ste = r.define("int8_matmul_ste");
  ste.doc =
      "int8_matmul's forward (y in x's dtype) with the float GEMM's backward through the "
      "fake-quantized x [M, K] and w_fq [N, K]: the QAT linear whose forward is the deployed "
      "integer arithmetic.";
  ste.inputs = {"x", "w_fq"};
  ste.inputs.insert(ste.inputs.end(), codes.begin(), codes.end());
  ste.outputs = {"y"};
  ste.attrs = group_attr();
  ste.differentiable_inputs = {true, true, false, false, false, false, false};
  ste.parse_args = [](const ArgsSource& s) { return parse(s, 2); };
  ste.infer = [](const InferContext& ctx) {
    expect_float(ctx, 0);
    expect_same_dtype(ctx, 0, 1);
    const Int8MatmulArgs a = check(ctx.op, ctx.inputs, ctx.attrs, 2, &ctx.constant_inputs);
    QG_CHECK(ctx.inputs[0].shape == (Shape{a.m, a.k}) && ctx.inputs[1].shape == (Shape{a.n, a.k}),
             ctx.op, "x and w_fq must have the codes' shapes [", a.m, ", ", a.k, "] and [", a.n,
             ", ", a.k, "], got ", ctx.inputs[0].str(), " and ", ctx.inputs[1].str());
    return std::vector<TensorType>{{ctx.inputs[0].dtype, {a.m, a.n}}};
  };
  ste.kernels.push_back({DeviceType::cpu, kFloatDTypes, int8_matmul_cpu});
  ste.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    const ValueId dy = c.grad_or_zeros(0);
    const ValueId x = c.node.inputs[0], w = c.node.inputs[1];
    std::vector<ValueId> g(c.node.inputs.size(), kNoValue);
    if (c.needs_input_grad[0]) g[0] = c.graph.apply1("matmul", {dy, w}, {});
    if (c.needs_input_grad[1]) g[1] = c.graph.apply1("matmul", {dy, x}, {{"transpose_a", true}});
    return g;
  };
  ste.gradcheck_samples = [] {
    // x [3, 64], w_fq [2, 64]; codes, per-row qparams and two groups of 32 per weight row.
    GradcheckSample s("[3,64] x [2,64]^T, group 32",
                      {{{3, 64}},
                       {{2, 64}},
                       {{3, 64}, DType::i8, 0, 0, pattern(3 * 64, -128, 127, 37)},
                       {{3}, DType::f32, 0, 0, {0.02, 0.5, 0.0078125}},
                       {{3}, DType::i32, 0, 0, {-3, 0, 127}},
                       {{2, 64}, DType::i8, 0, 0, pattern(2 * 64, -8, 7, 5)},
                       {{2, 2}, DType::f32, 0, 0, {0.1, 0.03, 0.25, 1.5}}},
                      {{"group_size", 32}});
    s.reference = ste_reference;
    return std::vector<GradcheckSample>{s};
  };
#ifdef QG_WITH_CUDA
  add_int8_matmul_cuda_kernels(r);
#endif
  add_int8_matmul_crosscheck(r);
}

}  // namespace qg
