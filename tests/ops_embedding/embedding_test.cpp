// embedding and embedding_backward: gathers and scatter-adds checked by hand (repeated
// indices, i32 and i64, multi-dimensional indices), bad inputs, and the CUDA kernels against
// the CPU bit for bit (including the out-of-range index raised through the device error).
#include <gtest/gtest.h>

#include <random>

#include "tests/gpu/gpu_test_util.h"
#ifdef QG_WITH_CUDA
#include "device/cuda/device_error.h"
#endif

namespace qg {
namespace {

using testing::expect_error;
using testing::run_op;
using testing::same_bits;

// weight[v, d] = 10 v + d: every gathered value names its row and column.
Tensor numbered_weight(int64_t rows, int64_t width, DType d = DType::f32) {
  std::vector<double> v;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < width; ++c) v.push_back(10.0 * r + c);
  return Tensor::from_doubles({rows, width}, v, d);
}

TEST(Embedding, GathersRowsForAnyIndexShape) {
  Tensor w = numbered_weight(5, 3);
  Tensor idx = Tensor::from_vector<int64_t>({2, 2}, {4, 0, 2, 4});
  Tensor y = run_op(Device::cpu(), "embedding", {w, idx})[0];
  EXPECT_EQ(y.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(y.to_doubles(), (std::vector<double>{40, 41, 42, 0, 1, 2, 20, 21, 22, 40, 41, 42}));
  Tensor idx32 = Tensor::from_vector<int32_t>({3}, {1, 1, 3});
  EXPECT_EQ(run_op(Device::cpu(), "embedding", {w, idx32})[0].to_doubles(),
            (std::vector<double>{10, 11, 12, 10, 11, 12, 30, 31, 32}));
}

TEST(EmbeddingBackward, SumsRepeatedIndices) {
  // dy rows (1, 2), (3, 4), (5, 6) at indices 2, 0, 2: row 2 = (6, 8), row 0 = (3, 4), row 1
  // and row 3 untouched (zeros).
  Tensor dy = Tensor::from_doubles({3, 2}, {1, 2, 3, 4, 5, 6}, DType::f64);
  Tensor idx = Tensor::from_vector<int64_t>({3}, {2, 0, 2});
  Tensor dw = run_op(Device::cpu(), "embedding_backward", {dy, idx}, {{"num_embeddings", 4}})[0];
  EXPECT_EQ(dw.shape(), (Shape{4, 2}));
  EXPECT_EQ(dw.to_doubles(), (std::vector<double>{3, 4, 0, 0, 6, 8, 0, 0}));
}

TEST(EmbeddingBackward, SixteenBitSumsInF32AndRoundOnce) {
  // Summed in bf16 step by step, 2048 + 1 would round back to 2048 each time (the bf16 ulp
  // there is 16); summed in f32, the sixteen ones make 2064, which bf16 holds exactly.
  std::vector<double> g(17, 1.0);
  g[0] = 2048;
  Tensor dy = Tensor::from_doubles({17, 1}, g, DType::bf16);
  Tensor idx = Tensor::from_vector<int32_t>({17}, std::vector<int32_t>(17, 0));
  Tensor dw = run_op(Device::cpu(), "embedding_backward", {dy, idx}, {{"num_embeddings", 1}})[0];
  EXPECT_EQ(dw.to_doubles(), std::vector<double>{2064});
}

TEST(EmbeddingErrors, WeightNot2D) {
  expect_error(
      [] {
        run_op(Device::cpu(), "embedding",
               {Tensor::zeros({2, 3, 4}, DType::f32), Tensor::from_vector<int64_t>({1}, {0})});
      },
      {"[embedding]", "'weight' must be 2-D", "f32[2, 3, 4]"});
}

TEST(EmbeddingErrors, IndicesNotIntegral) {
  expect_error(
      [] {
        run_op(Device::cpu(), "embedding",
               {Tensor::zeros({2, 3}, DType::f32), Tensor::zeros({2}, DType::f32)});
      },
      {"[embedding]", "'indices' must be i64 or i32", "f32[2]"});
  expect_error(
      [] {
        run_op(Device::cpu(), "embedding",
               {Tensor::zeros({2, 3}, DType::f32), Tensor::zeros({2}, DType::u8)});
      },
      {"[embedding]", "u8[2]"});
}

TEST(EmbeddingErrors, IndexOutOfRangeOnCpu) {
  expect_error(
      [] {
        run_op(Device::cpu(), "embedding",
               {numbered_weight(5, 2), Tensor::from_vector<int64_t>({3}, {0, 7, 1})});
      },
      {"[embedding]", "indices[1] = 7", "outside [0, 5)", "5 rows"});
  expect_error(
      [] {
        run_op(Device::cpu(), "embedding",
               {numbered_weight(5, 2), Tensor::from_vector<int32_t>({2}, {-1, 1})});
      },
      {"[embedding]", "indices[0] = -1"});
  expect_error(
      [] {
        run_op(Device::cpu(), "embedding_backward",
               {Tensor::zeros({2, 2}, DType::f32), Tensor::from_vector<int64_t>({2}, {0, 3})},
               {{"num_embeddings", 3}});
      },
      {"[embedding_backward]", "indices[1] = 3", "outside [0, 3)"});
}

TEST(EmbeddingErrors, BackwardShapes) {
  expect_error(
      [] {
        run_op(Device::cpu(), "embedding_backward",
               {Tensor::zeros({2, 3}, DType::f32), Tensor::from_vector<int64_t>({3}, {0, 1, 2})},
               {{"num_embeddings", 4}});
      },
      {"[embedding_backward]", "f32[2, 3]", "[3]"});
  expect_error(
      [] {
        run_op(Device::cpu(), "embedding_backward",
               {Tensor::zeros({2, 3}, DType::f32), Tensor::from_vector<int64_t>({2}, {0, 1})},
               {{"num_embeddings", -1}});
      },
      {"[embedding_backward]", "'num_embeddings' = -1"});
}

// ---- GPU against the CPU reference ------------------------------------------------------

Tensor random_indices(const Shape& s, int64_t rows, DType d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> u(0, rows - 1);
  std::vector<double> v(static_cast<size_t>(shape_numel(s)));
  for (double& e : v) e = static_cast<double>(u(rng));
  return Tensor::from_doubles(s, v, d);
}

Tensor random_values(const Shape& s, DType d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(static_cast<size_t>(shape_numel(s)));
  for (double& e : v) e = u(rng);
  return Tensor::from_doubles(s, v, d);
}

TEST(EmbeddingGpu, ForwardAndBackwardBitExact) {
  QG_REQUIRE_GPU();
  struct Case {
    int64_t rows, width;
    Shape idx;
  };
  // Few rows (many repeats per row), a vocabulary larger than the batch, an empty batch; widths
  // that are multiples of 8 take the CUDA kernels' packs of 8 (with repeats, and wide rows).
  const std::vector<Case> cases = {{3, 5, {64}},   {1000, 33, {7, 41}}, {17, 8, {0}},
                                   {50, 1, {9}},   {300, 64, {5, 40}},  {12, 4096, {30}},
                                   {9, 8, {3, 11}}};
  uint32_t seed = 7;
  for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    for (DType id : {DType::i64, DType::i32}) {
      for (const Case& c : cases) {
        std::string what = std::string(dtype_name(d)) + " " + dtype_name(id) +
                           " V=" + std::to_string(c.rows) + " idx" + shape_str(c.idx);
        Tensor w = random_values({c.rows, c.width}, d, seed++);
        Tensor idx = random_indices(c.idx, c.rows, id, seed++);
        Tensor yc = run_op(Device::cpu(), "embedding", {w, idx})[0];
        EXPECT_TRUE(same_bits(yc, run_op(Device::cuda(), "embedding", {w, idx})[0])) << what;
        Shape dys = c.idx;
        dys.push_back(c.width);
        Tensor dy = random_values(dys, d, seed++);
        Attrs a{{"num_embeddings", c.rows}};
        EXPECT_TRUE(same_bits(run_op(Device::cpu(), "embedding_backward", {dy, idx}, a)[0],
                              run_op(Device::cuda(), "embedding_backward", {dy, idx}, a)[0]))
            << what;
      }
    }
  }
}

#ifdef QG_WITH_CUDA
TEST(EmbeddingDeviceError, WordedAsOnTheCpu) {
  // The record a kernel leaves for indices[1] = 7 with 5 rows (no GPU needed to format it).
  cuda::DeviceErrorRecord r{cuda::kIndexOutOfRange, 0, 1, 7.0, 0.0, 5.0};
  EXPECT_EQ(cuda::describe_device_error(r),
            "indices[1] = 7 is outside [0, 5) (the weight has 5 rows)");
}
#endif

TEST(EmbeddingGpu, IndexOutOfRangeIsAnError) {
  QG_REQUIRE_GPU();
  expect_error(
      [] {
        run_op(Device::cuda(), "embedding",
               {numbered_weight(5, 2), Tensor::from_vector<int64_t>({3}, {0, 7, 1})});
      },
      {"embedding", "indices[1] = 7", "outside [0, 5)"});
  expect_error(
      [] {
        run_op(Device::cuda(), "embedding_backward",
               {Tensor::zeros({2, 2}, DType::f32), Tensor::from_vector<int32_t>({2}, {-4, 0})},
               {{"num_embeddings", 3}});
      },
      {"embedding_backward", "indices[0] = -4", "outside [0, 3)"});
  // The error is cleared once raised: the next run is clean.
  Tensor y = run_op(Device::cuda(), "embedding",
                    {numbered_weight(5, 2), Tensor::from_vector<int64_t>({1}, {4})})[0];
  EXPECT_EQ(y.to_doubles(), (std::vector<double>{40, 41}));
}

}  // namespace
}  // namespace qg
