// Graphs for the fuse_ste_producer tests (tests/passes on the CPU, tests/gpu_fused on the
// GPU): a permute or transpose, reshape views, then an ste_backward; or a same-shape add, then
// an ste_backward. The mask is a graph input fed with random bytes, so both bit values occur
// at every position of a mask byte; the data carries NaN, infinities and signed zeros.
#pragma once

#include <cmath>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/graph.h"
#include "ops/common/bitmask.h"
#include "runtime/executor.h"

namespace qg::testing {

struct ProducerCase {
  std::string producer;  // "permute", "transpose" or "add"
  DType dtype;
  Shape in_shape;             // the producer's input (both operands of an add)
  std::vector<int64_t> perm;  // permute: perm; transpose: {dim0, dim1}
  std::vector<Shape> views;   // reshape targets between the producer and the ste_backward
};

inline void PrintTo(const ProducerCase& c, std::ostream* os) {
  *os << c.producer << " " << dtype_name(c.dtype) << " " << shape_str(c.in_shape);
  if (!c.perm.empty()) *os << " perm " << shape_str(c.perm);
  for (const Shape& v : c.views) *os << " -> " << shape_str(v);
}

// Normal(0, 2) data with -0, +0, NaN, +Inf and -Inf at fixed positions, one of each in every
// run of 37 elements (so they land at every offset of a mask byte and of a pack).
inline Tensor producer_data(const Shape& shape, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, 2.0);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) x = d(rng);
  const double specials[] = {-0.0, 0.0, NAN, INFINITY, -INFINITY, -NAN};
  for (size_t i = 0; i < v.size(); i += 37) v[i] = specials[(i / 37) % 6];
  for (size_t i = 5; i < v.size(); i += 101) v[i] = -NAN;
  return Tensor::from_doubles(shape, v, dtype);
}

inline Tensor random_mask(int64_t numel, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> m(static_cast<size_t>(bitmask_bytes(numel)));
  for (auto& b : m) b = static_cast<double>(rng() & 0xff);
  return Tensor::from_doubles({static_cast<int64_t>(m.size())}, m, DType::u8);
}

// Inputs "a" (and "b" for an add) and "mask"; dx = ste_backward(views(producer(a[, b])), mask),
// named "dx". Returns the producer's output value.
inline ValueId build_producer_ste(Graph& g, const ProducerCase& c) {
  ValueId a = g.input("a", {c.dtype, c.in_shape});
  ValueId p;
  if (c.producer == "add") {
    p = g.apply1("add", {a, g.input("b", {c.dtype, c.in_shape})});
  } else if (c.producer == "transpose") {
    p = g.apply1("transpose", {a}, {{"dim0", c.perm.at(0)}, {"dim1", c.perm.at(1)}});
  } else {
    p = g.apply1("permute", {a}, {{"perm", c.perm}});
  }
  ValueId dy = p;
  for (const Shape& s : c.views) dy = g.apply1("reshape", {dy}, {{"shape", s}});
  ValueId mask = g.input("mask", {DType::u8, {bitmask_bytes(shape_numel(c.in_shape))}});
  ValueId dx = g.apply1("ste_backward", {dy, mask});
  g.set_name(dx, "dx");
  return p;
}

inline Executor::Feeds producer_feeds(const ProducerCase& c, uint64_t seed) {
  Executor::Feeds f = {{"a", producer_data(c.in_shape, c.dtype, seed)},
                       {"mask", random_mask(shape_numel(c.in_shape), seed + 1)}};
  if (c.producer == "add") f["b"] = producer_data(c.in_shape, c.dtype, seed + 2);
  return f;
}

// Permutes and transposes that take each route of the CUDA kernel (packs of 8, the tile
// transpose, the per-element gather) and adds of whole and partial mask bytes, in `dtype`.
inline std::vector<ProducerCase> producer_cases(DType t) {
  return {
      // Attention's head merge [B, H, S, D] -> [B, S, H, D] -> [B, S, H * D], scaled down:
      // packs of 8 (D = 64).
      {"permute", t, {2, 3, 5, 64}, {0, 2, 1, 3}, {{2, 5, 192}}},
      // Odd sizes: D = 9 is no multiple of 8, so the per-element gather; 945 elements end in
      // a partial mask byte.
      {"permute", t, {3, 5, 7, 9}, {0, 2, 1, 3}, {{3, 7, 45}}},
      // Innermost axis moved: the per-element gather, two views in a row.
      {"permute", t, {5, 3, 7}, {2, 0, 1}, {{7, 15}, {105}}},
      // A batched swap of the last two axes with sides >= 16: the tile transpose, odd sides.
      {"permute", t, {3, 33, 40}, {0, 2, 1}, {}},
      {"transpose", t, {5, 33, 17}, {1, 2}, {{5, 561}}},
      // A rank-5 permute whose merged plan keeps a run of 40 innermost: packs of 8.
      {"permute", t, {2, 3, 4, 2, 5}, {1, 0, 2, 3, 4}, {{240}}},
      {"add", t, {7, 9}, {}, {}},            // 63: a partial last mask byte
      {"add", t, {64, 768}, {}, {{49152}}},  // whole packs, a view
      {"add", t, {3, 1001}, {}, {}},         // 3003: several blocks, a partial last byte
  };
}

}  // namespace qg::testing
