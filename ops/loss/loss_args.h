// The parsed arguments of softmax_cross_entropy and its backward op, shared by their CPU and
// CUDA kernels.
#pragma once

#include <memory>
#include <type_traits>

#include "core/dtype.h"
#include "core/kernel_args.h"

namespace qg {

// The loss's dtype: f32 for f32, f16 and bf16 logits, f64 for f64. A 16-bit loss would keep
// three significant digits of a value every training loop reports and compares; torch's
// autocast computes cross-entropy in f32 for the same reason. dloss has the loss's dtype.
inline DType cross_entropy_loss_dtype(DType logits) {
  return logits == DType::f64 ? DType::f64 : DType::f32;
}
template <typename T>
using cross_entropy_loss_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

struct CrossEntropyArgs : KernelArgs {
  bool mean = true;  // reduction "mean": rows are averaged, else summed
};

inline std::shared_ptr<const KernelArgs> parse_cross_entropy_args(const ArgsSource& s) {
  auto args = std::make_shared<CrossEntropyArgs>();
  args->mean = s.attrs.get_string("reduction") == "mean";
  return args;
}

}  // namespace qg
