// The declaration of an op: its schema (inputs, outputs, typed attributes with validation),
// shape/dtype inference, persistent state, kernels per backend, backward rule and
// gradient-check samples. Each op is declared once, in its family folder under ops/.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/attrs.h"
#include "core/tensor.h"

namespace qg {

using NodeId = int32_t;
using ValueId = int32_t;
inline constexpr ValueId kNoValue = -1;

class DeviceContext;  // device/device_context.h: the layer above core, seen here by name only
class Graph;
struct Node;

struct TensorType {
  DType dtype = DType::f32;
  Shape shape;
  int64_t numel() const { return shape_numel(shape); }
  std::string str() const { return std::string(dtype_name(dtype)) + shape_str(shape); }
  bool operator==(const TensorType& o) const { return dtype == o.dtype && shape == o.shape; }
};

struct AttrSpec {
  std::string name;
  AttrType type = AttrType::integer;
  std::optional<Attr> default_value;  // unset and not optional: the attribute is required
  std::string doc;
  bool optional = false;  // may be left unset (no default)
  // Throws qg::Error (naming the op, attribute and value) when the value is invalid.
  std::function<void(const std::string& op, const Attr& value)> validate;
};

// What shape inference sees: the op's name, its input types, its attributes (defaults
// filled in) and, for inputs produced by constant nodes, their values.
struct InferContext {
  const std::string& op;
  const std::vector<TensorType>& inputs;
  const Attrs& attrs;
  const std::vector<const Tensor*>& constant_inputs;
};
using InferFn = std::function<std::vector<TensorType>(const InferContext&)>;

// A persistent tensor owned by a node (observer statistics, parameters, flags). It lives
// on the node's device and survives between executor runs.
struct StateSpec {
  std::string name;
  TensorType type;
  double init = 0.0;
};
using StateFn = std::function<std::vector<StateSpec>(const InferContext&)>;

struct KernelContext {
  const std::string& op;
  const Node& node;
  const Attrs& attrs;
  std::vector<Tensor> inputs;
  // Preallocated with the inferred types. A kernel may replace one with another tensor of
  // the same type (a parameter node hands out its state without a copy).
  std::vector<Tensor> outputs;
  std::vector<Tensor>& states;
  bool training = true;
  // The device state the kernel runs with: stream, library handles, error buffer, precision
  // flags. The caller owns it: an executor's backend, or whoever calls the kernel directly.
  DeviceContext& device;
  const Tensor* feed = nullptr;  // for `input` nodes: the tensor fed by name, if any
};
using KernelFn = std::function<void(KernelContext&)>;

struct KernelDef {
  DeviceType device = DeviceType::cpu;
  std::vector<DType>
      dtypes;  // accepted dtypes of input 0 (or output 0 for source ops); empty = any
  KernelFn fn;
};

// Given the forward node and the gradients of its outputs (kNoValue where an output gets
// none), a backward rule appends ordinary graph nodes and returns one gradient per input
// (kNoValue for inputs that are not differentiable or get no gradient).
struct BackwardContext {
  Graph& graph;
  const Node& node;  // a copy owned by the autograd pass, safe while the graph grows
  std::vector<ValueId> output_grads;
  std::vector<bool> needs_input_grad;
  ValueId grad_or_zeros(int output) const;  // zeros shaped like the output when no grad
};
using BackwardFn = std::function<std::vector<ValueId>(BackwardContext&)>;

// One gradient-check case. Inputs are drawn in f64 from `low`..`high` unless `values` is
// given. `reference` (if set) returns the expected input gradients for the straight-through
// rules of non-smooth ops; otherwise central differences are the oracle.
struct GradcheckInput {
  GradcheckInput(Shape s = {}, DType d = DType::f64, double lo = -1.0, double hi = 1.0,
                 std::vector<double> v = {})
      : shape(std::move(s)), dtype(d), low(lo), high(hi), values(std::move(v)) {}
  Shape shape;
  DType dtype;
  double low, high;
  std::vector<double> values;  // fixed values, overriding the random draw
};
// Receives the inputs, the output gradient and the resolved attributes.
using ReferenceGradFn = std::function<std::vector<Tensor>(
    const std::vector<Tensor>& inputs, const Tensor& output_grad, const Attrs& attrs)>;
struct GradcheckSample {
  GradcheckSample(std::string l = "", std::vector<GradcheckInput> in = {}, Attrs a = {})
      : label(std::move(l)), inputs(std::move(in)), attrs(std::move(a)) {}
  std::string label;
  std::vector<GradcheckInput> inputs;
  Attrs attrs;
  ReferenceGradFn reference;  // set for non-smooth ops
  double tolerance = 1e-6;
  double step = 1e-6;  // central-difference step
  int output = 0;      // which output the loss is built from
};

struct OpDef {
  std::string name;
  std::string doc;
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  std::vector<AttrSpec> attrs;
  std::vector<bool> differentiable_inputs;  // empty: the op is not differentiable
  InferFn infer;
  StateFn states;
  std::vector<KernelDef> kernels;
  BackwardFn backward;
  std::function<std::vector<GradcheckSample>()> gradcheck_samples;
  bool side_effects = false;  // runs even when no fetched value needs it (optimizer steps)
  bool is_source = false;     // graph inputs, parameters, constants
  // Output 0 is a view of input 0 (reshape, stop_gradient): the memory planner gives it no
  // buffer of its own and keeps input 0's buffer alive as long as the view is read.
  bool aliases_input = false;

  bool is_differentiable() const;
  const AttrSpec* find_attr(const std::string& attr) const;
  const KernelDef* find_kernel(DeviceType device, DType dtype) const;
};

}  // namespace qg
