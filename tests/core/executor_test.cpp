#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "autograd/grad.h"
#include "runtime/executor.h"
#include "tests/core/test_util.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::ScopedProcessCacheLimit;

TEST(Executor, FeedsByNameAndFetchesByName) {
  Graph g;
  ValueId a = g.input("a", {DType::f32, {3}});
  ValueId b = g.input("b", {DType::f32, {3}});
  g.set_name(g.apply1("mul", {a, b}), "product");
  Executor exec(g);
  auto out = exec.run_named(
      {{"a", Tensor::from_doubles({3}, {1, 2, 3})}, {"b", Tensor::from_doubles({3}, {4, 5, 6})}},
      {"product"});
  EXPECT_EQ(out["product"].to_doubles(), (std::vector<double>{4, 10, 18}));
}

TEST(Executor, MissingGraphInput) {
  Graph g;
  ValueId a = g.input("a", {DType::f32, {3}});
  ValueId b = g.input("b", {DType::f32, {3}});
  ValueId y = g.apply1("add", {a, b});
  Executor exec(g);
  expect_error(
      [&] {
        exec.run({{"a", Tensor::zeros({3}, DType::f32)}}, {y});
      },
      {"missing graph input 'b'"});
}

TEST(Executor, FedTensorMustMatchDeclaration) {
  Graph g;
  ValueId a = g.input("a", {DType::f32, {3}});
  ValueId y = g.apply1("relu", {a});
  Executor exec(g);
  expect_error(
      [&] {
        exec.run({{"a", Tensor::zeros({4}, DType::f32)}}, {y});
      },
      {"declared f32[3]", "fed f32[4]"});
  expect_error(
      [&] {
        exec.run({{"a", Tensor::zeros({3}, DType::f64)}}, {y});
      },
      {"declared f32[3]", "fed f64[3]"});
  expect_error(
      [&] {
        exec.run({{"a", Tensor::zeros({3}, DType::f32)}, {"zzz", Tensor()}}, {y});
      },
      {"feed 'zzz' does not name a graph input"});
}

TEST(Executor, OnlyNeededNodesRun) {
  Graph g;
  ValueId a = g.input("a", {DType::f32, {2}});
  ValueId unused = g.input("unused", {DType::f32, {2}});
  g.apply1("neg", {unused});
  ValueId y = g.apply1("neg", {a});
  Executor exec(g);
  EXPECT_EQ(exec.run({{"a", Tensor::from_doubles({2}, {1, -2})}}, {y})[0].to_doubles(),
            (std::vector<double>{-1, 2}));
}

TEST(Executor, EmptyTensorsFlowThrough) {
  Graph g;
  ValueId a = g.input("a", {DType::f32, {0, 3}});
  ValueId s = g.constant(Tensor::from_doubles({1}, {0.1}));
  ValueId z = g.constant(Tensor::from_doubles({1}, {0}, DType::i32));
  auto fq = g.apply("fake_quantize", {g.apply1("relu", {a}), s, z});
  ValueId total = g.apply1("sum", {fq[0]});
  Executor exec(g);
  auto out = exec.run({{"a", Tensor::zeros({0, 3}, DType::f32)}}, {fq[0], fq[1], total});
  EXPECT_EQ(out[0].numel(), 0);
  EXPECT_EQ(out[1].numel(), 0);
  EXPECT_EQ(out[2].at(0), 0.0);
}

TEST(Executor, ObserverStatePersistsAcrossRunsAndFreezesInEval) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {3}});
  auto qp = g.apply("minmax_observer", {x});
  Executor exec(g);
  NodeId obs = g.value(qp[0]).producer;
  exec.run({{"x", Tensor::from_doubles({3}, {-1, 0, 2})}}, {qp[0]});
  exec.run({{"x", Tensor::from_doubles({3}, {0, 3, 1})}}, {qp[0]});
  EXPECT_EQ(exec.state(obs, "min").at(0), -1.0);
  EXPECT_EQ(exec.state(obs, "max").at(0), 3.0);
  exec.set_training(false);
  exec.run({{"x", Tensor::from_doubles({3}, {-50, 0, 50})}}, {qp[0]});
  EXPECT_EQ(exec.state(obs, "max").at(0), 3.0);
  expect_error([&] { exec.state(obs, "nope"); }, {"no state named 'nope'"});
}

TEST(Executor, ParametersPersistAndAreAddressableByName) {
  Graph g;
  ValueId w = g.parameter("w", Tensor::from_doubles({2}, {1, 2}));
  ValueId y = g.apply1("neg", {w});
  Executor exec(g);
  exec.parameter("w").data<float>()[0] = 5;
  EXPECT_EQ(exec.run({}, {y})[0].to_doubles(), (std::vector<double>{-5, -2}));
  expect_error([&] { exec.parameter("y_missing"); }, {"no value is named"});
}

TEST(Executor, GraphGrowthAfterConstructionIsPickedUp) {
  Graph g;
  ValueId a = g.input("a", {DType::f32, {2}});
  Executor exec(g);
  ValueId y = g.apply1("neg", {a});
  EXPECT_EQ(exec.run({{"a", Tensor::from_doubles({2}, {1, 2})}}, {y})[0].to_doubles(),
            (std::vector<double>{-1, -2}));
}

