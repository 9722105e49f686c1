#include "runtime/op_call.h"

#include <algorithm>

#include "core/error.h"

namespace qg {
namespace {

std::string join_names(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

PreparedOp::PreparedOp(const std::string& op, const Attrs& attrs, std::vector<TensorType> inputs,
                       DeviceType device, const OpRegistry& registry)
    : def_(&registry.get(op)), inputs_(std::move(inputs)), device_(device) {
  QG_CHECK(!def_->is_source, op,
           "is a graph source op (it hands out fed or stored values); "
           "there is no kernel to call directly");
  QG_CHECK(def_->variadic ? inputs_.size() >= def_->inputs.size()
                          : inputs_.size() == def_->inputs.size(),
           op, "expects ", def_->inputs.size(), def_->variadic ? " or more" : "", " inputs (",
           join_names(def_->inputs), "), got ", inputs_.size());
  attrs_ = resolve_attrs(*def_, attrs);
  std::vector<const Tensor*> no_constants(inputs_.size(), nullptr);
  InferContext infer{def_->name, inputs_, attrs_, no_constants};
  outputs_ = def_->infer(infer);
  QG_CHECK(outputs_.size() == def_->outputs.size(), op, "shape inference returned ",
           outputs_.size(), " outputs for ", def_->outputs.size(), " declared");
  if (def_->states) states_ = def_->states(infer);
  std::vector<DType> key;
  for (const TensorType& t : inputs_) key.push_back(t.dtype);
  kernel_ = def_->find_kernel(device, key);
  QG_CHECK(kernel_ != nullptr, op, "has no ", device_type_name(device), " kernel for inputs ",
           signature_str(key, def_->inputs));
  prepared_ = prepare_args(*def_, attrs_, inputs_);
}

std::vector<Tensor> PreparedOp::initial_states(Device device) const {
  std::vector<Tensor> states;
  for (const StateSpec& spec : states_) {
    Tensor host = Tensor::empty(spec.type.shape, spec.type.dtype);
    host.fill(spec.init);
    states.push_back(host.to(device));
  }
  return states;
}

void PreparedOp::check_operand(const char* what, size_t i, const std::string& name, const Tensor& t,
                               const TensorType& type, Device device, bool need_contiguous) const {
  const std::string& op = def_->name;
  QG_CHECK(t.defined(), op, what, " ", i, " ('", name, "') is undefined");
  QG_CHECK(t.dtype() == type.dtype && t.shape() == type.shape, op, what, " ", i, " ('", name,
           "') is ", dtype_name(t.dtype()), shape_str(t.shape()), ", prepared for ", type.str());
  QG_CHECK(t.device() == device, op, what, " ", i, " ('", name, "') is on ", t.device().str(),
           ", the call runs on ", device.str());
  QG_CHECK(!need_contiguous || t.is_contiguous(), op, what, " ", i, " ('", name,
           "') is strided (strides ", shape_str(t.strides()), " for shape ", shape_str(t.shape()),
           "); this kernel needs a contiguous tensor");
}

std::vector<Tensor> PreparedOp::run(DeviceContext& context, const std::vector<Tensor>& inputs,
                                    std::vector<Tensor>& states, bool training,
                                    std::vector<Tensor> outputs) const {
  const std::string& op = def_->name;
  const Device device = context.device();
  QG_CHECK(device.type == device_, op, "prepared for ", device_type_name(device_),
           " but called with a context on ", device.str());
  QG_CHECK(inputs.size() == inputs_.size(), op, "expects ", inputs_.size(), " inputs, got ",
           inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i)
    check_operand("input", i, def_->inputs[std::min(i, def_->inputs.size() - 1)], inputs[i],
                  inputs_[i], device, !kernel_->strided);
  QG_CHECK(states.size() == states_.size(), op, "expects ", states_.size(), " states, got ",
           states.size());
  for (size_t i = 0; i < states.size(); ++i)
    check_operand("state", i, states_[i].name, states[i], states_[i].type, device, true);
  if (outputs.empty()) {
    for (const TensorType& t : outputs_) outputs.push_back(Tensor::empty(t.shape, t.dtype, device));
  } else {
    QG_CHECK(outputs.size() == outputs_.size(), op, "expects ", outputs_.size(),
             " output tensors, got ", outputs.size());
    for (size_t i = 0; i < outputs.size(); ++i)
      check_operand("output", i, def_->outputs[i], outputs[i], outputs_[i], device, true);
  }
  context.make_current();
  KernelContext ctx(op, *prepared_, attrs_, inputs, std::move(outputs), states, context, training);
  kernel_->fn(ctx);
  context.check_launch(op);
  for (size_t i = 0; i < ctx.outputs.size(); ++i) {
    const Tensor& got = ctx.outputs[i];
    QG_CHECK(got.defined() && got.dtype() == outputs_[i].dtype &&
                 got.shape() == outputs_[i].shape && got.device() == device,
             op, "kernel produced ", got.defined() ? got.str() : "nothing", " for output '",
             def_->outputs[i], "' declared ", outputs_[i].str(), " on ", device.str());
  }
  return std::move(ctx.outputs);
}

std::vector<Tensor> call_op(DeviceContext& context, const std::string& op,
                            const std::vector<Tensor>& inputs, const Attrs& attrs,
                            std::vector<Tensor>* states, bool training) {
  std::vector<TensorType> types;
  for (const Tensor& t : inputs) {
    QG_CHECK(t.defined(), op, "an input tensor is undefined");
    types.push_back(TensorType{t.dtype(), t.shape()});
  }
  PreparedOp prepared(op, attrs, types, context.device().type);
  std::vector<Tensor> own_states;
  if (states == nullptr) {
    own_states = prepared.initial_states(context.device());
    states = &own_states;
  }
  std::vector<Tensor> outputs = prepared.run(context, inputs, *states, training);
  context.check_errors(nullptr);
  return outputs;
}

}  // namespace qg
