// Every single-loop path of the CPU fused observer + quantizer
// (ops/fused/observe_quantize/cpu_kernel.cpp) against the unfused graph, bit for bit: outputs,
// masks, scale, zero point and every state, over a sequence of steps that trains, switches
// the observer off, evaluates, switches fake-quantization off and trains again. Cases cross
// each scope layout (tensor, channel on the first / a middle / the last axis, token, group
// on the innermost axis and across an inner extent, tail groups included) with each
// quantizer (fake_quantize, quantize to u8 and s8), f32 / bf16 / f16, min/max and moving
// average observers, delayed or not. The data carries NaN, +/-Inf, signed zeros, a row of
// one repeated value, a row and a column without finite values, and values far outside the
// previous step's range (for delayed qparams).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "runtime/executor.h"
#include "runtime/passes/pass.h"

namespace qg {
namespace {

struct PathCase {
  std::string label;
  std::string observer, quantizer;
  DType dtype;
  Shape shape;
  Attrs attrs;           // shared by the observer and the quantizer
  Attrs observer_only;   // qscheme, delayed
  Attrs quantizer_only;  // out_dtype
};

// Test names and failure messages show the label, not the struct's bytes.
void PrintTo(const PathCase& c, std::ostream* os) {
  *os << c.label;
}

// Step data: normal values of a growing spread, with special values at fixed places.
Tensor step_input(const PathCase& c, int step) {
  const int64_t n = shape_numel(c.shape);
  const int64_t last = c.shape.empty() || c.shape.back() == 0 ? 1 : c.shape.back();
  std::mt19937_64 rng(1000 * step + n);
  std::normal_distribution<double> d(0.0, 1.0 + 2.0 * step);
  std::vector<double> v(static_cast<size_t>(n));
  // Step 0 has no positive value, step 1 no negative one, so a zero is the first step's
  // maximum (and the first row's minimum too): its sign shows in the state.
  for (auto& x : v) x = step == 0 ? -std::fabs(d(rng)) : step == 1 ? std::fabs(d(rng)) : d(rng);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t row = k / last, col = k % last;
    if (col == 0) v[k] = (row % 2) ? -0.0 : 0.0;                  // a column of signed zeros only
    if (step == 0 && row == 0) v[k] = (k % 3) ? -0.0 : 0.0;       // a row of signed zeros only
    if (step == 2 && row == 0) v[k] = -0.0;                       // a row of -0 only
    if (step == 2 && row == 1) v[k] = 0.375;                      // a row of one value
    if (step == 3 && row == 2) v[k] = (k % 2) ? NAN : -INFINITY;  // no finite value
    if (step == 4 && k % 11 == 5) v[k] *= 1000.0;                 // far outside the last range
    if (step == 5 && row == 3) v[k] *= 1e-6;                      // a row of f16 subnormals
  }
  if (n >= 16) {
    v[1] = -0.0;
    v[3] = 0.0;
    v[5] = 3.0e-6;  // subnormal in f16
    v[7] = NAN;
    v[9] = -2.0e-7;  // subnormal in f16
    v[11] = 1e-39;   // subnormal in f32 and bf16, 0 in f16
    v[n - 2] = INFINITY;
    v[n / 2] = -INFINITY;
  }
  return Tensor::from_doubles(c.shape, v, c.dtype);
}

struct Built {
  Graph g;
  ValueId y = kNoValue, mask = kNoValue, scale = kNoValue, zp = kNoValue;
  NodeId obs = -1, quant = -1;  // the same node when fused
};

void build(Built& b, const PathCase& c, bool fuse) {
  ValueId x = b.g.input("x", {c.dtype, c.shape});
  Attrs oa = c.attrs, qa = c.attrs;
  for (const auto& [k, v] : c.observer_only.items()) oa.set(k, v);
  for (const auto& [k, v] : c.quantizer_only.items()) qa.set(k, v);
  auto qp = b.g.apply(c.observer, {x}, oa);
  auto out = b.g.apply(c.quantizer, {x, qp[0], qp[1]}, qa);
  b.g.set_name(out[0], "y");
  b.g.set_name(out[1], "mask");
  b.scale = qp[0];
  b.zp = qp[1];
  b.obs = b.g.value(qp[0]).producer;
  b.quant = b.g.value(out[0]).producer;
  if (fuse) {
    ASSERT_EQ(optimize(b.g, PassOptions{}).at(1).rewrites, 1);
    b.quant = b.obs = b.g.value(b.g.at("y")).producer;
    ASSERT_EQ(b.g.node(b.obs).op->name, "fused_observe_quantize");
    b.scale = b.g.node(b.obs).outputs[2];
    b.zp = b.g.node(b.obs).outputs[3];
  }
  b.y = b.g.at("y");
  b.mask = b.g.at("mask");
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

// Sets a flag state on both graphs (each has it once: on the observer / quantizer or fused).
void set_flag(Executor& ep, const Built& p, Executor& ef, const Built& f, const std::string& name,
              double value, bool on_quantizer) {
  ep.state(on_quantizer ? p.quant : p.obs, name).fill(value);
  ef.state(f.obs, name).fill(value);
}

class CpuFusedPath : public ::testing::TestWithParam<PathCase> {};

TEST_P(CpuFusedPath, EqualsUnfusedBitForBit) {
  const PathCase& c = GetParam();
  Built plain, fused;
  build(plain, c, false);
  build(fused, c, true);
  Executor ep(plain.g), ef(fused.g);
  const bool fq = c.quantizer == "fake_quantize";
  const char* what[] = {"y", "mask", "scale", "zero_point"};
  for (int step = 0; step < 7; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    // 0, 1: training; 2: observer off; 3: eval; 4: fake-quant off; 5, 6: training again.
    set_flag(ep, plain, ef, fused, "observer_enabled", step == 2 ? 0 : 1, false);
    ep.set_training(step != 3);
    ef.set_training(step != 3);
    if (fq) set_flag(ep, plain, ef, fused, "fake_quant_enabled", step == 4 ? 0 : 1, true);
    Tensor x = step_input(c, step);
    auto a = ep.run({{"x", x}}, {plain.y, plain.mask, plain.scale, plain.zp});
    auto b = ef.run({{"x", x}}, {fused.y, fused.mask, fused.scale, fused.zp});
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i], b[i])) << what[i];
    std::vector<Tensor> sp = ep.states(plain.obs);
    const auto& sq = ep.states(plain.quant);
    sp.insert(sp.end(), sq.begin(), sq.end());
    const auto& sf = ef.states(fused.obs);
    ASSERT_EQ(sp.size(), sf.size());
    for (size_t i = 0; i < sp.size(); ++i)
      EXPECT_TRUE(same_bits(sp[i], sf[i])) << "state " << fused.g.node(fused.obs).states[i].name;
  }
}

