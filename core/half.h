// 16-bit float element types for CPU kernels. Eigen's half and bfloat16 convert exactly as
// core/half_bits.h defines (round to nearest even, one quiet NaN per sign), the definition
// the CUDA kernels convert with too, so the two backends agree bit for bit.
#pragma once

#include <Eigen/Core>

#include "core/half_bits.h"
#include "core/tensor.h"

namespace qg {

using f16 = Eigen::half;
using bf16 = Eigen::bfloat16;

template <>
struct DTypeOf<Eigen::half> {
  static constexpr DType value = DType::f16;
};
template <>
struct DTypeOf<Eigen::bfloat16> {
  static constexpr DType value = DType::bf16;
};

// The type quantization math runs in: f64 for f64 data, f32 for everything narrower.
template <typename T>
struct MathType {
  using type = float;
};
template <>
struct MathType<double> {
  using type = double;
};
template <typename T>
using math_t = typename MathType<T>::type;

// Calls fn(T{}) with T the C++ type of a floating dtype; throws for anything else.
template <typename Fn>
auto dispatch_float(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      return fn(float{});
    case DType::f64:
      return fn(double{});
    case DType::f16:
      return fn(f16{});
    case DType::bf16:
      return fn(bf16{});
    default:
      break;
  }
  QG_FAIL(op, "expected a floating dtype (f32, f64, f16, bf16), got ", dtype_name(dtype));
}

// Calls fn(T{}) for any of the nine dtypes.
template <typename Fn>
auto dispatch_any(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      return fn(float{});
    case DType::f64:
      return fn(double{});
    case DType::f16:
      return fn(f16{});
    case DType::bf16:
      return fn(bf16{});
    case DType::i8:
      return fn(int8_t{});
    case DType::u8:
      return fn(uint8_t{});
    case DType::i32:
      return fn(int32_t{});
    case DType::i64:
      return fn(int64_t{});
    case DType::boolean:
      return fn(bool{});
  }
  QG_FAIL("dtype", "unhandled dtype");
}

}  // namespace qg
