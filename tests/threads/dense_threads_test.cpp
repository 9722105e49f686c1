// The parallel dense CPU kernels give the same bytes with 1, 2, 3 and 8 threads: element-wise
// maps (with broadcasting), optimizer steps, matmul / batched_matmul (row blocks of fixed
// size) and conv2d's forward and dx (one image per task), dw (fixed blocks of images) and
// the bias gradient (chunks of channels), batch norm (chunks of channels), layer norm
// (chunks of rows, dgamma / dbeta as per-chunk sums in chunk order), softmax (chunks of
// slabs) and pooling (chunks of planes). The blocked GEMM
// must also equal one Eigen product of the whole matrices, which is what the kernels computed
// before they were parallel.
#include <Eigen/Core>

#include "tests/threads/thread_test_util.h"

namespace qg {
namespace {

using threads_test::Case;
using threads_test::data;
using threads_test::expect_same_for_every_thread_count;

TEST(DenseThreads, ElementWiseMaps) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    Case c;
    c.label = std::string("element-wise ") + dtype_name(dtype);
    c.feeds = {{"a", data({513, 1, 67}, dtype, 1)},
               {"b", data({1, 301, 67}, dtype, 2)},
               {"x", data({301, 517}, dtype, 3)},
               {"dy", data({301, 517}, dtype, 4)}};
    c.build = [dtype](Graph& g) {
      ValueId a = g.input("a", {dtype, {513, 1, 67}});
      ValueId b = g.input("b", {dtype, {1, 301, 67}});
      ValueId x = g.input("x", {dtype, {301, 517}});
      ValueId dy = g.input("dy", {dtype, {301, 517}});
      g.apply1("add", {a, b});
      g.apply1("mul", {x, dy});
      g.apply1("broadcast_to", {b}, {{"shape", Shape{513, 301, 67}}});
      g.apply1("relu", {x});
      g.apply1("gelu", {x});
      g.apply1("silu_backward", {dy, x});
    };
    c.steps = 1;
    expect_same_for_every_thread_count(c);
  }
}

TEST(DenseThreads, OptimizerSteps) {
  for (const char* opt : {"sgd", "adam"}) {
    Case c;
    c.label = opt;
    c.feeds = {{"g", data({1031, 77}, DType::f32, 5, 1.0, false)}};
    c.build = [opt](Graph& g) {
      ValueId p = g.parameter("p", data({1031, 77}, DType::f32, 6, 1.0, false));
      ValueId grad = g.input("g", {DType::f32, {1031, 77}});
      Attrs a;
      if (std::string(opt) == "sgd") a = {{"momentum", 0.9}, {"weight_decay", 0.01}};
      g.apply(opt, {p, grad}, a);
    };
    c.steps = 3;
    expect_same_for_every_thread_count(c);
  }
}

TEST(DenseThreads, MatmulAndBatchedMatmul) {
  for (DType dtype : {DType::f32, DType::f64, DType::f16})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        Case c;
        c.label =
            std::string("matmul ") + dtype_name(dtype) + (ta ? " ta" : "") + (tb ? " tb" : "");
        const Shape as = ta ? Shape{300, 517} : Shape{517, 300};
        const Shape bs = tb ? Shape{129, 300} : Shape{300, 129};
        const Shape bas = ta ? Shape{3, 70, 195} : Shape{3, 195, 70};
        const Shape bbs = tb ? Shape{3, 90, 70} : Shape{3, 70, 90};
        c.feeds = {{"a", data(as, dtype, 7, 1.0, false)},
                   {"b", data(bs, dtype, 8, 1.0, false)},
                   {"ba", data(bas, dtype, 9, 1.0, false)},
                   {"bb", data(bbs, dtype, 10, 1.0, false)}};
        c.build = [=](Graph& g) {
          const Attrs t{{"transpose_a", ta}, {"transpose_b", tb}};
          g.apply1("matmul", {g.input("a", {dtype, as}), g.input("b", {dtype, bs})}, t);
          g.apply1("batched_matmul", {g.input("ba", {dtype, bas}), g.input("bb", {dtype, bbs})}, t);
        };
        c.steps = 1;
        expect_same_for_every_thread_count(c);
      }
}