// A range too wide for f32 (max - min overflows) gives an infinite scale: the fused kernel
// throws the quantizer's own error, after the same observer update as the unfused graph.
TEST(CpuFusedPathErrors, InfiniteScaleThrowsTheQuantizersErrorWithTheSameState) {
  for (const char* scope : {"tensor", "token"})
    for (const char* q : {"fake_quantize", "quantize"}) {
      SCOPED_TRACE(std::string(scope) + " " + q);
      PathCase c{"", "minmax_observer", q, DType::f32, {4, 16}, {{"scope", scope}}, {}, {}};
      Built plain, fused;
      build(plain, c, false);
      build(fused, c, true);
      Executor ep(plain.g), ef(fused.g);
      std::vector<double> v(64, 1.0);
      v[40] = -3e38;  // row 2 only
      v[41] = 3e38;
      Tensor x = Tensor::from_doubles(c.shape, v);
      std::string ea, eb;
      try {
        ep.run({{"x", x}}, {plain.y, plain.mask});
      } catch (const Error& e) {
        ea = e.what();
      }
      try {
        ef.run({{"x", x}}, {fused.y, fused.mask});
      } catch (const Error& e) {
        eb = e.what();
      }
      EXPECT_NE(ea.find("must be positive and finite"), std::string::npos) << ea;
      EXPECT_EQ(ea, eb);
      const auto& sp = ep.states(plain.obs);
      for (size_t i = 0; i < sp.size(); ++i)
        EXPECT_TRUE(same_bits(sp[i], ef.states(fused.obs)[i])) << "state " << i;
    }
}

