#include "core/op_registry.h"

#include <algorithm>
#include <exception>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/graph.h"

namespace qg {

bool OpDef::is_differentiable() const {
  return std::any_of(differentiable_inputs.begin(), differentiable_inputs.end(),
                     [](bool b) { return b; });
}

const AttrSpec* OpDef::find_attr(const std::string& attr) const {
  for (const auto& a : attrs)
    if (a.name == attr) return &a;
  return nullptr;
}

KernelDTypes KernelDTypes::for_inputs(std::vector<std::vector<DType>> sets) {
  KernelDTypes k;
  k.per_input = std::move(sets);
  return k;
}

const std::vector<DType>& KernelDTypes::at(size_t position) const {
  static const std::vector<DType> any;
  return position < per_input.size() ? per_input[position] : any;
}

bool KernelDTypes::accepts(const std::vector<DType>& input_dtypes) const {
  for (size_t i = 0; i < per_input.size(); ++i) {
    const std::vector<DType>& set = per_input[i];
    if (set.empty()) continue;
    if (i >= input_dtypes.size()) return false;
    if (std::find(set.begin(), set.end(), input_dtypes[i]) == set.end()) return false;
  }
  return true;
}

namespace {
std::string input_name(const std::vector<std::string>& names, size_t i) {
  return i < names.size() ? names[i] : "input " + std::to_string(i);
}
}  // namespace

std::string KernelDTypes::str(const std::vector<std::string>& input_names) const {
  if (std::all_of(per_input.begin(), per_input.end(),
                  [](const std::vector<DType>& set) { return set.empty(); }))
    return "(any)";
  std::string out = "(";
  for (size_t i = 0; i < per_input.size(); ++i) {
    out += (i ? ", " : "") + input_name(input_names, i) + ": ";
    if (per_input[i].empty()) out += "any";
    for (size_t j = 0; j < per_input[i].size(); ++j)
      out += std::string(j ? "|" : "") + dtype_name(per_input[i][j]);
  }
  return out + ")";
}

std::vector<DType> dtypes_of(const std::vector<Tensor>& tensors) {
  std::vector<DType> dtypes;
  dtypes.reserve(tensors.size());
  for (const Tensor& t : tensors) dtypes.push_back(t.dtype());
  return dtypes;
}

std::string signature_str(const std::vector<DType>& input_dtypes,
                          const std::vector<std::string>& input_names) {
  std::string out = "(";
  for (size_t i = 0; i < input_dtypes.size(); ++i)
    out += (i ? ", " : "") + input_name(input_names, i) + ": " + dtype_name(input_dtypes[i]);
  return out + ")";
}

const KernelDef* OpDef::find_kernel(DeviceType device,
                                    const std::vector<DType>& input_dtypes) const {
  for (const auto& k : kernels)
    if (k.device == device && k.dtypes.accepts(input_dtypes)) return &k;
  return nullptr;
}

OpDef& OpRegistry::define(const std::string& name) {
  QG_CHECK(ops_.count(name) == 0, name, "op '", name, "' is defined twice");
  auto def = std::make_unique<OpDef>();
  def->name = name;
  OpDef& ref = *def;
  ops_[name] = std::move(def);
  return ref;
}

const OpDef& OpRegistry::get(const std::string& name) const {
  const OpDef* d = find(name);
  QG_CHECK(d != nullptr, name, "unknown op '", name, "'");
  return *d;
}

OpDef& OpRegistry::get_mutable(const std::string& name) {
  auto it = ops_.find(name);
  QG_CHECK(it != ops_.end(), name, "unknown op '", name, "'");
  return *it->second;
}

const OpDef* OpRegistry::find(const std::string& name) const {
  auto it = ops_.find(name);
  return it == ops_.end() ? nullptr : it->second.get();
}

std::vector<const OpDef*> OpRegistry::all() const {
  std::vector<const OpDef*> v;
  for (const auto& [_, d] : ops_) v.push_back(d.get());
  return v;
}

bool OpRegistry::supports(const std::string& op, DeviceType device,
                          const std::vector<DType>& input_dtypes) const {
  const OpDef* d = find(op);
  return d != nullptr && d->find_kernel(device, input_dtypes) != nullptr;
}

namespace {

bool has_kernel(const OpDef& op, DeviceType device) {
  return std::any_of(op.kernels.begin(), op.kernels.end(),
                     [&](const KernelDef& k) { return k.device == device; });
}

// The dtypes some kernel of `device` accepts at input `position`; nullopt when one accepts
// any dtype there.
std::optional<std::set<DType>> accepted_at(const OpDef& op, DeviceType device, size_t position) {
  std::set<DType> out;
  for (const KernelDef& k : op.kernels) {
    if (k.device != device) continue;
    const std::vector<DType>& set = k.dtypes.at(position);
    if (set.empty()) return std::nullopt;
    out.insert(set.begin(), set.end());
  }
  return out;
}

}  // namespace

// Compared position by position, which is cheap and catches a missing dtype; combinations
// of dtypes across positions are not compared.
std::string cuda_dtype_gaps(const OpDef& op, bool include_declared) {
  std::string gaps;
  size_t positions = std::max<size_t>(op.inputs.size(), 1);
  for (const KernelDef& k : op.kernels) positions = std::max(positions, k.dtypes.per_input.size());
  for (size_t i = 0; i < positions; ++i) {
    std::optional<std::set<DType>> cpu = accepted_at(op, DeviceType::cpu, i);
    std::optional<std::set<DType>> cuda = accepted_at(op, DeviceType::cuda, i);
    if (!cuda) continue;  // CUDA accepts anything here
    std::vector<DType> missing;
    if (!cpu) {
      for (int d = 0; d < kDTypeCount; ++d) missing.push_back(static_cast<DType>(d));
    } else {
      missing.assign(cpu->begin(), cpu->end());
    }
    std::string lacking;
    for (DType d : missing) {
      bool declared = std::count(op.cpu_only_dtypes.begin(), op.cpu_only_dtypes.end(), d) != 0;
      if (cuda->count(d) || (declared && !include_declared)) continue;
      lacking += std::string(lacking.empty() ? "" : ", ") + dtype_name(d);
    }
    if (!lacking.empty())
      gaps += std::string(gaps.empty() ? "" : "; ") + input_name(op.inputs, i) + ": " + lacking;
  }
  return gaps;
}

void OpRegistry::self_check() const {
#ifdef QG_WITH_CUDA
  self_check(true);
#else
  self_check(false);
#endif
}

void OpRegistry::self_check(bool require_cuda_kernels) const {
  std::string problems;
  for (const auto& [name, d] : ops_) {
    auto fail = [&](const std::string& what) { problems += "\n  " + name + ": " + what; };
    if (!d->infer) fail("no shape inference");
    if (!has_kernel(*d, DeviceType::cpu)) fail("no CPU reference kernel");
    if (!d->differentiable_inputs.empty() && d->differentiable_inputs.size() != d->inputs.size())
      fail("differentiable_inputs has " + std::to_string(d->differentiable_inputs.size()) +
           " entries for " + std::to_string(d->inputs.size()) + " inputs");
    if (d->is_differentiable() && !d->backward) fail("differentiable but has no backward rule");
    if (d->is_differentiable() && !d->gradcheck_samples)
      fail("differentiable but has no gradient-check sample");
    for (const auto& k : d->kernels)
      if (!k.fn) fail(std::string("empty ") + device_type_name(k.device) + " kernel");
    if (d->cpu_only && has_kernel(*d, DeviceType::cuda))
      fail("declared cpu_only but has a CUDA kernel");
    if (!require_cuda_kernels || d->cpu_only || !has_kernel(*d, DeviceType::cpu)) continue;
    if (!has_kernel(*d, DeviceType::cuda)) {
      fail(
          "has a CPU kernel and no CUDA kernel (register one in its family, or declare the op "
          "cpu_only)");
      continue;
    }
    std::string gaps = cuda_dtype_gaps(*d);
    if (!gaps.empty())
      fail("CUDA kernels lack dtypes the CPU kernels accept (" + gaps +
           "); add them or list them in cpu_only_dtypes");
  }
  QG_CHECK(problems.empty(), "op_registry", "self-check failed:", problems);
}

namespace {

// Every defined input and state must sit on the one CUDA device the op runs on: inputs
// spread over several devices are "mixed devices"; inputs all on the host (or on another
// device than the outputs the executor allocated) are "on the wrong device". Source ops
// allocate their outputs on the host and hand out states, so they are exempt.
void check_devices(const OpDef& op, const KernelContext& ctx) {
  std::set<std::pair<int, int>> inputs;
  std::ostringstream where;
  auto key = [](const Tensor& t) {
    return std::make_pair(static_cast<int>(t.device().type), t.device().index);
  };
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    const Tensor& t = ctx.inputs[i];
    if (!t.defined()) continue;
    inputs.insert(key(t));
    where << " input '" << (i < op.inputs.size() ? op.inputs[i] : std::to_string(i)) << "' "
          << t.str() << ";";
  }
  for (size_t i = 0; i < ctx.states.size(); ++i) {
    const Tensor& t = ctx.states[i];
    if (!t.defined()) continue;
    inputs.insert(key(t));
    where << " state " << i << " " << t.str() << ";";
  }
  if (inputs.size() > 1)
    QG_FAIL(ctx.op,
            "mixed devices in one op (every tensor must be on one CUDA device):", where.str());
  std::set<std::pair<int, int>> outputs;
  for (const Tensor& t : ctx.outputs)
    if (t.defined()) outputs.insert(key(t));
  bool host_input = !inputs.empty() && inputs.begin()->first == static_cast<int>(DeviceType::cpu);
  bool elsewhere = !inputs.empty() && !outputs.empty() && inputs != outputs;
  if (host_input || elsewhere || outputs.size() > 1) {
    for (const Tensor& t : ctx.outputs) where << " output " << t.str() << ";";
    QG_FAIL(ctx.op, "tensor on the wrong device for this CUDA kernel:", where.str());
  }
}

}  // namespace

