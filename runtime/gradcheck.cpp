#include "runtime/gradcheck.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "autograd/grad.h"
#include "core/error.h"
#include "runtime/executor.h"

namespace qg {

double max_relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0, scale = 1e-3;
  for (size_t i = 0; i < got.size(); ++i) {
    double d = std::abs(got[i] - want[i]);
    if (std::isnan(d)) return INFINITY;
    diff = std::max(diff, d);
    scale = std::max(scale, std::abs(want[i]));
  }
  return diff / scale;
}

namespace {

Tensor draw_input(const GradcheckInput& spec, std::mt19937_64& rng) {
  int64_t n = shape_numel(spec.shape);
  if (!spec.values.empty()) return Tensor::from_doubles(spec.shape, spec.values, spec.dtype);
  std::uniform_real_distribution<double> dist(spec.low, spec.high);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return Tensor::from_doubles(spec.shape, v, spec.dtype);
}

// loss = sum(op(inputs)[output] * w), so d loss / d output = w (random, not all ones).
struct Harness {
  Graph graph;
  std::vector<ValueId> inputs;
  ValueId loss = kNoValue;
  std::vector<ValueId> grads;
  std::vector<int> diff_inputs;
};

void build(Harness& h, const OpDef& op, const GradcheckSample& s, const TensorType& w_type) {
  for (size_t i = 0; i < s.inputs.size(); ++i)
    h.inputs.push_back(
        h.graph.input("in" + std::to_string(i), {s.inputs[i].dtype, s.inputs[i].shape}));
  ValueId out = h.graph.apply(op.name, h.inputs, s.attrs).at(s.output);
  ValueId w = h.graph.input("w", w_type);
  std::vector<ValueId> wrt;
  for (size_t i = 0; i < s.inputs.size(); ++i)
    if (op.differentiable_inputs[i] && is_floating(s.inputs[i].dtype)) {
      h.diff_inputs.push_back(static_cast<int>(i));
      wrt.push_back(h.inputs[i]);
    }
  if (is_integral(h.graph.value(out).type.dtype)) {
    // An integer output (quantize to storage) has no loss to difference; its gradient is
    // seeded with w directly and only a reference rule can check it.
    h.grads = grad_with_seed(h.graph, out, w, wrt);
    return;
  }
  h.loss = h.graph.apply1("sum", {h.graph.apply1("mul", {out, w})});
  h.grads = grad(h.graph, h.loss, wrt);
}

}  // namespace

GradcheckResult gradcheck(const OpDef& op, const GradcheckSample& s, uint64_t seed) {
  GradcheckResult r;
  r.op = op.name;
  r.sample = s.label;
  r.dtype = s.inputs.empty() ? "-" : dtype_name(s.inputs[0].dtype);
  r.method = s.reference ? "reference-rule" : "central-diff";
  r.tolerance = s.tolerance;
  try {
    std::mt19937_64 rng(seed);
    std::vector<Tensor> values;
    for (const auto& spec : s.inputs) values.push_back(draw_input(spec, rng));

    // Shape of the checked output, from a throwaway graph.
    Graph probe;
    std::vector<ValueId> probe_in;
    for (size_t i = 0; i < s.inputs.size(); ++i)
      probe_in.push_back(
          probe.input("in" + std::to_string(i), {s.inputs[i].dtype, s.inputs[i].shape}));
    TensorType out_type = probe.value(probe.apply(op.name, probe_in, s.attrs).at(s.output)).type;
    bool integer_out = is_integral(out_type.dtype) && s.reference;
    QG_CHECK(out_type.dtype == DType::f64 || integer_out, op.name,
             "gradcheck output must be f64 (or integer with a reference rule), got ",
             out_type.str());
    GradcheckInput w_spec{out_type.shape, DType::f64, 0.5, 1.5, {}};
    Tensor w = draw_input(w_spec, rng);

    Harness h;
    build(h, op, s, TensorType{DType::f64, out_type.shape});
    Executor exec(h.graph);
    Executor::Feeds feeds;
    for (size_t i = 0; i < values.size(); ++i) feeds["in" + std::to_string(i)] = values[i];
    feeds["w"] = w;
    std::vector<Tensor> analytic = exec.run(feeds, h.grads);

    double worst = 0;
    if (s.reference) {
      Attrs resolved = resolve_attrs(op, s.attrs);
      std::vector<Tensor> expected = s.reference(values, w, resolved);
      for (size_t k = 0; k < h.diff_inputs.size(); ++k)
        worst = std::max(worst, max_relative_error(analytic[k].to_doubles(),
                                                   expected.at(h.diff_inputs[k]).to_doubles()));
    } else {
      for (size_t k = 0; k < h.diff_inputs.size(); ++k) {
        int idx = h.diff_inputs[k];
        std::vector<double> numeric(static_cast<size_t>(values[idx].numel()));
        for (int64_t e = 0; e < values[idx].numel(); ++e) {
          double* p = values[idx].data<double>() + e;
          double orig = *p;
          *p = orig + s.step;
          feeds["in" + std::to_string(idx)] = values[idx].clone();
          double plus = exec.run(feeds, {h.loss})[0].at(0);
          *p = orig - s.step;
          feeds["in" + std::to_string(idx)] = values[idx].clone();
          double minus = exec.run(feeds, {h.loss})[0].at(0);
          *p = orig;
          feeds["in" + std::to_string(idx)] = values[idx];
          numeric[e] = (plus - minus) / (2 * s.step);
        }
        worst = std::max(worst, max_relative_error(analytic[k].to_doubles(), numeric));
      }
    }
    r.max_rel_error = worst;
    r.passed = worst <= s.tolerance;
  } catch (const std::exception& e) {
    r.passed = false;
    r.max_rel_error = INFINITY;
    r.error = e.what();
  }
  return r;
}

std::vector<GradcheckResult> gradcheck_all(uint64_t seed) {
  std::vector<GradcheckResult> out;
  for (const OpDef* op : OpRegistry::instance().all()) {
    if (!op->is_differentiable()) continue;
    for (const auto& s : op->gradcheck_samples()) out.push_back(gradcheck(*op, s, seed));
  }
  return out;
}

}  // namespace qg
