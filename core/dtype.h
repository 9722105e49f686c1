// Element types and devices. Kept free of Eigen/CUDA headers so every layer can include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace qg {

enum class DType : uint8_t { f32, f64, f16, bf16, i8, u8, i32, i64, boolean };
inline constexpr int kDTypeCount = 9;

size_t dtype_size(DType t);
const char* dtype_name(DType t);
DType dtype_from_name(const std::string& name);  // throws qg::Error on an unknown name
bool is_floating(DType t);
bool is_integral(DType t);  // i8, u8, i32, i64 (not bool)

// The floating dtypes (is_floating's set) in enum order: the dtype list of every kernel
// that takes any of them.
inline const std::vector<DType> kFloatDTypes = {DType::f32, DType::f64, DType::f16, DType::bf16};
// f32 and f64 only: kernels without a 16-bit path.
inline const std::vector<DType> kF32F64DTypes = {DType::f32, DType::f64};

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::cuda, i}; }
  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;
};

const char* device_type_name(DeviceType t);

}  // namespace qg
