// `qat crosscheck`: every op, scope and dtype run on the CUDA backend and checked node by
// node against the CPU reference (runtime/crosscheck.h). Prints one table row per case and
// exits non-zero on a mismatch or an op without a CUDA kernel; on a machine without a GPU
// it says so and exits 0.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <random>
#include <set>

#include "apps/qat/commands.h"
#include "autograd/grad.h"
#include "core/graph.h"
#include "runtime/crosscheck.h"

namespace qg::cli {
namespace {

Tensor draw(const GradcheckInput& spec, DType dtype, std::mt19937_64& rng) {
  if (!spec.values.empty()) return Tensor::from_doubles(spec.shape, spec.values, dtype);
  std::uniform_real_distribution<double> dist(spec.low, spec.high);
  std::vector<double> v(static_cast<size_t>(shape_numel(spec.shape)));
  for (auto& x : v) x = dist(rng);
  return Tensor::from_doubles(spec.shape, v, dtype);
}

// One case of the run: an op and one of its crosscheck cases (OpDef::crosscheck, or a
// gradient-check sample as a case with its backward graph).
struct OpCase {
  std::string op;
  CrosscheckCase c;
};

struct Built {
  Graph graph;
  Executor::Feeds feeds;
};

// Builds the case in `dtype`. Attempt 0 casts every f64 input; attempt 1 only the inputs
// shaped like input 0 (qparams such as scale must stay f32 for f16/bf16 data).
bool build(const OpCase& oc, DType dtype, int attempt, uint64_t seed, Built& b, std::string& why) {
  const CrosscheckCase& c = oc.c;
  try {
    const OpDef& op = OpRegistry::instance().get(oc.op);
    std::mt19937_64 rng(seed);
    std::vector<ValueId> ins;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      const GradcheckInput& in = c.inputs[i];
      DType d = in.dtype;
      if (d == DType::f64) {
        bool follows = attempt == 0 || in.shape == c.inputs[0].shape;
        d = follows ? dtype : (dtype == DType::f64 ? DType::f64 : DType::f32);
      }
      std::string name = "in" + std::to_string(i);
      ins.push_back(b.graph.input(name, {d, in.shape}));
      b.feeds[name] = draw(in, d, rng);
    }
    std::vector<ValueId> outs = b.graph.apply(oc.op, ins, c.attrs, oc.op);
    if (c.backward && op.is_differentiable()) {
      ValueId out = outs.at(c.output);
      const TensorType t = b.graph.value(out).type;
      if (is_floating(t.dtype)) {
        ValueId w = b.graph.input("w", t);
        b.feeds["w"] = draw(GradcheckInput(t.shape, DType::f64, 0.5, 1.5), t.dtype, rng);
        ValueId loss = b.graph.apply1("sum", {b.graph.apply1("mul", {out, w})});
        std::vector<ValueId> wrt;
        for (size_t i = 0; i < ins.size(); ++i)
          if (op.differentiable_inputs[i] && is_floating(b.graph.value(ins[i]).type.dtype))
            wrt.push_back(ins[i]);
        if (!wrt.empty()) grad(b.graph, loss, wrt);
      }
    }
    return true;
  } catch (const Error& e) {
    why = e.what();
    return false;
  }
}

// Ops reachable in the graph without a CUDA kernel for their dtype.
std::set<std::string> missing_kernels(const Graph& g) {
  std::set<std::string> out;
  for (NodeId id : g.topological_order()) {
    const Node& n = g.node(id);
    const std::vector<DType> key = g.input_dtypes(n);
    if (n.op->find_kernel(DeviceType::cuda, key) == nullptr)
      out.insert(n.op->name + signature_str(key, n.op->inputs));
  }
  return out;
}

// Every gradient-check sample of every differentiable op (forward and backward graph), then
// the cases each op's definition adds (OpDef::crosscheck).
std::vector<OpCase> all_cases(const std::string& filter) {
  std::vector<OpCase> cases;
  for (const OpDef* op : OpRegistry::instance().all()) {
    if (!op->is_differentiable() || !op->gradcheck_samples) continue;
    if (!filter.empty() && op->name != filter) continue;
    for (const GradcheckSample& s : op->gradcheck_samples())
      cases.push_back({op->name, {"gradcheck: " + s.label, s.inputs, s.attrs, true, s.output}});
  }
  for (const OpDef* op : OpRegistry::instance().all()) {
    if (!op->crosscheck.cases || (!filter.empty() && op->name != filter)) continue;
    for (CrosscheckCase& c : op->crosscheck.cases()) cases.push_back({op->name, std::move(c)});
  }
  return cases;
}

// Prints every registered op that lacks a CUDA kernel, or a CUDA kernel for some dtype its
// CPU kernels accept (declared ones included: the start-up self-check rejects the others).
int list_missing() {
  int n = 0;
  for (const OpDef* op : OpRegistry::instance().all()) {
    std::string lacking = op->cpu_only ? "any dtype (declared cpu_only)"
                                       : cuda_dtype_gaps(*op, /*include_declared=*/true);
    if (!lacking.empty()) {
      std::printf("%-34s no CUDA kernel for %s\n", op->name.c_str(), lacking.c_str());
      ++n;
    }
  }
  std::printf("%d ops lack CUDA kernels\n", n);
  return n;
}

// Prints what the run would compare, one line per op that has crosscheck cases or outputs
// compared to rounding: "op cases=N rounded=-1|1,2|none reason=...". The pins of each family's
// tests are checked against this list (tests/core/check_crosscheck_pins.py).
void list_spec() {
  for (const OpDef* op : OpRegistry::instance().all()) {
    const CrosscheckSpec& spec = op->crosscheck;
    if (!spec.cases && spec.rounded_outputs.empty()) continue;
    std::string rounded;
    for (int o : spec.rounded_outputs) rounded += (rounded.empty() ? "" : ",") + std::to_string(o);
    std::printf("%s cases=%zu rounded=%s reason=%s\n", op->name.c_str(),
                spec.cases ? spec.cases().size() : size_t{0},
                rounded.empty() ? "none" : rounded.c_str(), spec.rounded_reason.c_str());
  }
}

}  // namespace

