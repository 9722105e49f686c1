// The declaration of an op: its schema (inputs, outputs, typed attributes with validation),
// shape/dtype inference, persistent state, kernels per backend, backward rule and
// gradient-check samples. Each op is declared once, in its family folder under ops/.
#pragma once

#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "core/attrs.h"
#include "core/fusion_rule.h"
#include "core/kernel_args.h"
#include "core/tensor.h"
#include "core/tensor_type.h"

namespace qg {

using NodeId = int32_t;
using ValueId = int32_t;
inline constexpr ValueId kNoValue = -1;

class DeviceContext;  // device/device_context.h: the layer above core, seen here by name only
class Graph;
struct Node;

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

// The untyped adapter every kernel is called through: the tensors, the arguments parsed
// once when the call site was prepared, the node's persistent state and the device context.
// It holds no graph and no node, so a kernel runs the same under an executor, a static run
// or a direct call (runtime/op_call.h).
struct KernelContext {
  KernelContext(const std::string& op_name, const PreparedArgs& prepared_args,
                const Attrs& resolved_attrs, std::vector<Tensor> input_tensors,
                std::vector<Tensor> output_tensors, std::vector<Tensor>& state_tensors,
                DeviceContext& device_context, bool is_training = true)
      : op(op_name),
        prepared(prepared_args),
        attrs(prepared_args.parsed ? no_raw_attrs() : resolved_attrs),
        inputs(std::move(input_tensors)),
        outputs(std::move(output_tensors)),
        states(state_tensors),
        training(is_training),
        device(device_context) {}

  const std::string& op;
  const PreparedArgs& prepared;
  // Resolved (defaults filled in, validated) for an op that declares no parser; empty for one
  // that does, so its kernels read its parsed struct (args<T>()) and never an attribute by
  // name: a read throws "attribute ... is not set".
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
  // Who the caller knows this call as: a node id, recorded with the failures a GPU kernel
  // cannot throw so the report names the node (-1 for a direct call), and the node's name.
  int32_t site = -1;
  const std::string* site_name = nullptr;
  const std::string& label() const { return site_name != nullptr ? *site_name : op; }

  // The op's parsed arguments as its own struct (qg::Error when the op parsed none or
  // another type: a registration mistake, not a user error).
  template <typename A>
  const A& args() const {
    const A* a = dynamic_cast<const A*>(prepared.parsed.get());
    QG_CHECK(a != nullptr, op, "kernel asked for arguments the op's parser did not produce");
    return *a;
  }
  // A fused node's original node `i`, prepared (qg::Error past the last).
  const KernelPart& part(size_t i) const;
  size_t num_parts() const { return prepared.parts.size(); }
};
using KernelFn = std::function<void(KernelContext&)>;

// The input dtype signatures a kernel accepts: one set of dtypes per input position, where
// an empty set (or a position past the listed ones) accepts any dtype. Built from a single
// list it constrains input 0 only, which keeps the common registration terse: most ops'
// shape inference already ties their other inputs to input 0. Ops whose inputs vary
// independently list every position (for_inputs) or register one kernel per combination.
// Source ops have no inputs, so only a signature that constrains nothing matches them.
struct KernelDTypes {
  std::vector<std::vector<DType>> per_input;

  KernelDTypes() = default;  // any inputs
  KernelDTypes(std::initializer_list<DType> input0) : KernelDTypes(std::vector<DType>(input0)) {}
  KernelDTypes(std::vector<DType> input0) {  // NOLINT: implicit, so rows stay short
    if (!input0.empty()) per_input.push_back(std::move(input0));
  }
  static KernelDTypes for_inputs(std::vector<std::vector<DType>> sets);