struct ScopeSpec {
  std::string label;
  Shape shape;
  Attrs attrs;
  Attrs observer_only;
};

std::vector<ScopeSpec> scopes() {
  const Attrs sym{{"qscheme", "symmetric"}};
  return {
      {"tensor", {7, 37}, {}, {}},
      {"tensor_sym", {5, 24}, {{"signed", true}}, sym},
      {"tensor_chunks", {3, 20000}, {}, {}},  // more than one 16 Ki chunk
      {"channel_first", {6, 40}, {{"scope", "channel"}, {"axis", 0}}, {}},
      {"channel_first_short_rows", {4, 3, 2}, {{"scope", "channel"}, {"axis", 0}}, {}},
      {"channel_middle", {3, 5, 24}, {{"scope", "channel"}, {"axis", 1}}, {}},
      {"channel_middle_narrow", {4, 3, 5}, {{"scope", "channel"}, {"axis", 1}, {"bits", 4}}, {}},
      {"channel_last", {9, 37}, {{"scope", "channel"}, {"axis", -1}}, {}},
      {"channel_last_sym", {20, 8}, {{"scope", "channel"}, {"axis", 1}, {"signed", true}}, sym},
      {"channel_last_chunks", {3000, 8}, {{"scope", "channel"}, {"axis", -1}}, {}},
      {"token", {3, 4, 21}, {{"scope", "token"}}, {}},
      {"token_sym", {5, 64}, {{"scope", "token"}, {"signed", true}}, sym},
      {"group_inner_tail", {6, 40}, {{"scope", "group"}, {"axis", -1}, {"group_size", 16}}, {}},
      {"group_inner_small", {5, 37}, {{"scope", "group"}, {"axis", 1}, {"group_size", 3}}, {}},
      {"group_outer_tail",
       {12, 9},
       {{"scope", "group"}, {"axis", 0}, {"group_size", 5}, {"bits", 4}},
       {}},
      {"group_middle", {2, 8, 12}, {{"scope", "group"}, {"axis", 1}, {"group_size", 4}}, sym},
      {"empty", {0, 8}, {}, {}},
  };
}

std::vector<PathCase> all_cases() {
  std::vector<PathCase> cases;
  const std::vector<std::pair<std::string, DType>> dtypes = {
      {"f32", DType::f32}, {"bf16", DType::bf16}, {"f16", DType::f16}};
  for (const ScopeSpec& s : scopes())
    for (const char* obs : {"minmax_observer", "moving_average_observer"})
      for (bool delayed : {false, true})
        for (const char* q : {"fake_quantize", "quantize_u8", "quantize_s8"})
          for (const auto& [dname, dt] : dtypes) {
            PathCase c{s.label, obs, "fake_quantize", dt, s.shape, s.attrs, s.observer_only, {}};
            std::string qs = q;
            if (qs != "fake_quantize") {
              const bool s8 = qs == "quantize_s8";
              c.quantizer = "quantize";
              c.attrs.set("signed", s8);
              c.quantizer_only.set("out_dtype", s8 ? "i8" : "u8");
              // The symmetric zero point of an unsigned range is 128, which fits u8.
            }
            if (delayed) c.observer_only.set("delayed", true);
            c.label += std::string("_") + (obs[0] == 'm' && obs[1] == 'i' ? "minmax" : "movavg") +
                       (delayed ? "_delayed_" : "_") + qs + "_" + dname;
            cases.push_back(c);
          }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllPaths, CpuFusedPath, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<PathCase>& info) {
                           return info.param.label;
                         });

}  // namespace
}  // namespace qg