Tensor patterned(const Shape& shape, int salt, DType dtype = DType::f32) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] =
        static_cast<double>((i * 7919 + static_cast<size_t>(salt) * 104729) % 1000) / 250.0 - 2.0;
  return Tensor::from_doubles(shape, v, dtype);
}

// A fake-quantized two-layer MLP's loss, gradients and masks, sized so that its tensors go
// through the CPU allocator's cache (>= 64 KiB).
struct MlpStep {
  Graph g;
  std::vector<ValueId> fetches;
  Executor::Feeds feeds;
  MlpStep() {
    ValueId x = g.input("x", {DType::f32, {128, 512}});
    ValueId labels = g.input("labels", {DType::i64, {128}});
    ValueId w1 = g.parameter("w1", patterned({512, 256}, 1));
    ValueId b1 = g.parameter("b1", patterned({256}, 2));
    ValueId w2 = g.parameter("w2", patterned({256, 10}, 3));
    auto xq = g.apply("fake_quantize", {x, g.constant(Tensor::from_doubles({1}, {0.02})),
                                        g.constant(Tensor::from_doubles({1}, {3}, DType::i32))});
    std::vector<double> channel_scales(256);
    for (size_t c = 0; c < channel_scales.size(); ++c) channel_scales[c] = 0.004 + 0.001 * (c % 7);
    auto w1q = g.apply("fake_quantize",
                       {w1, g.constant(Tensor::from_doubles({256}, channel_scales)),
                        g.constant(Tensor::zeros({256}, DType::i32))},
                       {{"scope", "channel"}, {"axis", 1}, {"signed", true}});
    ValueId h = g.apply1("relu", {g.apply1("add", {g.apply1("matmul", {xq[0], w1q[0]}), b1})});
    ValueId loss = g.apply1("softmax_cross_entropy", {g.apply1("matmul", {h, w2}), labels});
    fetches = grad(g, loss, {x, w1, b1, w2});
    fetches.insert(fetches.end(), {loss, h, xq[1], w1q[1]});
    feeds = {{"x", patterned({128, 512}, 5)},
             {"labels", Tensor::from_doubles({128}, std::vector<double>(128, 7), DType::i64)}};
  }
};

void expect_same_bytes(const std::vector<Tensor>& got, const std::vector<Tensor>& want,
                       const std::string& run) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].nbytes(), want[i].nbytes());
    EXPECT_EQ(std::memcmp(got[i].raw_data(), want[i].raw_data(), want[i].nbytes()), 0)
        << "fetch " << i << " differs on " << run;
  }
}

TEST(Executor, RepeatedRunsOnCachedBlocksAreBitIdentical) {
  // Later runs get the blocks earlier runs freed (the CPU allocator's cache), some refilled
  // with 0xFF bytes (NaN, -1, true) before the run.
  ScopedProcessCacheLimit limit(256 << 20);
  MlpStep s;
  Executor exec(s.g);
  const std::vector<Tensor> first = exec.run(s.feeds, s.fetches);
  for (int rep = 0; rep < 3; ++rep) {
    {
      std::vector<Tensor> dirty;
      for (ValueId v = 0; v < s.g.num_values(); ++v) {
        const TensorType& t = s.g.value(v).type;
        dirty.push_back(Tensor::empty(t.shape, t.dtype));
        if (dirty.back().nbytes() > 0)
          std::memset(dirty.back().raw_data(), 0xFF, dirty.back().nbytes());
      }
    }  // freed into the cache
    const uint64_t hits = cpu_cache_stats().hits;
    const std::vector<Tensor> again = exec.run(s.feeds, s.fetches);
    EXPECT_GT(cpu_cache_stats().hits, hits) << "the run reused no cached block";
    expect_same_bytes(again, first, "run " + std::to_string(rep + 2));
  }
}

// Hands out a CachingCpuAllocator's blocks filled with one byte, whatever they held.
class FillingAllocator final : public Allocator {
 public:
  explicit FillingAllocator(unsigned char byte) : byte_(byte), cache_(size_t{64} << 20) {}
  void* allocate(size_t bytes) override {
    void* p = cache_.allocate(bytes);
    if (p != nullptr) std::memset(p, byte_, bytes);
    return p;
  }
  void deallocate(void* ptr, size_t bytes) noexcept override { cache_.deallocate(ptr, bytes); }
  Device device() const override { return Device::cpu(); }

 private:
  unsigned char byte_;
  CachingCpuAllocator cache_;
};

TEST(Executor, NoKernelReadsWhatItsFreshOutputHeld) {
  // A run whose every allocation on this thread comes filled with 0xFF, 0x00 or 0x7F bytes
  // gives the bytes of a plain run: reused blocks (which hold an earlier tensor's values)
  // cannot leak into a result. Within one run the allocator reuses blocks in a fixed order,
  // so only a different fill shows a kernel that reads its output before writing it.
  MlpStep s;
  Executor exec(s.g);
  const std::vector<Tensor> plain = exec.run(s.feeds, s.fetches);
  for (unsigned char byte : {0xFF, 0x00, 0x7F}) {
    FillingAllocator filling(byte);
    ScopedAllocator scope(DeviceType::cpu, &filling);
    for (int rep = 0; rep < 2; ++rep)  // the second run takes the first one's freed blocks
      expect_same_bytes(exec.run(s.feeds, s.fetches), plain,
                        "a run on blocks filled with " + std::to_string(byte));
  }
}

}  // namespace
}  // namespace qg
