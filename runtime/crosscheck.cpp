#include "runtime/crosscheck.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/error.h"
#include "core/op_registry.h"
#include "core/output_name.h"

namespace qg {
namespace {

// Relative tolerance per dtype. f32/f64: SEMANTICS.md's 1e-5. f16/bf16: the result is an
// f32 value rounded once to the storage type, so two f32 results that agree to 1e-5 can
// still land one storage ulp apart (2^-11 for f16, 2^-8 for bf16, relative); two ulps are
// allowed.
double reduction_tolerance(DType dtype) {
  switch (dtype) {
    case DType::f16:
      return 2.0 * 0.00048828125;
    case DType::bf16:
      return 2.0 * 0.00390625;
    default:
      return 1e-5;
  }
}

std::string node_label(const Node& n) {
  return n.name.empty() ? "#" + std::to_string(n.id) : n.name;
}

Tensor to_host(const Tensor& t) {
  return !t.defined() || t.device().is_cpu() ? t : t.to(Device::cpu());
}

}  // namespace

CompareRule compare_rule(const std::string& op, int output, DType dtype) {
  if (const OpDef* def = OpRegistry::instance().find(op))
    for (int rounded : def->crosscheck.rounded_outputs)
      if (rounded < 0 || rounded == output) return {false, reduction_tolerance(dtype)};
  return {true, 0.0};
}

std::string CrosscheckMismatch::str() const {
  std::ostringstream os;
  os << "node '" << node << "' (" << op << ") " << output;
  if (index >= 0) {
    os.precision(17);
    os << " [" << index << "]: cpu " << cpu << ", gpu " << gpu << ", error " << error
       << " > tolerance " << tolerance;
  }
  if (!detail.empty()) os << ": " << detail;
  return os.str();
}

bool compare_tensors(const Tensor& cpu_in, const Tensor& gpu_in, const CompareRule& rule,
                     CrosscheckMismatch& m, double& max_error) {
  Tensor cpu = to_host(cpu_in), gpu = to_host(gpu_in);
  if (cpu.defined() != gpu.defined()) {
    m.detail = cpu.defined() ? "the GPU produced no tensor" : "the CPU produced no tensor";
    return false;
  }
  if (!cpu.defined()) return true;
  if (cpu.dtype() != gpu.dtype() || cpu.shape() != gpu.shape()) {
    m.detail = "cpu " + cpu.str() + " vs gpu " + gpu.str();
    return false;
  }
  int64_t n = cpu.numel();
  if (!is_floating(cpu.dtype())) {
    size_t es = dtype_size(cpu.dtype());
    const char* a = static_cast<const char*>(cpu.raw_data());
    const char* b = static_cast<const char*>(gpu.raw_data());
    for (int64_t i = 0; i < n; ++i)
      if (std::memcmp(a + i * es, b + i * es, es) != 0) {
        m.index = i;
        m.cpu = cpu.at(i);
        m.gpu = gpu.at(i);
        m.error = std::abs(m.cpu - m.gpu);
        m.detail = "integer values differ";
        return false;
      }
    return true;
  }
  std::vector<double> c = cpu.to_doubles(), g = gpu.to_doubles();
  double scale = 0;
  for (double v : c)
    if (std::isfinite(v)) scale = std::max(scale, std::abs(v));
  scale = std::max(scale, 1e-30);
  for (int64_t i = 0; i < n; ++i) {
    double a = c[i], b = g[i];
    bool same;
    double err = 0;
    if (std::isnan(a) || std::isnan(b)) {
      same = std::isnan(a) && std::isnan(b);  // any NaN payload: conversions may differ
      err = same ? 0 : INFINITY;
    } else if (rule.exact || !std::isfinite(a) || !std::isfinite(b)) {
      same = a == b && std::signbit(a) == std::signbit(b);
      err = same ? 0 : std::abs(a - b) / scale;
    } else {
      err = std::abs(a - b) / scale;
      same = err <= rule.tolerance;
      max_error = std::max(max_error, err);
    }
    if (!same) {
      m.index = i;
      m.cpu = a;
      m.gpu = b;
      m.error = err;
      m.tolerance = rule.exact ? 0 : rule.tolerance;
      if (rule.exact) m.detail = "bit-exact comparison";
      return false;
    }
  }
  return true;
}

namespace {

// Runs the node's CPU kernel on host copies of the GPU's inputs and pre-step states.
std::vector<Tensor> run_cpu_node(DeviceContext& cpu, const Graph& graph, const Node& node,
                                 const std::vector<Tensor>& gpu_values, std::vector<Tensor>& states,
                                 bool training) {
  std::vector<Tensor> inputs;
  for (ValueId in : node.inputs) inputs.push_back(to_host(gpu_values.at(in)));
  std::vector<Tensor> outputs;
  for (ValueId out : node.outputs) {
    const TensorType& t = graph.value(out).type;
    outputs.push_back(Tensor::empty(t.shape, t.dtype));
  }
  const std::vector<DType> key = graph.input_dtypes(node);
  const KernelDef* k = node.op->find_kernel(DeviceType::cpu, key);
  QG_CHECK(k != nullptr, node.op->name, "no CPU reference kernel for inputs ",
           signature_str(key, node.op->inputs));
  std::shared_ptr<const PreparedArgs> prepared = graph.prepare_args(node);
  KernelContext ctx(node.op->name, *prepared, node.attrs, std::move(inputs), std::move(outputs),
                    states, cpu, training);
  ctx.site = node.id;
  ctx.site_name = &node.name;
  k->fn(ctx);
  return ctx.outputs;
}

}  // namespace

CrosscheckReport crosscheck(const Graph& graph, const Executor::Feeds& feeds,
                            const CrosscheckOptions& options) {
  QG_CHECK(cuda_available(), "crosscheck", "no CUDA device is present");
  CrosscheckReport report;
  Executor gpu(graph, Device::cuda(options.device_index));
  gpu.set_training(options.training);
  std::unique_ptr<DeviceContext> cpu = make_device_context(Device::cpu());
  std::vector<NodeId> order = graph.topological_order();
  for (int step = 0; step < options.steps; ++step) {
    // 1. Pre-step GPU states, on the host: the CPU kernels start from them.
    std::vector<std::vector<Tensor>> pre(graph.num_nodes());
    for (NodeId id : order)
      for (const Tensor& s : gpu.states(id)) pre[id].push_back(to_host(s).clone());
    // 2. The GPU step. When it raises, the CPU reference must raise on the same graph too.
    std::vector<Tensor> values;
    try {
      values = gpu.run_all(feeds);
    } catch (const Error& gpu_error) {
      Executor cpu(graph, Device::cpu());
      cpu.set_training(options.training);
      try {
        for (int s = 0; s <= step; ++s) cpu.run_all(feeds);
      } catch (const Error& cpu_error) {
        report.both_raised = true;
        report.raised = std::string("cpu: ") + cpu_error.what() + " | gpu: " + gpu_error.what();
        report.passed = true;
        report.steps = step + 1;
        return report;
      }
      CrosscheckMismatch m;
      m.op = gpu_error.op();
      m.node = "-";
      m.output = "run";
      m.detail = std::string("the GPU raised but the CPU did not: ") + gpu_error.what();
      report.first = m;
      return report;
    }
    // 3. Every node against its CPU kernel on the same inputs, in execution order.
    for (NodeId id : order) {
      const Node& node = graph.node(id);
      if (node.dead || node.op->is_source) continue;
      CrosscheckMismatch m;
      m.node = node_label(node);
      m.op = node.op->name;
      std::vector<Tensor> states = pre[id];
      std::vector<Tensor> want;
      try {
        want = run_cpu_node(*cpu, graph, node, values, states, options.training);
      } catch (const Error& e) {
        m.output = "run";
        m.detail = std::string("the CPU kernel raised on the GPU's inputs: ") + e.what();
        report.first = m;
        return report;
      }
      ++report.nodes_checked;
      for (size_t i = 0; i < node.outputs.size(); ++i) {
        m.output = "output '" + output_name(*node.op, i) + "'";
        CompareRule rule = compare_rule(node.op->name, static_cast<int>(i),
                                        graph.value(node.outputs[i]).type.dtype);
        ++report.values_compared;
        if (!compare_tensors(want[i], values.at(node.outputs[i]), rule, m, report.max_error)) {
          report.first = m;
          return report;
        }
      }
      const std::vector<Tensor>& got_states = gpu.states(id);
      for (size_t i = 0; i < states.size(); ++i) {
        m.output = "state '" + node.states.at(i).name + "'";
        ++report.values_compared;
        if (!compare_tensors(states[i], got_states.at(i), CompareRule{}, m, report.max_error)) {
          report.first = m;
          return report;
        }
      }
    }
    report.steps = step + 1;
  }
  report.passed = true;
  return report;
}

}  // namespace qg
