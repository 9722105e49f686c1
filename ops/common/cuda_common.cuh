// Shared pieces of the CUDA kernels: the device element types of each float dtype and their
// conversion to the math type (f32 for f16/bf16/f32, f64 for f64, as on the CPU), 16-byte
// packs for vectorised loads, the POD view of a quantization scope that kernels can take by
// value, and deterministic block reductions (fixed thread assignment + fixed tree order, so
// the same input always gives the same bits).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "core/half_bits.h"
#include "core/tensor.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/cuda_context.h"
#include "device/cuda/device_error.h"
#include "device/cuda/launch.h"
#include "ops/common/quant_scope.h"

namespace qg::cuda {

template <typename T>
struct Math {
  using type = T;  // float and double compute in themselves
};
template <>
struct Math<__half> {
  using type = float;
};
template <>
struct Math<__nv_bfloat16> {
  using type = float;
};
template <typename T>
using math_of = typename Math<T>::type;

__device__ __forceinline__ float to_math(float v) {
  return v;
}
__device__ __forceinline__ double to_math(double v) {
  return v;
}
// 16-bit floats convert as core/half_bits.h defines, the CPU's bits (NaN encoding included).
__device__ __forceinline__ float to_math(__half v) {
  return half_bits::f16_to_f32(__half_as_ushort(v));
}
__device__ __forceinline__ float to_math(__nv_bfloat16 v) {
  return half_bits::bf16_to_f32(__bfloat16_as_ushort(v));
}

template <typename T>
__device__ __forceinline__ T from_math(math_of<T> v) {
  return static_cast<T>(v);
}
template <>
__device__ __forceinline__ __half from_math<__half>(float v) {
  return __ushort_as_half(half_bits::f32_to_f16(v));
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_math<__nv_bfloat16>(float v) {
  return __ushort_as_bfloat16(half_bits::f32_to_bf16(v));
}

// One rounding from the math type to T: f64 -> f16/bf16 directly (the CPU's narrow_cast in
// ops/int4/narrow_cast.h), otherwise the usual conversion.
template <typename T, typename M>
__device__ __forceinline__ T narrow_to(M v) {
  if constexpr (std::is_same_v<M, double> && std::is_same_v<T, __half>) {
    return __double2half(v);
  } else if constexpr (std::is_same_v<M, double> && std::is_same_v<T, __nv_bfloat16>) {
    return __double2bfloat16(v);
  } else {
    return from_math<T>(static_cast<math_of<T>>(v));
  }
}

// Calls fn(T{}) with T the device element type of a float dtype.
template <typename Fn>
void dispatch_float(DType dtype, const std::string& op, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      return fn(float{});
    case DType::f64:
      return fn(double{});
    case DType::f16:
      return fn(__half{});
    case DType::bf16:
      return fn(__nv_bfloat16{});
    default:
      break;
  }
  QG_FAIL(op, "the CUDA backend has no kernel for dtype ", dtype_name(dtype));
}

// Calls fn(T{}) with T the C++ type of an integer dtype (labels, zero points).
template <typename Fn>
void dispatch_int(DType dtype, const std::string& op, Fn&& fn) {
  switch (dtype) {
    case DType::i8:
      return fn(int8_t{});
    case DType::u8:
      return fn(uint8_t{});
    case DType::i32:
      return fn(int32_t{});
    case DType::i64:
      return fn(int64_t{});
    default:
      break;
  }
  QG_FAIL(op, "expected an integer dtype, got ", dtype_name(dtype));
}

template <typename T>
const T* in_ptr(const Tensor& t) {
  return static_cast<const T*>(t.raw_data());
}
template <typename T>
T* out_ptr(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// N elements loaded or stored as whole 16-byte transactions (N * sizeof(T) is a multiple
// of 16 for every pack used here).
template <typename T, int N>
struct alignas(16) Pack {
  T v[N];
};
template <typename T>
inline constexpr int kVec = 16 / sizeof(T) > 0 ? static_cast<int>(16 / sizeof(T)) : 1;

__device__ __forceinline__ int64_t global_thread() {
  return blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
}
__device__ __forceinline__ int64_t global_stride() {
  return int64_t{gridDim.x} * blockDim.x;
}

// A quantization scope as kernels see it (ScopeLayout without its host-only shape vector).
struct ScopeDims {
  ScopeKind kind;
  int64_t outer, axis_len, inner, group_size, num_groups, num_qparams;
};

inline ScopeDims scope_dims(const ScopeLayout& l) {
  return {l.kind, l.outer, l.axis_len, l.inner, l.group_size, l.num_groups, l.num_qparams};
}

// qparam index of flat element k: the same mapping as qparam_index() in quant_scope.h,
// from the flat index instead of (o, a, i). I is the index type: 32-bit where the kernel
// knows every index fits (cheaper divisions), else int64_t.
template <typename I>
__device__ __forceinline__ I qparam_index_of(const ScopeDims& d, I k) {
  if (d.kind == ScopeKind::tensor) return 0;
  const I inner = static_cast<I>(d.inner), axis_len = static_cast<I>(d.axis_len);
  const I i = k % inner, t = k / inner;
  const I a = t % axis_len, o = t / axis_len;
  switch (d.kind) {
    case ScopeKind::channel:
      return a;
    case ScopeKind::token:
      return o;
    case ScopeKind::group:
      return (o * static_cast<I>(d.num_groups) + a / static_cast<I>(d.group_size)) * inner + i;
    default:
      return 0;
  }
}

__device__ __forceinline__ int64_t qparam_of(const ScopeDims& d, int64_t k) {
  return qparam_index_of<int64_t>(d, k);
}

// Element r (in memory order) of the elements sharing qparam q, for every scope; false when
// r lies past the end of a short tail group.
__device__ __forceinline__ bool scope_element(const ScopeDims& d, int64_t q, int64_t r,
                                              int64_t& k) {
  switch (d.kind) {
    case ScopeKind::tensor:
      k = r;
      return true;
    case ScopeKind::channel:
      k = ((r / d.inner) * d.axis_len + q) * d.inner + r % d.inner;
      return true;
    case ScopeKind::token:
      k = q * d.axis_len * d.inner + r;
      return true;
    default: {
      int64_t i = q % d.inner, t = q / d.inner;
      int64_t g = t % d.num_groups, o = t / d.num_groups;
      int64_t a = g * d.group_size + r;
      k = (o * d.axis_len + a) * d.inner + i;
      return a < d.axis_len;
    }
  }
}

// Elements per qparam (the full group size for the group scope).
inline int64_t elements_per_qparam(const ScopeDims& d) {
  switch (d.kind) {
    case ScopeKind::tensor:
      return d.outer * d.axis_len * d.inner;
    case ScopeKind::channel:
      return d.outer * d.inner;
    case ScopeKind::token:
      return d.axis_len * d.inner;
    default:
      return d.group_size;
  }
}

// Splits of each qparam's elements over blocks for a two-pass reduction: enough blocks to
// fill the device when there are few qparams, none when there are many.
inline int64_t reduction_splits(int64_t num_qparams, int64_t per_q, int threads) {
  int64_t sms = multiprocessor_count();
  if (num_qparams >= 2 * sms || per_q <= threads * 16) return 1;
  int64_t by_size = (per_q + threads * 16 - 1) / (threads * 16);
  int64_t by_occupancy = (4 * sms + num_qparams - 1) / num_qparams;
  return by_size < by_occupancy ? by_size : by_occupancy;
}

// Deterministic block-wide reduction of one value per thread with `combine`, which sees its
// operands in thread order (left, right). Every thread gets the result. blockDim.x must be a
// power of two <= 1024.
template <typename V, typename C>
__device__ V block_reduce(V v, C combine) {
  __shared__ __align__(16) unsigned char raw[1024 * sizeof(V)];
  V* s = reinterpret_cast<V*>(raw);
  s[threadIdx.x] = v;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) s[threadIdx.x] = combine(s[threadIdx.x], s[threadIdx.x + half]);
    __syncthreads();
  }
  V r = s[0];
  __syncthreads();
  return r;
}