void OpRegistry::add_cuda_device_checks() {
  for (auto& [_, op] : ops_) {
    if (op->is_source) continue;
    for (KernelDef& k : op->kernels) {
      if (k.device != DeviceType::cuda) continue;
      KernelFn inner = k.fn;
      k.fn = [inner, def = op.get()](KernelContext& ctx) {
        check_devices(*def, ctx);
        inner(ctx);
      };
    }
  }
}

Attrs resolve_attrs(const OpDef& op, const Attrs& given) {
  for (const auto& [name, value] : given.items()) {
    const AttrSpec* spec = op.find_attr(name);
    if (spec == nullptr) {
      std::string known;
      for (const auto& a : op.attrs) known += (known.empty() ? "" : ", ") + a.name;
      QG_FAIL(op.name, "unknown attribute '", name, "' = ", value.str(),
              " (known: ", known.empty() ? "none" : known, ")");
    }
    bool ok = value.type() == spec->type ||
              (spec->type == AttrType::real && value.type() == AttrType::integer);
    QG_CHECK(ok, op.name, "attribute '", name, "' must be ", attr_type_name(spec->type), ", got ",
             attr_type_name(value.type()), " ", value.str());
  }
  Attrs out;
  for (const auto& spec : op.attrs) {
    if (given.has(spec.name)) {
      Attr v = given.at(spec.name);
      if (spec.type == AttrType::real && v.type() == AttrType::integer) v = Attr(v.as_real());
      if (spec.validate) spec.validate(op.name, v);
      out.set(spec.name, v);
    } else if (spec.default_value) {
      out.set(spec.name, *spec.default_value);
    } else {
      QG_CHECK(spec.optional, op.name, "required attribute '", spec.name, "' (",
               attr_type_name(spec.type), ") is missing");
    }
  }
  return out;
}

}  // namespace qg
