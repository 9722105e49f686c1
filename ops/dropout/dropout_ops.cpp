// Dropout (inverted, as torch.nn.functional.dropout): in training y = x * mask / (1 - p),
// mask[i] = 1 with probability 1 - p; in eval mode y = x and the mask is all ones. The mask
// bits come from the counter-based generator in ops/common/philox.h (key = seed, counter =
// (element, step)), shared by the CPU and CUDA kernels, so both draw the same mask bit for
// bit. The node's persistent `step` state advances once per training run, so each step
// draws a fresh mask; two executors with the same seed draw the same sequence.
//
// A dropped element is x * 0 * scale: NaN or Inf there gives NaN, as x * mask does in torch.
// The scale 1 / (1 - p) is formed in double and rounded once to the math type. In eval mode
// the backward is the identity too (dx = dy): the backward kernels read the same training
// flag as the forward, since one executor runs both.
#include <cstring>

#include "core/graph.h"
#include "core/half.h"
#include "ops/common/philox.h"
#include "ops/common/schema_helpers.h"
#include "ops/dropout/dropout_reference.h"

namespace qg {
namespace {

AttrSpec p_attr() {
  AttrSpec p = real_attr("p", 0.5, "drop probability in [0, 1)");
  p.validate = [](const std::string& op, const Attr& v) {
    QG_CHECK(v.as_real() >= 0.0 && v.as_real() < 1.0, op, "attribute 'p' = ", v.as_real(),
             " must be in [0, 1)");
  };
  return p;
}

void dropout_cpu(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor& y = ctx.outputs[0];
  uint8_t* mask = ctx.outputs[1].data<uint8_t>();
  const int64_t n = x.numel();
  if (!ctx.training) {
    if (n) std::memcpy(y.raw_data(), x.raw_data(), x.nbytes());
    std::fill(mask, mask + n, uint8_t{1});
    return;
  }
  const DropoutArgs& args = ctx.args<DropoutArgs>();
  const double p = args.p;
  const uint64_t seed = args.seed;
  int64_t& step = ctx.states[0].data<int64_t>()[0];
  const uint64_t threshold = philox::drop_threshold(p);
  dispatch_float(x.dtype(), ctx.op.c_str(), [&](auto tag) {
    using T = decltype(tag);
    using M = math_t<T>;
    const M scale = static_cast<M>(1.0 / (1.0 - p));
    const T* px = x.data<T>();
    T* py = y.data<T>();
    for (int64_t i = 0; i < n; ++i) {
      mask[i] =
          philox::keep_bit(seed, static_cast<uint64_t>(step), static_cast<uint64_t>(i), threshold);
      py[i] = static_cast<T>(static_cast<M>(px[i]) * static_cast<M>(mask[i]) * scale);
    }
  });
  ++step;
}

void dropout_backward_cpu(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  const uint8_t* mask = ctx.inputs[1].data<uint8_t>();
  const double keep_scale = dropout_backward_scale(ctx);
  dispatch_float(dy.dtype(), ctx.op.c_str(), [&](auto tag) {
    using T = decltype(tag);
    using M = math_t<T>;
    const M scale = static_cast<M>(keep_scale);
    const T* pdy = dy.data<T>();
    T* pdx = ctx.outputs[0].data<T>();
    for (int64_t i = 0, n = dy.numel(); i < n; ++i)
      pdx[i] = static_cast<T>(static_cast<M>(pdy[i]) * static_cast<M>(mask[i]) * scale);
  });
}

}  // namespace

double dropout_backward_scale(const KernelContext& ctx) {
  return ctx.training ? 1.0 / (1.0 - ctx.args<DropoutArgs>().p) : 1.0;
}

std::shared_ptr<const KernelArgs> parse_dropout_args(const ArgsSource& s) {
  auto args = std::make_shared<DropoutArgs>();
  args->p = s.attrs.get_real("p");
  if (s.attrs.has("seed")) args->seed = static_cast<uint64_t>(s.attrs.get_int("seed"));
  return args;
}

std::vector<uint8_t> dropout_reference_mask(int64_t n, double p, int64_t seed, int64_t step) {
  std::vector<uint8_t> m(static_cast<size_t>(n));
  const uint64_t threshold = philox::drop_threshold(p);
  for (int64_t i = 0; i < n; ++i)
    m[i] = philox::keep_bit(static_cast<uint64_t>(seed), static_cast<uint64_t>(step),
                            static_cast<uint64_t>(i), threshold);
  return m;
}

void add_dropout_cuda_kernels(OpRegistry& r);  // dropout_cuda.cu
void add_dropout_crosscheck(OpRegistry& r);    // dropout_crosscheck.cpp

void define_dropout_ops(OpRegistry& r) {
  OpDef& op = r.define("dropout");
  op.doc =
      "Training: y = x * mask / (1 - p), mask (u8) drawn by Philox-4x32-10 from (seed, "
      "element, step); eval: y = x, mask = 1. State `step` counts training runs.";
  op.inputs = {"x"};
  op.outputs = {"y", "mask"};
  op.attrs = {p_attr(), int_attr("seed", 0, "generator key")};
  op.differentiable_inputs = {true};
  op.infer = [](const InferContext& ctx) {
    expect_float(ctx, 0);
    return std::vector<TensorType>{ctx.inputs[0], {DType::u8, ctx.inputs[0].shape}};
  };
  op.states = [](const InferContext&) {
    return std::vector<StateSpec>{{"step", {DType::i64, {1}}, 0.0}};
  };
  op.parse_args = parse_dropout_args;
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, dropout_cpu});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    Attrs a;
    a.set("p", c.node.attrs.get_real("p"));
    return {c.graph.apply1("dropout_backward", {c.grad_or_zeros(0), c.node.outputs[1]}, a)};
  };
  op.gradcheck_samples = [] {
    // The mask changes with every run, so central differences (many runs) cannot be the
    // oracle. The reference is dx = w * mask / (1 - p) with the mask of step 0 (the run
    // the analytic gradient comes from) recomputed here from the generator: a wrong scale,
    // a mask other than the forward's, or a missing mask all fail it.
    std::vector<GradcheckSample> out;
    for (double p : {0.3, 0.75}) {
      GradcheckSample s{"[5,7] p=" + std::to_string(p).substr(0, 4),
                        {{{5, 7}}},
                        {{"p", p}, {"seed", int64_t{1234}}}};
      s.reference = [](const std::vector<Tensor>& in, const Tensor& w, const Attrs& a) {
        const double keep_scale = 1.0 / (1.0 - a.get_real("p"));
        std::vector<uint8_t> m =
            dropout_reference_mask(in[0].numel(), a.get_real("p"), a.get_int("seed"), 0);
        std::vector<double> wv = w.to_doubles(), dx(wv.size());
        for (size_t i = 0; i < wv.size(); ++i) dx[i] = m[i] ? wv[i] * keep_scale : 0.0;
        return std::vector<Tensor>{Tensor::from_doubles(in[0].shape(), dx, DType::f64)};
      };
      out.push_back(s);
    }
    return out;
  };

  OpDef& back = r.define("dropout_backward");
  back.doc = "dx = dy * mask / (1 - p) in training, dy in eval mode.";
  back.inputs = {"dy", "mask"};
  back.outputs = {"dx"};
  back.attrs = {p_attr()};
  back.infer = [](const InferContext& ctx) {
    expect_float(ctx, 0);
    QG_CHECK(ctx.inputs[1].dtype == DType::u8 && ctx.inputs[1].shape == ctx.inputs[0].shape, ctx.op,
             "mask ", ctx.inputs[1].str(), " must be u8 shaped like dy ", ctx.inputs[0].str());
    return same_as_input(ctx);
  };
  back.parse_args = parse_dropout_args;
  back.kernels.push_back({DeviceType::cpu, kFloatDTypes, dropout_backward_cpu});
#ifdef QG_WITH_CUDA
  add_dropout_cuda_kernels(r);
#endif
  add_dropout_crosscheck(r);
}

}  // namespace qg