// Rows not a multiple of the 64-row block, a remainder of one row, and a one-column output
// (Eigen's GEMV path): the blocked product equals the single product byte for byte.
TEST(DenseThreads, BlockedMatmulEqualsOneEigenProduct) {
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  struct Dims {
    int64_t m, k, n;
  };
  for (const Dims& d :
       {Dims{257, 1025, 129}, Dims{97, 3000, 97}, Dims{640, 77, 1}, Dims{129, 64, 513}}) {
    Tensor a = data({d.m, d.k}, DType::f32, 11, 1.0, false);
    Tensor b = data({d.k, d.n}, DType::f32, 12, 1.0, false);
    Mat ref = Eigen::Map<const Mat>(a.data<float>(), d.m, d.k) *
              Eigen::Map<const Mat>(b.data<float>(), d.k, d.n);
    Graph g;
    ValueId y = g.apply1(
        "matmul", {g.input("a", {DType::f32, {d.m, d.k}}), g.input("b", {DType::f32, {d.k, d.n}})});
    for (int threads : {1, 3}) {
      threads_test::ThreadCount tc(threads);
      Executor ex(g);
      Tensor out = ex.run({{"a", a}, {"b", b}}, {y})[0];
      EXPECT_EQ(std::memcmp(out.raw_data(), ref.data(), out.nbytes()), 0)
          << d.m << "x" << d.k << "x" << d.n << " with " << threads << " threads";
    }
  }
}

// Batches of 9 and 17 images: dw sums two and three fixed blocks of 8 images.
TEST(DenseThreads, Conv2dForwardAndBackward) {
  for (int64_t batch : {9, 17})
    for (int64_t groups : {1, 5}) {
      if (batch == 17 && groups == 5) continue;
      Case c;
      c.label = "conv2d batch " + std::to_string(batch) + " groups " + std::to_string(groups);
      const Shape xs{batch, 5, 23, 21}, ws{10, 5 / groups, 3, 3}, ys{batch, 10, 12, 11};
      c.feeds = {{"x", data(xs, DType::f32, 13, 1.0, false)},
                 {"w", data(ws, DType::f32, 14, 1.0, false)},
                 {"b", data({10}, DType::f32, 15, 1.0, false)},
                 {"dy", data(ys, DType::f32, 16, 1.0, false)}};
      c.build = [=](Graph& g) {
        const Attrs a{{"stride", Shape{2, 2}}, {"padding", Shape{1, 1}}, {"groups", groups}};
        ValueId x = g.input("x", {DType::f32, xs}), w = g.input("w", {DType::f32, ws});
        ValueId dy = g.input("dy", {DType::f32, ys});
        g.apply1("conv2d", {x, w, g.input("b", {DType::f32, {10}})}, a);
        Attrs bi = a;
        bi.set("input_shape", xs);
        g.apply1("conv2d_backward_input", {dy, w}, bi);
        Attrs bw = a;
        bw.set("weight_shape", ws);
        g.apply1("conv2d_backward_weight", {dy, x}, bw);
        g.apply1("conv2d_backward_bias", {dy});
      };
      c.steps = 1;
      expect_same_for_every_thread_count(c);
    }
}

