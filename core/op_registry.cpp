#include "core/op_registry.h"

#include <algorithm>

#include "core/error.h"

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

const KernelDef* OpDef::find_kernel(DeviceType device, DType dtype) const {
  for (const auto& k : kernels) {
    if (k.device != device) continue;
    if (k.dtypes.empty() || std::find(k.dtypes.begin(), k.dtypes.end(), dtype) != k.dtypes.end())
      return &k;
  }
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

bool OpRegistry::supports(const std::string& op, DeviceType device, DType dtype) const {
  const OpDef* d = find(op);
  return d != nullptr && d->find_kernel(device, dtype) != nullptr;
}

void OpRegistry::self_check() const {
  std::string problems;
  for (const auto& [name, d] : ops_) {
    auto fail = [&](const std::string& what) { problems += "\n  " + name + ": " + what; };
    if (!d->infer) fail("no shape inference");
    if (d->find_kernel(DeviceType::cpu, DType::f32) == nullptr &&
        std::none_of(d->kernels.begin(), d->kernels.end(),
                     [](const KernelDef& k) { return k.device == DeviceType::cpu; }))
      fail("no CPU reference kernel");
    if (!d->differentiable_inputs.empty() && d->differentiable_inputs.size() != d->inputs.size())
      fail("differentiable_inputs has " + std::to_string(d->differentiable_inputs.size()) +
           " entries for " + std::to_string(d->inputs.size()) + " inputs");
    if (d->is_differentiable() && !d->backward) fail("differentiable but has no backward rule");
    if (d->is_differentiable() && !d->gradcheck_samples)
      fail("differentiable but has no gradient-check sample");
    for (const auto& k : d->kernels)
      if (!k.fn) fail(std::string("empty ") + device_type_name(k.device) + " kernel");
  }
  QG_CHECK(problems.empty(), "op_registry", "self-check failed:", problems);
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
