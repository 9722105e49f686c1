#include "bench/harness/perf_cases.h"

#include <algorithm>
#include <memory>
#include <random>
#include <sstream>

#include "bench/harness/device_timer.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"
#include "runtime/static_run.h"

namespace qg::bench {

std::string PerfCase::label() const {
  return name + " " + dtype_name(dtype) + shape_str(shape);
}

namespace {

ValueId constant_f32(Graph& g, const Shape& shape, double v) {
  return g.constant(Tensor::from_doubles(shape, std::vector<double>(shape_numel(shape), v)));
}

ValueId constant_i32(Graph& g, const Shape& shape, double v) {
  return g.constant(
      Tensor::from_doubles(shape, std::vector<double>(shape_numel(shape), v), DType::i32));
}

using Build = std::function<std::vector<ValueId>(Graph&, ValueId)>;

Build fixed_fq(bool per_channel, bool backward) {
  return [=](Graph& g, ValueId x) {
    Shape s = g.value(x).type.shape;
    Shape qs = per_channel ? Shape{s[0]} : Shape{1};
    Attrs a = per_channel ? Attrs{{"scope", "channel"}, {"axis", 0}} : Attrs{};
    auto fq = g.apply("fake_quantize", {x, constant_f32(g, qs, 0.02), constant_i32(g, qs, 128)}, a);
    if (!backward) return fq;
    ValueId dy = g.input("dy", g.value(x).type);
    return std::vector<ValueId>{fq[0], g.apply1("ste_backward", {dy, fq[1]})};
  };
}

Build observer_fq(bool per_channel, int64_t axis = 0, bool delayed = false) {
  return [=](Graph& g, ValueId x) {
    Attrs a = per_channel ? Attrs{{"scope", "channel"}, {"axis", axis}} : Attrs{};
    Attrs obs = a;
    obs.set("delayed", delayed);
    auto qp = g.apply("moving_average_observer", {x}, obs);
    return g.apply("fake_quantize", {x, qp[0], qp[1]}, a);
  };
}

// Observer + fake-quant with any scope attributes (per token, per group).
Build observer_fq_scope(const Attrs& a) {
  return [=](Graph& g, ValueId x) {
    auto qp = g.apply("moving_average_observer", {x}, a);
    return g.apply("fake_quantize", {x, qp[0], qp[1]}, a);
  };
}

Build observer_quantize(bool per_channel) {
  return [=](Graph& g, ValueId x) {
    Attrs a = per_channel ? Attrs{{"scope", "channel"}, {"axis", 0}} : Attrs{{"signed", true}};
    auto qp = g.apply("minmax_observer", {x}, a);
    return g.apply("quantize", {x, qp[0], qp[1]}, a);
  };
}

Build lsq_fwd_bwd() {
  return [](Graph& g, ValueId x) {
    Shape one{1};
    ValueId s = constant_f32(g, one, 0.02), z = constant_f32(g, one, 3.0);
    Attrs a{{"signed", true}};
    ValueId y = g.apply1("lsq_fake_quantize", {x, s, z}, a);
    ValueId dy = g.input("dy", g.value(x).type);
    auto b = g.apply("lsq_backward", {dy, x, s, z}, a);
    return std::vector<ValueId>{y, b[0], b[1], b[2]};
  };
}

Build single(const std::string& op, Attrs attrs) {
  return [=](Graph& g, ValueId x) { return g.apply(op, {x}, attrs); };
}

}  // namespace

std::vector<PerfCase> perf_cases(DeviceType device, bool quick, const Shape& shape_2d) {
  std::vector<Shape> big = device == DeviceType::cpu
                               ? std::vector<Shape>{{1024, 4096}}
                               : std::vector<Shape>{{8192, 4096}, {2048, 2048}, {64, 768}};
  if (quick) big = {{64, 768}};
  if (!shape_2d.empty()) big = {shape_2d};
  std::vector<PerfCase> cases;
  auto add = [&](const std::string& name, bool fusable, const Build& b, std::vector<DType> dtypes) {
    for (const Shape& s : big)
      for (DType d : dtypes) cases.push_back({name, s, d, fusable, b});
  };
  // The 16-bit rows: bf16 everywhere, f16 too on the GPU (its kernels share the 16-bit paths
  // but convert differently).
  std::vector<DType> both = device == DeviceType::cpu
                                ? std::vector<DType>{DType::f32, DType::bf16}
                                : std::vector<DType>{DType::f32, DType::bf16, DType::f16};
  std::vector<DType> f32 = {DType::f32};
  add("obs+fq per-tensor", true, observer_fq(false), both);
  add("obs+fq per-channel", true, observer_fq(true), both);
  add("obs+fq per-channel last axis", true, observer_fq(true, -1), f32);
  add("obs+fq per-tensor delayed", true, observer_fq(false, 0, true), both);
  add("obs+quantize s8 per-tensor", true, observer_quantize(false), f32);
  add("obs+quantize u8 per-channel", true, observer_quantize(true), f32);
  if (device == DeviceType::cpu) {  // the CPU fused paths for the other scopes
    add("obs+fq per-token", true, observer_fq_scope({{"scope", "token"}}), both);
    add("obs+fq per-group g128", true,
        observer_fq_scope({{"scope", "group"}, {"axis", -1}, {"group_size", 128}}), f32);
  }
  add("fq fwd per-tensor", false, fixed_fq(false, false), both);
  add("fq fwd per-channel", false, fixed_fq(true, false), f32);
  add("fq fwd+bwd per-tensor", false, fixed_fq(false, true), both);
  add("fq fwd+bwd per-channel", false, fixed_fq(true, true), f32);
  add("lsq fwd+bwd per-tensor", false, lsq_fwd_bwd(), f32);
  add("dynamic int8 per-token", false,
      single("dynamic_range_quantize", {{"scope", "token"}, {"mode", "symmetric"}}), both);
  // The dynamic recipes' fake quantization (torchao's 8da4w): per-token int8 activations
  // (rows of the last axis) and symmetric int4 weights in groups of 32.
  add("dynamic fq per-token s8", false,
      single("dynamic_fake_quantize", {{"quant_min", -128}, {"quant_max", 127}}), both);
  add("dynamic fq g32 s4 symmetric", false,
      single("dynamic_fake_quantize", {{"group_size", 32},
                                       {"mode", std::string("symmetric")},
                                       {"quant_min", -8},
                                       {"quant_max", 7}}),
      both);
  add("int4 g128 pack", false, single("int4_quantize_pack", {{"group_size", 128}}), both);
  add("nf4 g64 pack", false, single("nf4_quantize_pack", {{"group_size", 64}}), f32);
  // Channels on a middle axis: NCHW activations observed per channel (axis 1); 128 MiB and
  // 8 MiB in f32 on the GPU, 16 MiB on the CPU.
  std::vector<Shape> nchw = device == DeviceType::cpu
                                ? std::vector<Shape>{{64, 64, 32, 32}}
                                : std::vector<Shape>{{128, 64, 64, 64}, {32, 64, 32, 32}};
  if (quick) nchw = {{4, 64, 8, 8}};
  for (const Shape& s : nchw)
    for (DType d : both)
      cases.push_back({"obs+fq per-channel axis 1", s, d, true, observer_fq(true, 1)});
  return cases;
}

int64_t kernel_bytes(const Graph& graph, const std::vector<NodeId>& nodes) {
  auto bytes_of = [&](ValueId v) {
    const TensorType& t = graph.value(v).type;
    return t.numel() * static_cast<int64_t>(dtype_size(t.dtype));
  };
  int64_t total = 0;
  for (NodeId id : nodes) {
    const Node& n = graph.node(id);
    if (n.op->name == "input" || n.op->is_source || n.op->aliases_input) continue;
    for (ValueId v : n.inputs) total += bytes_of(v);
    for (ValueId v : n.outputs) total += bytes_of(v);
  }
  return total;
}

struct CaseRunner::Impl {
  Graph graph;
  std::unique_ptr<Executor> exec;
  std::unique_ptr<StaticRun> run;
  std::vector<std::vector<std::pair<std::string, Tensor>>> rotations;
};

CaseRunner::CaseRunner(const PerfCase& c, Device device, bool fused) : impl_(new Impl) {
  bytes_ = shape_numel(c.shape) * static_cast<int64_t>(dtype_size(c.dtype));
  Graph& g = impl_->graph;
  ValueId x = g.input("x", {c.dtype, c.shape});
  std::vector<ValueId> fetches = c.build(g, x);
  for (size_t i = 0; i < fetches.size(); ++i) g.set_name(fetches[i], "out" + std::to_string(i));
  optimize(g, fused ? PassOptions{} : PassOptions{{"all"}});
  for (size_t i = 0; i < fetches.size(); ++i) fetches[i] = g.at("out" + std::to_string(i));
  impl_->exec = std::make_unique<Executor>(g, device);
  // Several input copies when they would fit in cache, so each launch reads cold data.
  const int64_t cache_bytes = device.is_cpu() ? (64 << 20) : (128 << 20);
  int copies = static_cast<int>(
      std::min<int64_t>(8, std::max<int64_t>(1, cache_bytes / std::max<int64_t>(bytes_, 1))));
  std::mt19937 rng(7);
  std::normal_distribution<double> dist(0.0, 1.0);
  impl_->rotations.resize(copies);
  Executor::Feeds first;
  for (ValueId in : g.inputs()) {
    const Value v = g.value(in);
    for (int k = 0; k < copies; ++k) {
      std::vector<double> data(static_cast<size_t>(v.type.numel()));
      for (auto& d : data) d = dist(rng);
      Tensor t = Tensor::from_doubles(v.type.shape, data, v.type.dtype).to(device);
      impl_->rotations[k].push_back({v.name, t});
      if (k == 0) first[v.name] = t;
    }
  }
  impl_->run = std::make_unique<StaticRun>(*impl_->exec, first, fetches);
}

CaseRunner::~CaseRunner() {
  delete impl_;
}

void CaseRunner::launch(int i) {
  for (auto& [name, t] : impl_->rotations[i % impl_->rotations.size()])
    impl_->run->bind_input(name, t);
  impl_->run->launch();
}

const DeviceContext& CaseRunner::context() const {
  return impl_->exec->context();
}

int CaseRunner::kernels() const {
  return impl_->run->kernels_per_launch();
}

int64_t CaseRunner::moved_bytes() const {
  return kernel_bytes(impl_->graph, impl_->run->plan().order);
}

std::vector<Measurement> measure(const PerfCase& c, Device device, int reps, bool fused_only) {
  std::vector<Measurement> out;
  int64_t bytes = shape_numel(c.shape) * static_cast<int64_t>(dtype_size(c.dtype));
  double copy = copy_us(device, bytes, reps);
  // CPU: copies on the thread pool that cut their bytes as the case's kernels cut x's
  // elements; one of x's bytes here, one of each variant's moved bytes below.
  const int64_t element = dtype_size(c.dtype);
  const double pool_copy_x = device.is_cpu() ? pool_copy_us(bytes, element, reps) : 0;
  std::vector<std::string> variants = !c.fusable   ? std::vector<std::string>{"-"}
                                      : fused_only ? std::vector<std::string>{"fused"}
                                                   : std::vector<std::string>{"fused", "unfused"};
  for (const std::string& variant : variants) {
    CaseRunner runner(c, device, variant != "unfused");
    Measurement m;
    m.case_label = c.label();
    m.variant = variant;
    m.copy_us = copy;
    m.kernels = runner.kernels();
    m.us = median_us(
        runner.context(), [&](int i) { runner.launch(i); }, reps);
    if (device.is_cpu()) {
      m.moved_bytes = runner.moved_bytes();
      m.pool_copy_us = pool_copy_x;
      m.pool_copy_moved_us = pool_copy_us(m.moved_bytes / 2, element, reps);
    }
    out.push_back(m);
  }
  return out;
}

}  // namespace qg::bench
