// Tensor: dtype, shape, strides, device and reference-counted storage.
// Kernels see contiguous tensors; strides exist so views (reshape) share storage.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/error.h"

namespace qg {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);
Shape contiguous_strides(const Shape& s);

template <typename T>
struct DTypeOf;  // maps a C++ element type to its DType; half types live in core/half.h
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct DTypeOf<int8_t> {
  static constexpr DType value = DType::i8;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::u8;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::boolean;
};

class Storage {
 public:
  Storage(size_t bytes, Device device);
  // Memory owned by someone else (a NumPy array, a DLPack producer): `owner` keeps it alive
  // and is released with the storage; nothing is freed here.
  Storage(void* data, size_t bytes, Device device, std::shared_ptr<void> owner);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;  // null for borrowed memory
  std::shared_ptr<void> owner_;     // what keeps borrowed memory alive
};

class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  // Zero-filled; works on any device.
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  // A CPU tensor holding `values` converted to `dtype` (any of the nine).
  static Tensor from_doubles(const Shape& shape, const std::vector<double>& values,
                             DType dtype = DType::f32);
  template <typename T>
  static Tensor from_vector(const Shape& shape, const std::vector<T>& values);
  // A contiguous tensor over memory this library does not own, kept alive by `owner` for as
  // long as this tensor or a view of it exists (zero-copy exchange with NumPy / DLPack).
  static Tensor from_external(void* data, const Shape& shape, DType dtype, Device device,
                              std::shared_ptr<void> owner);
  static Tensor scalar(double value, DType dtype = DType::f32) {
    return from_doubles({}, {value}, dtype);
  }

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  Device device() const { return device_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int axis) const;  // negative axis counts from the end
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  bool is_contiguous() const;

  void* raw_data() const;
  template <typename T>
  T* data() const {
    QG_CHECK(DTypeOf<T>::value == dtype_, "tensor", "data<", dtype_name(DTypeOf<T>::value),
             ">() on a tensor of dtype ", dtype_name(dtype_));
    return static_cast<T*>(raw_data());
  }

  // A view with a new shape over the same storage (contiguous tensors only).
  Tensor reshape(const Shape& shape) const;
  // A contiguous tensor of `shape` and `dtype` over this tensor's storage, starting
  // `byte_offset` bytes past this tensor's first byte (memory-planner arenas hand out such
  // views). Throws when it would reach past the end of the storage.
  Tensor view(int64_t byte_offset, const Shape& shape, DType dtype) const;
  // A strided view of the same storage (strides and offset in elements, non-negative):
  // transposes, slices and permutes without a copy. Only kernels registered as strided read
  // such a view; the others are handed contiguous tensors.
  Tensor as_strided(const Shape& shape, const Shape& strides, int64_t offset = 0) const;
  // A deep copy, optionally to another device.
  Tensor to(Device device) const;
  Tensor clone() const { return to(device_); }
  // Element-type conversion on the CPU (round-to-nearest-even for narrowing floats).
  Tensor cast(DType dtype) const;
  // Reads element i (flat, contiguous order) of a CPU tensor as a double.
  double at(int64_t i) const;
  std::vector<double> to_doubles() const;
  void fill(double value);  // CPU only
  std::string str() const;  // "f32[2, 3] on cpu"

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_bytes_ = 0;
  Shape shape_;
  Shape strides_;
  int64_t numel_ = 0;
  DType dtype_ = DType::f32;
  Device device_;
};

template <typename T>
Tensor Tensor::from_vector(const Shape& shape, const std::vector<T>& values) {
  Tensor t = empty(shape, DTypeOf<T>::value);
  QG_CHECK(static_cast<int64_t>(values.size()) == t.numel(), "tensor", "from_vector: shape ",
           shape_str(shape), " needs ", t.numel(), " values, got ", values.size());
  T* p = t.data<T>();
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return t;
}

}  // namespace qg