  bool accepts(const std::vector<DType>& input_dtypes) const;
  // The accepted set at one position; empty means any dtype.
  const std::vector<DType>& at(size_t position) const;
  // "(x: f32|f64, scale: any)" with the op's input names.
  std::string str(const std::vector<std::string>& input_names) const;
};

struct KernelDef {
  DeviceType device = DeviceType::cpu;
  KernelDTypes dtypes;  // the input signatures this kernel accepts
  KernelFn fn;
  // Reads its inputs through their strides (slices, permutes). Other kernels are handed
  // contiguous inputs only: graph values always are, and a direct call with a strided input
  // is refused with an error naming the input.
  bool strided = false;
};

// The dtypes of a kernel's inputs, in order: the key kernels are looked up by.
std::vector<DType> dtypes_of(const std::vector<Tensor>& tensors);
// "(x: f32, scale: f32, zero_point: i32)": a signature with the op's input names.
std::string signature_str(const std::vector<DType>& input_dtypes,
                          const std::vector<std::string>& input_names);

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

// One `qat crosscheck` case beyond the op's gradient-check samples: a graph of the op on
// inputs drawn as for gradcheck (an f64 input takes the case's dtype, f32/f64/f16/bf16;
// other dtypes are kept) with `attrs`, run on the GPU and checked against the CPU.
struct CrosscheckCase {
  std::string label;
  std::vector<GradcheckInput> inputs;
  Attrs attrs;
  bool backward = false;  // also build the gradient graph of output `output`
  int output = 0;
  int steps = 2;
  bool float_only = false;  // f32 only (cases that pin exact f32 values)
};
struct CrosscheckSpec {
  std::function<std::vector<CrosscheckCase>()> cases;
  // Outputs that agree with the CPU to rounding, not bit for bit (float reductions summed in
  // another order, transcendental functions of another libm), compared by relative error:
  // their indices, or -1 for every output. Empty: every output is compared bit for bit.
  std::vector<int> rounded_outputs;
  // Why those outputs cannot be bit-identical: required with rounded_outputs, so a comparison
  // is never loosened without a reason beside the op's definition.
  std::string rounded_reason;
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
  // Parses the resolved attributes (and input types) into the op's KernelArgs struct, once
  // per call site; kernels read it through KernelContext::args<T>(). Every op that declares
  // attributes and has kernels sets one (tests/core/op_registry_test.cpp checks).
  ParseArgsFn parse_args;
  std::vector<KernelDef> kernels;
  BackwardFn backward;
  std::function<std::vector<GradcheckSample>()> gradcheck_samples;
  // The rules that make this (fused) op out of ordinary nodes; runtime/passes runs them in
  // its one ordered table, by name.
  std::vector<FusionRule> fusion_rules;
  CrosscheckSpec crosscheck;  // GPU-vs-CPU cases and comparison (runtime/crosscheck.h)
  bool side_effects = false;  // runs even when no fetched value needs it (optimizer steps)
  bool is_source = false;     // graph inputs, parameters, constants
  // Runs asynchronously (a collective on its own stream, all_reduce): the execution order
  // issues it as soon as its inputs are ready and runs the nodes that depend on its outputs as
  // late as it can, so the collective overlaps the work that does not need it
  // (Graph::topological_order).
  bool overlaps_async = false;
  // The last declared input repeats: a node passes it one or more times (clip_grad_norm
  // reads every parameter gradient). Positions past the declared names take its name.
  bool variadic = false;
  // Output 0 is a view of input 0 (reshape, stop_gradient): the memory planner gives it no
  // buffer of its own and keeps input 0's buffer alive as long as the view is read.
  bool aliases_input = false;
  // Has no CUDA kernel by design. In a CUDA build the registry self-check fails for any
  // other op with a CPU kernel and no CUDA kernel.
  bool cpu_only = false;
  // Dtypes whose CPU kernels have no CUDA counterpart by design. The self-check otherwise
  // requires every dtype a CPU kernel accepts at an input position to be accepted by a CUDA
  // kernel at that position.
  std::vector<DType> cpu_only_dtypes;

  bool is_differentiable() const;
  const AttrSpec* find_attr(const std::string& attr) const;
  // The first kernel of `device` whose signature accepts the input dtypes.
  const KernelDef* find_kernel(DeviceType device, const std::vector<DType>& input_dtypes) const;
};

}  // namespace qg
