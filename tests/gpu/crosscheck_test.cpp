// The cross-check harness: its comparison rules (these run without a GPU) and whole graphs
// checked node by node on the GPU against the CPU reference.
#include <cmath>
#include <limits>

#include "autograd/grad.h"
#include "gpu_test_util.h"
#include "runtime/crosscheck.h"

namespace qg {
namespace {

TEST(CrosscheckCompare, ExactFindsFirstDifferingElement) {
  Tensor a = Tensor::from_doubles({4}, {1, 2, 3, 4});
  Tensor b = Tensor::from_doubles({4}, {1, 2, 3.0000002, 5});
  CrosscheckMismatch m;
  double worst = 0;
  EXPECT_FALSE(compare_tensors(a, b, CompareRule{}, m, worst));
  EXPECT_EQ(m.index, 2);
  EXPECT_EQ(m.cpu, 3.0);
  EXPECT_EQ(m.gpu, static_cast<double>(3.0000002f));
}

TEST(CrosscheckCompare, NaNMatchesNaNButSignedZerosDiffer) {
  double nan = std::numeric_limits<double>::quiet_NaN();
  CrosscheckMismatch m;
  double worst = 0;
  EXPECT_TRUE(compare_tensors(Tensor::from_doubles({2}, {nan, 1}),
                              Tensor::from_doubles({2}, {-nan, 1}), CompareRule{}, m, worst));
  EXPECT_FALSE(compare_tensors(Tensor::from_doubles({1}, {0.0}), Tensor::from_doubles({1}, {-0.0}),
                               CompareRule{}, m, worst));
  EXPECT_FALSE(compare_tensors(Tensor::from_doubles({1}, {nan}), Tensor::from_doubles({1}, {1.0}),
                               CompareRule{false, 1e-5}, m, worst));
}

TEST(CrosscheckCompare, ToleranceIsRelativeToTheTensorScale) {
  Tensor a = Tensor::from_doubles({3}, {1000, 1, 0.001}, DType::f64);
  Tensor ok = Tensor::from_doubles({3}, {1000.005, 1.001, 0.002}, DType::f64);
  Tensor bad = Tensor::from_doubles({3}, {1000.02, 1, 0.001}, DType::f64);
  CrosscheckMismatch m;
  double worst = 0;
  EXPECT_TRUE(compare_tensors(a, ok, CompareRule{false, 1e-5}, m, worst));
  EXPECT_NEAR(worst, 5e-6, 1e-9);
  EXPECT_FALSE(compare_tensors(a, bad, CompareRule{false, 1e-5}, m, worst));
  EXPECT_EQ(m.index, 0);
}

TEST(CrosscheckCompare, IntegerAndShapeMismatches) {
  CrosscheckMismatch m;
  double worst = 0;
  EXPECT_FALSE(compare_tensors(Tensor::from_vector<int32_t>({3}, {1, 2, 3}),
                               Tensor::from_vector<int32_t>({3}, {1, 2, 4}), CompareRule{}, m,
                               worst));
  EXPECT_EQ(m.index, 2);
  EXPECT_FALSE(compare_tensors(Tensor::from_vector<int32_t>({3}, {1, 2, 3}),
                               Tensor::from_vector<int32_t>({1, 3}, {1, 2, 3}), CompareRule{}, m,
                               worst));
  EXPECT_NE(m.detail.find("i32[1, 3]"), std::string::npos) << m.detail;
}

TEST(CrosscheckCompare, RulesExactExceptFloatReductions) {
  EXPECT_TRUE(compare_rule("fake_quantize", 0, DType::f32).exact);
  EXPECT_TRUE(compare_rule("minmax_observer", 0, DType::f32).exact);
  EXPECT_FALSE(compare_rule("matmul", 0, DType::f32).exact);
  EXPECT_EQ(compare_rule("sum", 0, DType::f32).tolerance, 1e-5);
  EXPECT_TRUE(compare_rule("lsq_backward", 0, DType::f32).exact);   // dx
  EXPECT_FALSE(compare_rule("lsq_backward", 1, DType::f32).exact);  // dscale
}

// A small QAT training graph: observer -> fake_quantize -> matmul -> relu -> loss, with its
// backward, three steps (the observer's running state is checked after each).
TEST(Crosscheck, TrainingGraphAgreesNodeByNode) {
  QG_REQUIRE_GPU();
  for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    Graph g;
    ValueId x = g.input("x", {d, {16, 33}});
    ValueId labels = g.input("labels", {DType::i64, {16}});
    std::vector<double> wv(33 * 10);
    for (size_t i = 0; i < wv.size(); ++i) wv[i] = std::cos(0.37 * i) * 0.3;
    ValueId w = g.parameter("w", Tensor::from_doubles({33, 10}, wv, d));
    auto qp = g.apply("minmax_observer", {x}, {}, "obs");
    ValueId xq = g.apply("fake_quantize", {x, qp[0], qp[1]}, {}, "fq").at(0);
    ValueId h = g.apply1("relu", {g.apply1("matmul", {xq, w})});
    ValueId loss = g.apply1("softmax_cross_entropy", {h, labels});
    grad(g, loss, {w, x});
    std::vector<double> xv(16 * 33), lv(16);
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(1.3 * i) * 2;
    for (size_t i = 0; i < lv.size(); ++i) lv[i] = static_cast<double>(i % 10);
    Executor::Feeds feeds{{"x", Tensor::from_doubles({16, 33}, xv, d)},
                          {"labels", Tensor::from_doubles({16}, lv, DType::i64)}};
    CrosscheckReport r = crosscheck(g, feeds, {3});
    EXPECT_TRUE(r.passed) << dtype_name(d) << ": " << (r.first ? r.first->str() : "");
    EXPECT_GT(r.nodes_checked, 10);
    EXPECT_EQ(r.steps, 3);
  }
}

TEST(Crosscheck, InvalidQParamsRaiseOnBothBackends) {
  QG_REQUIRE_GPU();
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4}});
  ValueId s = g.input("s", {DType::f32, {1}});
  ValueId z = g.input("z", {DType::i32, {1}});
  g.apply("fake_quantize", {x, s, z});
  Executor::Feeds feeds{{"x", Tensor::from_doubles({4}, {1, 2, 3, 4})},
                        {"s", Tensor::from_doubles({1}, {-1})},
                        {"z", Tensor::from_vector<int32_t>({1}, {0})}};
  CrosscheckReport r = crosscheck(g, feeds);
  EXPECT_TRUE(r.passed);
  EXPECT_TRUE(r.both_raised);
  EXPECT_NE(r.raised.find("scale[0] = -1"), std::string::npos) << r.raised;
}

TEST(Crosscheck, WithoutGpuSaysSo) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  Graph g;
  testing::expect_error([&] { crosscheck(g, {}); }, {"crosscheck", "no CUDA device"});
}

}  // namespace
}  // namespace qg