// y[i] = f(a[i], b[i]) over same-shape operands, 16-byte packs when all three pointers are
// aligned (nvec packs), then a scalar tail. f works in the math type; y rounds once.
template <typename T, typename F>
__global__ void map2_kernel(const T* a, const T* b, T* y, int64_t n, int64_t nvec, F f) {
  constexpr int N = kVec<T>;
  using P = Pack<T, N>;
  for (int64_t v = global_thread(); v < nvec; v += global_stride()) {
    P pa = reinterpret_cast<const P*>(a)[v], pb = reinterpret_cast<const P*>(b)[v], py;
#pragma unroll
    for (int j = 0; j < N; ++j) py.v[j] = from_math<T>(f(to_math(pa.v[j]), to_math(pb.v[j])));
    reinterpret_cast<P*>(y)[v] = py;
  }
  for (int64_t i = nvec * N + global_thread(); i < n; i += global_stride())
    y[i] = from_math<T>(f(to_math(a[i]), to_math(b[i])));
}

template <typename T, typename F>
void launch_map2(const std::string& op, const void* a, const void* b, void* y, int64_t n, F f,
                 cudaStream_t stream) {
  if (n == 0) return;
  bool vec = aligned16(a) && aligned16(b) && aligned16(y);
  int64_t nvec = vec ? n / kVec<T> : 0;
  auto shape = elementwise_launch(nvec > 0 ? nvec : n);
  map2_kernel<T><<<shape.blocks, shape.threads, 0, stream>>>(
      static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(y), n, nvec, f);
  QG_CUDA_CHECK_LAUNCH(op);
}

struct SumOp {
  __device__ double operator()(double a, double b) const { return a + b; }
};

}  // namespace qg::cuda