void add_crosscheck_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "crosscheck", "Run every op/scope/dtype on the GPU and compare with the CPU reference");
  auto filter = std::make_shared<std::string>();
  auto seed = std::make_shared<uint64_t>(1234);
  auto allow_missing = std::make_shared<bool>(false);
  auto only_list = std::make_shared<bool>(false);
  auto spec_list = std::make_shared<bool>(false);
  cmd->add_option("--op", *filter, "Check only this op");
  cmd->add_option("--seed", *seed, "Random seed for the inputs");
  cmd->add_flag("--allow-missing", *allow_missing, "Ops without a CUDA kernel do not fail");
  cmd->add_flag("--list-missing", *only_list, "Only list ops without CUDA kernels");
  cmd->add_flag("--list-spec", *spec_list,
                "Only list each op's crosscheck case count and the outputs compared to rounding");
  cmd->callback([filter, seed, allow_missing, only_list, spec_list] {
    if (*spec_list) {
      list_spec();
      std::exit(0);
    }
    if (*only_list) std::exit(list_missing() > 0 && !*allow_missing ? 1 : 0);
    if (!cuda_available()) {
      std::printf("qat crosscheck: no CUDA device present (or built without CUDA); skipped\n");
      std::exit(0);
    }
    std::printf("%-30s %-40s %-5s %-8s %-10s %s\n", "op", "case", "dtype", "result", "max err",
                "checked");
    std::map<std::string, int> counts;
    std::set<std::string> missing;
    for (const OpCase& oc : all_cases(*filter)) {
      const CrosscheckCase& c = oc.c;
      for (DType dtype : kFloatDTypes) {
        if (c.float_only && dtype != DType::f32) continue;
        Built b;
        std::string why;
        bool ok = build(oc, dtype, 0, *seed, b, why);
        if (!ok) {
          b = Built{};
          ok = build(oc, dtype, 1, *seed, b, why);
        }
        std::string result, note, err = "-";
        if (!ok) {
          result = "n/a";
          note = why;
        } else if (auto m = missing_kernels(b.graph); !m.empty()) {
          result = "MISSING";
          for (const auto& s : m) {
            note += s + " ";
            missing.insert(s);
          }
        } else {
          CrosscheckReport r;
          try {
            r = crosscheck(b.graph, b.feeds);
          } catch (const Error& e) {
            r.passed = false;
            CrosscheckMismatch m;
            m.detail = e.what();
            r.first = m;
          }
          result = r.passed ? (r.both_raised ? "raised" : "pass") : "FAIL";
          char buf[32];
          std::snprintf(buf, sizeof buf, "%.2e", r.max_error);
          err = buf;
          note = std::to_string(r.nodes_checked) + " nodes, " + std::to_string(r.values_compared) +
                 " values";
          if (r.both_raised) note = "both backends raised";
          if (!r.passed && r.first) note = r.first->str();
        }
        ++counts[result];
        std::printf("%-30s %-40s %-5s %-8s %-10s %s\n", oc.op.c_str(),
                    c.label.substr(0, 40).c_str(), dtype_name(dtype), result.c_str(), err.c_str(),
                    note.c_str());
      }
    }
    std::printf("\ncrosscheck summary:");
    for (const auto& [k, v] : counts) std::printf(" %s=%d", k.c_str(), v);
    std::printf("\n");
    if (!missing.empty()) {
      std::printf("ops without CUDA kernels:");
      for (const auto& s : missing) std::printf(" %s", s.c_str());
      std::printf("\n");
    }
    bool failed = counts["FAIL"] > 0 || (counts["MISSING"] > 0 && !*allow_missing);
    std::exit(failed ? 1 : 0);
  });
}

}  // namespace qg::cli
