// The typed half of the kernel ABI: what a kernel knows about its call besides the tensors.
// An op's attributes are parsed and checked once, when the node (or a direct call) is
// prepared, into the op's own struct derived from KernelArgs; the kernel then reads plain
// fields instead of looking attributes up by name on every call (for an op with a parser,
// KernelContext::attrs is empty). A fused node's kernel gets the prepared form of each node
// it was made of, in order (its parts), with their parsed arguments, and never the graph.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/attrs.h"
#include "core/tensor_type.h"

namespace qg {

struct OpDef;

// Base of every op's parsed-arguments struct.
struct KernelArgs {
  virtual ~KernelArgs() = default;
};

struct PreparedArgs;

// One node a fused node was made of, prepared: its op, resolved attributes, input types and
// parsed arguments. The member names match Node's, so fused kernels read `part.op->name` and
// `part.attrs` as they read the original node.
struct KernelPart {
  const OpDef* op = nullptr;
  Attrs attrs;
  std::vector<TensorType> inputs;
  std::shared_ptr<const PreparedArgs> prepared;
  size_t num_states = 0;  // how many of the fused node's states are this part's

  // The part's parsed arguments as its op's struct (qg::Error when its op parsed none or
  // another type: a registration mistake, not a user error).
  template <typename A>
  const A& args() const;
};

// Everything prepared once for one kernel call site.
struct PreparedArgs {
  std::shared_ptr<const KernelArgs> parsed;  // the op's struct; null when it declares no parser
  std::vector<KernelPart> parts;             // a fused node's original nodes; empty otherwise
};

// What an op's parser reads: its resolved attributes and input types (shapes included, so a
// parser may precompute layouts), and, for a fused op, its prepared parts.
struct ArgsSource {
  const std::string& op;
  const Attrs& attrs;
  const std::vector<TensorType>& inputs;
  const std::vector<KernelPart>& parts;
};
using ParseArgsFn = std::function<std::shared_ptr<const KernelArgs>(const ArgsSource&)>;

// The parser of an op whose attributes only shape inference reads (a graph input's declared
// type): its kernels get an empty struct, and still no attribute at run time.
std::shared_ptr<const KernelArgs> no_kernel_args(const ArgsSource& source);

[[noreturn]] void fail_part_args(const KernelPart& part);

// The attribute set a kernel sees in place of its node's once its op has a parser: empty.
const Attrs& no_raw_attrs();

template <typename A>
const A& KernelPart::args() const {
  const A* a = prepared ? dynamic_cast<const A*>(prepared->parsed.get()) : nullptr;
  if (a == nullptr) fail_part_args(*this);
  return *a;
}

// Runs `op`'s parser (if any) over already-resolved attributes. Throws the parser's qg::Error.
std::shared_ptr<const PreparedArgs> prepare_args(const OpDef& op, const Attrs& attrs,
                                                 const std::vector<TensorType>& inputs,
                                                 std::vector<KernelPart> parts = {});

}  // namespace qg