// Batch norm forward (batch statistics, running statistics updated) and backward: chunks of
// whole channels (3 of the 37 channels here); 3 steps, so the running statistics feed back.
TEST(DenseThreads, BatchNormForwardAndBackward) {
  Case c;
  c.label = "batch_norm";
  const Shape xs{6, 37, 29, 31}, cs{37};
  c.feeds = {{"x", data(xs, DType::f32, 17, 2.0, false)},
             {"dy", data(xs, DType::f32, 18, 1.0, false)}};
  c.build = [=](Graph& g) {
    ValueId x = g.input("x", {DType::f32, xs}), dy = g.input("dy", {DType::f32, xs});
    ValueId gamma = g.parameter("gamma", data(cs, DType::f32, 19, 1.0, false));
    ValueId beta = g.parameter("beta", data(cs, DType::f32, 20, 1.0, false));
    ValueId rm = g.parameter("rm", data(cs, DType::f32, 21, 1.0, false));
    ValueId rv =
        g.parameter("rv", Tensor::from_doubles(cs, std::vector<double>(37, 1.5), DType::f32));
    auto out = g.apply("batch_norm", {x, gamma, beta, rm, rv}, {{"momentum", 0.1}}, "bn");
    g.apply("batch_norm_backward", {dy, x, gamma, out[1], out[2], out[3]});
  };
  c.steps = 3;
  expect_same_for_every_thread_count(c);
}

// Layer norm forward and backward over 203 rows of 301 (several row chunks) in f32 and
// f64, and softmax forward and backward along the last axis and along a middle axis (slabs
// with inner columns), f32 and bf16.
TEST(DenseThreads, LayerNormAndSoftmax) {
  for (DType dtype : {DType::f32, DType::f64}) {
    Case c;
    c.label = std::string("layer_norm ") + dtype_name(dtype);
    const Shape xs{7, 29, 301}, ds{301};
    c.feeds = {{"x", data(xs, dtype, 31, 2.0, false)}, {"dy", data(xs, dtype, 32, 1.0, false)}};
    c.build = [=](Graph& g) {
      ValueId x = g.input("x", {dtype, xs}), dy = g.input("dy", {dtype, xs});
      ValueId gamma = g.parameter("gamma", data(ds, dtype, 33, 1.0, false));
      ValueId beta = g.parameter("beta", data(ds, dtype, 34, 1.0, false));
      auto out = g.apply("layer_norm", {x, gamma, beta});
      g.apply("layer_norm_backward", {dy, x, gamma, out[1], out[2]});
    };
    c.steps = 1;
    expect_same_for_every_thread_count(c);
  }
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int axis : {-1, 1}) {
      Case c;
      c.label = std::string("softmax axis ") + std::to_string(axis) + " " + dtype_name(dtype);
      const Shape xs{37, 45, 23};
      c.feeds = {{"x", data(xs, dtype, 41)}, {"dy", data(xs, dtype, 42)}};
      c.build = [=](Graph& g) {
        ValueId x = g.input("x", {dtype, xs}), dy = g.input("dy", {dtype, xs});
        ValueId y = g.apply1("softmax", {x}, {{"axis", axis}});
        g.apply1("softmax_backward", {dy, y}, {{"axis", axis}});
      };
      c.steps = 1;
      expect_same_for_every_thread_count(c);
    }
  }
}

// Max, average and global average pooling, forward and backward, over 222 planes of 29 x 31
// (several chunks of planes), with padding and overlapping windows.
TEST(DenseThreads, Pooling) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    Case c;
    c.label = std::string("pooling ") + dtype_name(dtype);
    const Shape xs{6, 37, 29, 31};
    const Attrs win{{"kernel", Shape{3, 3}}, {"stride", Shape{2, 2}}, {"padding", Shape{1, 1}}};
    c.feeds = {{"x", data(xs, dtype, 51)}};
    c.build = [=](Graph& g) {
      ValueId x = g.input("x", {dtype, xs});
      auto mp = g.apply("max_pool2d", {x}, win);
      Attrs back = win;
      back.set("input_shape", xs);
      g.apply1("max_pool2d_backward", {mp[0], mp[1]}, back);
      ValueId ap = g.apply1("avg_pool2d", {x}, win);
      g.apply1("avg_pool2d_backward", {ap}, back);
      ValueId gp = g.apply1("global_avg_pool2d", {x});
      g.apply1("global_avg_pool2d_backward", {gp}, {{"input_shape", xs}});
    };
    c.steps = 1;
    expect_same_for_every_thread_count(c);
  }
}

}  // namespace
}  // namespace qg
