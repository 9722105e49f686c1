// fake_quantize's persistent fake_quant_enabled state (PyTorch's FakeQuantize flag): 1 by
// default; 0 makes the node an identity with an all-ones mask, and the STE backward passes
// dy through unchanged.
#include <gtest/gtest.h>

#include "autograd/grad.h"
#include "tests/ops_quantize/op_runner.h"

namespace qg {
namespace {

TEST(FakeQuantEnabled, ToggleBetweenRuns) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {10}});
  ValueId s = g.constant(Tensor::from_doubles({1}, {0.5}, DType::f32));
  ValueId z = g.constant(Tensor::from_doubles({1}, {0}, DType::i32));
  auto out = g.apply("fake_quantize", {x, s, z}, {{"bits", 4}, {"signed", true}});
  ValueId dx = grad(g, g.apply1("sum", {out[0]}), {x})[0];
  NodeId node = g.value(out[0]).producer;
  std::vector<double> xv = {0.3, -0.2, 5.0, -7.0, 1.25, 0.75, 3.5, -4.0, 100, 0.1};
  Executor::Feeds feeds = {{"x", Tensor::from_doubles({10}, xv, DType::f32)}};
  Executor exec(g);

  Tensor& flag = exec.state(node, "fake_quant_enabled");
  EXPECT_EQ(flag.dtype(), DType::u8);
  EXPECT_EQ(flag.at(0), 1.0);
  auto on = exec.run(feeds, {out[0], out[1], dx});
  // [-8, 7] codes of x * 2: 0.6 -> 1, -0.4 -> 0, 10 -> 7 (out), -14 -> -8 (out), 2.5 -> 2,
  // 1.5 -> 2, 7, -8, 200 -> 7 (out), 0.2 -> 0.
  EXPECT_EQ(on[0].to_doubles(), (std::vector<double>{0.5, 0, 3.5, -4, 1, 1, 3.5, -4, 3.5, 0}));
  EXPECT_EQ(on[2].to_doubles(), (std::vector<double>{1, 1, 0, 0, 1, 1, 1, 1, 0, 1}));

  flag.data<uint8_t>()[0] = 0;
  auto off = exec.run(feeds, {out[0], out[1], dx});
  EXPECT_EQ(off[0].to_doubles(), Tensor::from_doubles({10}, xv, DType::f32).to_doubles());
  EXPECT_EQ(off[1].to_doubles(), (std::vector<double>{0xff, 0x03}));  // bits past 10 stay 0
  EXPECT_EQ(off[2].to_doubles(), std::vector<double>(10, 1.0));

  flag.data<uint8_t>()[0] = 1;
  EXPECT_EQ(exec.run(feeds, {out[0]})[0].to_doubles(), on[0].to_doubles());
}

TEST(FakeQuantEnabled, DisabledHalfAndEmptyInputs) {
  for (DType d : {DType::f16, DType::bf16, DType::f64}) {
    Graph g;
    ValueId x = g.input("x", {d, {3}});
    auto out =
        g.apply("fake_quantize", {x, g.constant(Tensor::from_doubles({1}, {1.0}, DType::f32)),
                                  g.constant(Tensor::from_doubles({1}, {0}, DType::i32))});
    Executor exec(g);
    exec.state(g.value(out[0]).producer, "fake_quant_enabled").fill(0);
    auto r = exec.run({{"x", Tensor::from_doubles({3}, {0.3, -1000, 7.5}, d)}}, {out[0], out[1]});
    EXPECT_EQ(r[0].to_doubles(), Tensor::from_doubles({3}, {0.3, -1000, 7.5}, d).to_doubles());
    EXPECT_EQ(r[1].at(0), 0x07);
  }
  Graph g;
  ValueId x = g.input("x", {DType::f32, {0}});
  auto out = g.apply("fake_quantize", {x, g.constant(Tensor::from_doubles({1}, {1.0}, DType::f32)),
                                       g.constant(Tensor::from_doubles({1}, {0}, DType::i32))});
  Executor exec(g);
  exec.state(g.value(out[0]).producer, "fake_quant_enabled").fill(0);
  auto r = exec.run({{"x", Tensor::from_doubles({0}, {}, DType::f32)}}, {out[0], out[1]});
  EXPECT_EQ(r[0].numel(), 0);
  EXPECT_EQ(r[1].numel(), 0);
}

}  // namespace
}  // namespace qg
