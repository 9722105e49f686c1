#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "core/half.h"
#include "core/tensor.h"
#include "runtime/backend.h"

namespace qg {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::i8), 1u);
  EXPECT_EQ(dtype_size(DType::u8), 1u);
  EXPECT_EQ(dtype_size(DType::i32), 4u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(dtype_size(DType::boolean), 1u);
  for (int i = 0; i < kDTypeCount; ++i) {
    auto t = static_cast<DType>(i);
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
  }
  EXPECT_THROW(dtype_from_name("f8"), Error);
}

TEST(Tensor, ShapeStridesAndAlignment) {
  Tensor t = Tensor::empty({2, 3, 4}, DType::f32);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % kCpuAlignment, 0u);
  EXPECT_THROW(t.size(3), Error);
  EXPECT_THROW(Tensor::empty({2, -1}, DType::f32), Error);
}

TEST(Tensor, ReshapeSharesStorageAndCloneDoesNot) {
  Tensor t = Tensor::from_doubles({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor v = t.reshape({3, 2});
  Tensor c = t.clone();
  t.data<float>()[0] = 42;
  EXPECT_EQ(v.at(0), 42);
  EXPECT_EQ(c.at(0), 1);
  EXPECT_THROW(t.reshape({4, 2}), Error);
}

TEST(Tensor, EmptyTensorsAreValid) {
  Tensor t = Tensor::zeros({0, 5}, DType::f32);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.to_doubles().size(), 0u);
}

TEST(Tensor, DataTypeChecked) {
  Tensor t = Tensor::empty({2}, DType::f32);
  EXPECT_THROW(t.data<double>(), Error);
  EXPECT_NO_THROW(t.data<float>());
}

TEST(Tensor, HalfCastsRoundToNearestEven) {
  // 1 + 2^-11 lies exactly between two f16 values (1 and 1 + 2^-10): ties go to even (1).
  // 1 + 3 * 2^-11 lies between 1 + 2^-10 and 1 + 2^-9: ties go to even (1 + 2^-9).
  Tensor t = Tensor::from_vector<float>(
      {2}, {1.0f + std::ldexp(1.0f, -11), 1.0f + 3 * std::ldexp(1.0f, -11)});
  Tensor h = t.cast(DType::f16);
  EXPECT_EQ(h.at(0), 1.0);
  EXPECT_EQ(h.at(1), 1.0 + std::ldexp(1.0, -9));
  // bf16 keeps 8 significant bits: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 -> 1.
  Tensor b = Tensor::from_vector<float>({1}, {1.0f + std::ldexp(1.0f, -8)}).cast(DType::bf16);
  EXPECT_EQ(b.at(0), 1.0);
  EXPECT_TRUE(std::isnan(Tensor::from_vector<float>({1}, {NAN}).cast(DType::bf16).at(0)));
}

TEST(Tensor, AllDtypesRoundTripThroughDoubles) {
  for (int i = 0; i < kDTypeCount; ++i) {
    auto d = static_cast<DType>(i);
    Tensor t = Tensor::from_doubles({3}, {0, 1, 1}, d);
    EXPECT_EQ(t.to_doubles(), (std::vector<double>{0, 1, 1})) << dtype_name(d);
  }
}

TEST(Tensor, CudaWithoutBackendIsAClearError) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present: its allocator may be installed";
  try {
    Tensor::empty({2}, DType::f32, Device::cuda());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA allocator is installed"), std::string::npos) << e.what();
  }
  try {
    make_backend(Device::cuda());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qg
