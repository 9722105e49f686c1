// causal_attention: values worked out by hand (a two-key softmax, GQA at T = 1), the gradient
// check, the fused op against the composed graph it replaces (forward and gradients, f32 and
// bf16, T = 1, odd T, head dims 64 and 128, GQA and MQA), the pinned crosscheck cases, bad
// inputs, and the GPU against the CPU (tests/conformance/causal_attention_conformance.py
// checks against PyTorch). A fully masked row cannot occur: row i always sees key i.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "autograd/grad.h"
#include "nn/causal_attention_core.h"
#include "ops/attention/attention_cuda.h"
#include "runtime/crosscheck.h"
#include "runtime/gradcheck.h"
#include "runtime/op_call.h"
#include "tests/common/crosscheck_pins.h"
#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::relative_error;
using testing::run_op;

Attrs scale(double s) {
  return {{"scale", s}};
}

// Row 0 sees key 0 only: o_0 = v_0, lse_0 = s_00 = q_0 . k_0 = 0. Row 1: s_10 = 0 and
// s_11 = ln 3, so p = (1/4, 3/4), o_1 = v_0 / 4 + 3 v_1 / 4 = (1, 6), lse_1 = ln(1 + 3).
TEST(CausalAttention, TwoKeySoftmaxByHand) {
  const double ln3 = std::log(3.0);
  Tensor q = Tensor::from_doubles({1, 1, 2, 2}, {2, 5, 1, 0}, DType::f64);
  Tensor k = Tensor::from_doubles({1, 1, 2, 2}, {0, 0, ln3, 0}, DType::f64);
  Tensor v = Tensor::from_doubles({1, 1, 2, 2}, {4, 0, 0, 8}, DType::f64);
  auto out = run_op(Device::cpu(), "causal_attention", {q, k, v}, scale(1.0));
  const std::vector<double> o = out[0].to_doubles(), lse = out[1].to_doubles();
  const std::vector<double> want_o = {4, 0, 1, 6};
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(o[i], want_o[i], 1e-15) << i;
  EXPECT_EQ(lse[0], 0.0);
  EXPECT_NEAR(lse[1], std::log(4.0), 1e-15);
}

// T = 1: one key per row, so o = v of the head's KV head and lse = q . k * scale, with query
// heads 0, 1 reading KV head 0 and heads 2, 3 reading KV head 1 (repeat_kv's order). The
// default scale is head_dim^-1/2 = 1/2 here.
TEST(CausalAttention, GroupedHeadsAtOneStepByHand) {
  Tensor q = Tensor::from_doubles({1, 4, 1, 4}, {1, 0, 0, 0, 0, 2, 0, 0, 1, 1, 1, 1, 0, 0, 0, 3},
                                  DType::f32);
  Tensor k = Tensor::from_doubles({1, 2, 1, 4}, {2, 4, 6, 8, -1, -1, 1, 1}, DType::f32);
  Tensor v = Tensor::from_doubles({1, 2, 1, 4}, {1, 2, 3, 4, 5, 6, 7, 8}, DType::f32);
  auto out = run_op(Device::cpu(), "causal_attention", {q, k, v});
  EXPECT_EQ(out[0].to_doubles(),
            (std::vector<double>{1, 2, 3, 4, 1, 2, 3, 4, 5, 6, 7, 8, 5, 6, 7, 8}));
  EXPECT_EQ(out[1].to_doubles(), (std::vector<double>{1, 4, 0, 1.5}));
  EXPECT_EQ(out[1].dtype(), DType::f32);
}

TEST(CausalAttention, PassesTheGradientCheck) {
  const OpDef& op = OpRegistry::instance().get("causal_attention");
  for (const GradcheckSample& s : op.gradcheck_samples()) {
    GradcheckResult r = gradcheck(op, s);
    EXPECT_TRUE(r.passed) << s.label << " " << r.error << " " << r.max_rel_error;
  }
}

struct Case {
  int64_t n, heads, kv_heads, seq, head_dim;
};

struct Result {
  Tensor o, dq, dk, dv;
};

// o and the gradients of sum(o * c) for q, k, v of `dtype` (drawn in f32 and cast), through
// the fused op or the composed graph, on the CPU.
Result run_attention(const Case& c, DType dtype, bool fused, uint32_t seed) {
  const Shape qs{c.n, c.heads, c.seq, c.head_dim}, ks{c.n, c.kv_heads, c.seq, c.head_dim};
  Graph g;
  ValueId q = g.input("q", {dtype, qs}), k = g.input("k", {dtype, ks}),
          v = g.input("v", {dtype, ks});
  ValueId w = g.input("w", {dtype, qs});
  ValueId o = fused ? nn::fused_causal_attention(g, q, k, v, "attn")
                    : nn::composed_causal_attention(g, q, k, v, "attn");
  ValueId loss = g.apply1("sum", {g.apply1("mul", {o, w})});
  std::vector<ValueId> d = grad(g, loss, {q, k, v});
  Executor ex(g);
  auto got = ex.run({{"q", testing::random_f32(qs, seed).cast(dtype)},
                     {"k", testing::random_f32(ks, seed + 1).cast(dtype)},
                     {"v", testing::random_f32(ks, seed + 2).cast(dtype)},
                     {"w", testing::random_f32(qs, seed + 3).cast(dtype)}},
                    {o, d[0], d[1], d[2]});
  return {got[0], got[1], got[2], got[3]};
}

const std::vector<Case>& composed_cases() {
  static const std::vector<Case> cases = {
      {2, 4, 2, 1, 64},    // T = 1
      {1, 4, 2, 7, 64},    // odd T, GQA
      {2, 4, 1, 9, 128},   // MQA, head dim 128
      {1, 2, 2, 33, 64},   // no grouping, a tile and one
      {1, 4, 2, 16, 128},  // GQA, head dim 128
  };
  return cases;
}

std::string label(const Case& c) {
  return "[" + std::to_string(c.n) + "," + std::to_string(c.heads) + "," + std::to_string(c.seq) +
         "," + std::to_string(c.head_dim) + "] kv " + std::to_string(c.kv_heads);
}

// f32: the fused op and the composed graph compute the same sums in other orders (the
// composed scores are Eigen GEMMs), so they agree to a few f32 ulps at each tensor's scale;
// 2e-6 leaves room for ~16 ulps and sits far below any wrong mask or head mapping.
TEST(CausalAttention, MatchesTheComposedGraphInF32) {
  uint32_t seed = 10;
  for (const Case& c : composed_cases()) {
    Result f = run_attention(c, DType::f32, true, seed),
           r = run_attention(c, DType::f32, false, seed);
    seed += 4;
    EXPECT_LE(relative_error(f.o, r.o), 2e-6) << label(c);
    EXPECT_LE(relative_error(f.dq, r.dq), 2e-6) << label(c);
    EXPECT_LE(relative_error(f.dk, r.dk), 2e-6) << label(c);
    EXPECT_LE(relative_error(f.dv, r.dv), 2e-6) << label(c);
  }
}

// bf16 against the composed f32 graph on the same (bf16-valued) inputs. The fused op keeps
// the scores and statistics in f32 and rounds each output once, so o is within one bf16
// rounding of the f32 result: bf16's unit roundoff 2^-8 of the element, hence of max |o|
// (1% over it for the f32 sums' own error; measured up to 0.0032). The gradients also see o
// and do rounded to bf16 in D = do . o, whose error reaches ds = p (dp - D) through a
// difference that can cancel; 2^-6 bounds that (measured up to 0.005).
TEST(CausalAttention, Bf16IsCloseToTheF32Result) {
  uint32_t seed = 40;
  for (const Case& c : composed_cases()) {
    Result f = run_attention(c, DType::bf16, true, seed);
    Result r = run_attention(c, DType::f32, false, seed);  // random_f32 then cast: same values
    seed += 4;
    const double eo = relative_error(f.o, r.o), eq = relative_error(f.dq, r.dq);
    const double ek = relative_error(f.dk, r.dk), ev = relative_error(f.dv, r.dv);
    std::printf("%s bf16 vs f32: o %.3g dq %.3g dk %.3g dv %.3g\n", label(c).c_str(), eo, eq, ek,
                ev);
    EXPECT_LE(eo, 1.01 * std::ldexp(1.0, -8)) << label(c);
    for (double e : {eq, ek, ev}) EXPECT_LE(e, std::ldexp(1.0, -6)) << label(c);
  }
}

// Pinned, so that no `qat crosscheck` case goes missing unnoticed.
TEST(CausalAttention, KeepsItsCrosscheckCases) {
  testing::expect_crosscheck_pins("causal_attention", 7, {-1});
  testing::expect_crosscheck_pins("causal_attention_backward", 0, {-1});
  // The gradient-check samples are crosschecked too, so head dims 64 and 128.
  EXPECT_EQ(OpRegistry::instance().get("causal_attention").gradcheck_samples().size(), 4u);
}

TEST(CausalAttention, BadInputsAreNamedErrors) {
  Graph g;
  auto in = [&](const std::string& name, DType d, Shape s) { return g.input(name, {d, s}); };
  ValueId q = in("q", DType::f32, {2, 4, 5, 8}), k = in("k", DType::f32, {2, 2, 5, 8});
  ValueId v = in("v", DType::f32, {2, 2, 5, 8});
  ValueId q3 = in("q3", DType::f32, {4, 5, 8}), k3 = in("k3", DType::f32, {2, 5, 8});
  ValueId k_seq = in("k_seq", DType::f32, {2, 2, 6, 8});
  ValueId v_heads = in("v_heads", DType::f32, {2, 1, 5, 8});
  ValueId k3h = in("k3h", DType::f32, {2, 3, 5, 8}), v3h = in("v3h", DType::f32, {2, 3, 5, 8});
  ValueId k16 = in("k16", DType::bf16, {2, 2, 5, 8});
  ValueId qi = in("qi", DType::i32, {2, 4, 5, 8});
  ValueId q0 = in("q0", DType::f32, {2, 4, 0, 8}), k0 = in("k0", DType::f32, {2, 2, 0, 8});
  const std::string op = "[causal_attention]";
  expect_error(
      [&] {
        g.apply("causal_attention", {q3, k, v});
      },
      {op, "q must be [batch, heads, seq, head_dim]", "f32[4, 5, 8]"});
  expect_error(
      [&] {
        g.apply("causal_attention", {q, k3, k3});
      },
      {op, "k must be [batch, kv_heads, seq, head_dim]", "f32[2, 5, 8]"});
  expect_error(
      [&] {
        g.apply("causal_attention", {q, k, v_heads});
      },
      {op, "must have the same shape", "f32[2, 1, 5, 8]"});
  expect_error(
      [&] {
        g.apply("causal_attention", {q, k_seq, k_seq});
      },
      {op, "k and v must be [2, kv_heads, 5, 8]", "f32[2, 2, 6, 8]"});
  expect_error(
      [&] {
        g.apply("causal_attention", {q, k3h, v3h});
      },
      {op, "the 4 query heads", "multiple of the 3 KV heads"});
  expect_error(
      [&] {
        g.apply("causal_attention", {q, k16, v});
      },
      {op, "dtype mismatch", "bf16[2, 2, 5, 8]"});
  expect_error([&] { g.apply("causal_attention", {qi, k, v}); }, {op, "floating point", "i32"});
  expect_error(
      [&] {
        g.apply("causal_attention", {q0, k0, k0});
      },
      {op, "empty axis", "seq must be at least 1"});
  for (double s : {0.0, -1.0, std::numeric_limits<double>::infinity()})
    expect_error(
        [&] {
          g.apply("causal_attention", {q, k, v}, scale(s));
        },
        {op, "attribute 'scale'", "finite and > 0"});
  // The backward op's own inputs.
  ValueId lse = in("lse", DType::f32, {2, 4, 5}), lse64 = in("lse64", DType::f64, {2, 4, 5});
  ValueId lse_short = in("lse_short", DType::f32, {2, 4});
  ValueId o_bad = in("o_bad", DType::f32, {2, 4, 5, 4});
  const std::string bop = "[causal_attention_backward]";
  for (ValueId bad : {lse64, lse_short})
    expect_error(
        [&] {
          g.apply("causal_attention_backward", {q, k, v, q, bad, q});
        },
        {bop, "lse must be f32[2, 4, 5]", g.value(bad).type.str()});
  expect_error(
      [&] {
        g.apply("causal_attention_backward", {q, k, v, o_bad, lse, q});
      },
      {bop, "o f32[2, 4, 5, 4] must match q"});
  expect_error(
      [&] {
        g.apply("causal_attention_backward", {q, k, v, q, lse, o_bad});
      },
      {bop, "do f32[2, 4, 5, 4] must match q"});
  // A loss that reads lse: its gradient does not exist, and saying so beats a silent zero.
  auto outs = g.apply("causal_attention", {q, k, v}, {}, "attn");
  ValueId loss = g.apply1("sum", {outs[1]});
  expect_error([&] { grad(g, loss, {q}); }, {"causal_attention", "lse output has no gradient"});
}

// The CUDA kernels take any even head dim up to 256 (64 and 128 tiled, the others on the
// per-row kernels); the check runs before any launch, so it is testable here without a GPU,
// and through the op (forward and backward) where one is present.
TEST(CausalAttention, CudaRefusesOddOrLargeHeadDims) {
  AttentionLayout l;
  l.batch = 1, l.heads = 2, l.kv_heads = 1, l.seq = 4;
  for (int64_t hd : {2, 8, 32, 64, 96, 128, 200, 256}) {
    l.head_dim = hd;
    EXPECT_NO_THROW(check_cuda_layout("causal_attention", l)) << hd;
  }
  for (int64_t hd : {1, 7, 33, 258, 512}) {
    l.head_dim = hd;
    expect_error([&] { check_cuda_layout("causal_attention", l); },
                 {"[causal_attention]", "head_dim = " + std::to_string(hd), "not supported on CUDA",
                  "even head_dim up to 256"});
  }
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device present: the op-level check skipped";
  for (int64_t hd : {7, 264}) {
    Tensor q = testing::random_f32({1, 2, 4, hd}, 1), k = testing::random_f32({1, 1, 4, hd}, 2);
    expect_error(
        [&] {
          run_op(Device::cuda(), "causal_attention", {q, k, k});
        },
        {"causal_attention", "head_dim = " + std::to_string(hd), "not supported on CUDA"});
    Tensor lse = Tensor::zeros({1, 2, 4}, DType::f32);
    expect_error(
        [&] {
          run_op(Device::cuda(), "causal_attention_backward", {q, k, k, q, lse, q});
        },
        {"causal_attention_backward", "head_dim = " + std::to_string(hd), "not supported on CUDA"});
  }
}

// The bf16/f16 kernels move 16 bytes at a time: a directly called kernel handed a view that
// starts off a 16-byte boundary is refused by name rather than faulting.
TEST(CausalAttention, CudaRefusesMisalignedViews) {
  QG_REQUIRE_GPU();
  auto gpu = make_device_context(Device::cuda());
  Tensor base = testing::random_f32({1 + 2 * 4 * 64}, 3).cast(DType::bf16).to(Device::cuda());
  Tensor q = base.view(2, {1, 2, 4, 64}, DType::bf16);  // one element past the start
  Tensor k = testing::random_f32({1, 1, 4, 64}, 4).cast(DType::bf16).to(Device::cuda());
  expect_error(
      [&] {
        call_op(*gpu, "causal_attention", {q, k, k});
      },
      {"causal_attention", "input 0", "16-byte boundary"});
}

// Every element finite and of a size these cases can produce (inputs in [-1, 1], so |o| <= 1,
// |lse| < log T + hd * scale and the gradients stay far below 1e4): uninitialised or
// out-of-range memory cannot pass a comparison by accident (a relative error is blind to
// garbage in an all-zero reference, and NaN compares false).
void expect_sane(const Tensor& t, const std::string& what) {
  const std::vector<double> x = t.to_doubles();
  for (size_t e = 0; e < x.size(); ++e)
    if (!std::isfinite(x[e]) || std::abs(x[e]) > 1e4) {
      ADD_FAILURE() << what << ": element " << e << " of " << x.size() << " is " << x[e];
      return;
    }
}

bool all_zero(const Tensor& t) {
  for (double x : t.to_doubles())
    if (x != 0.0) return false;
  return true;
}

// Row 0 sees only key 0, so its softmax is constant and ds_00 = 0: at T = 1, dq and dk are
// exactly zero (not rounding noise, which a comparison relative to the all-zero reference
// would blow up), and dv is do summed over the KV head's query heads.
TEST(CausalAttention, OneStepHasNoScoreGradient) {
  for (DType d : {DType::f32, DType::f64, DType::bf16}) {
    SCOPED_TRACE(dtype_name(d));
    Tensor q = testing::random_f32({2, 4, 1, 64}, 5).cast(d);
    Tensor k = testing::random_f32({2, 2, 1, 64}, 6).cast(d);
    Tensor v = testing::random_f32({2, 2, 1, 64}, 7).cast(d);
    Tensor dout = testing::random_f32({2, 4, 1, 64}, 8).cast(d);
    auto fwd = run_op(Device::cpu(), "causal_attention", {q, k, v});
    auto g = run_op(Device::cpu(), "causal_attention_backward", {q, k, v, fwd[0], fwd[1], dout});
    EXPECT_TRUE(all_zero(g[0]));
    EXPECT_TRUE(all_zero(g[1]));
    const std::vector<double> dv = g[2].to_doubles(), dd = dout.to_doubles();
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t kv = 0; kv < 2; ++kv)
        for (int64_t x = 0; x < 64; ++x) {
          const double want = static_cast<double>(dd[((n * 4 + 2 * kv) * 64) + x] +
                                                  dd[((n * 4 + 2 * kv + 1) * 64) + x]);
          EXPECT_NEAR(dv[(n * 2 + kv) * 64 + x], want, d == DType::bf16 ? 1e-2 : 1e-6);
        }
  }
}

// GPU against CPU to rounding (the crosscheck rule: sums in another order), forward and
// backward (given the same o and lse), every dtype, head dims 64 and 128 (tiled kernels) and
// 8, 32, 96, 256 (the per-row kernels), GQA and MQA, T = 1, T not a multiple of any tile, T
// past several tiles. Every output is also checked for
// NaN/Inf/garbage, and at T = 1 dq and dk must be exactly zero on the GPU too.
TEST(CausalAttention, GpuMatchesCpu) {
  QG_REQUIRE_GPU();
  const std::vector<Case> cases = {{2, 4, 2, 65, 64},   {1, 8, 1, 130, 128}, {3, 2, 2, 1, 64},
                                   {1, 4, 2, 257, 128}, {2, 2, 1, 7, 64},    {2, 4, 2, 37, 8},
                                   {1, 4, 1, 40, 32},   {1, 2, 2, 1, 32},    {1, 8, 2, 33, 96},
                                   {1, 2, 1, 9, 256}};
  uint32_t seed = 1;
  for (const Case& c : cases)
    for (DType d : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
      const Shape qs{c.n, c.heads, c.seq, c.head_dim}, ks{c.n, c.kv_heads, c.seq, c.head_dim};
      Tensor q = testing::random_f32(qs, seed++).cast(d),
             k = testing::random_f32(ks, seed++).cast(d);
      Tensor v = testing::random_f32(ks, seed++).cast(d),
             dout = testing::random_f32(qs, seed++).cast(d);
      auto cpu = run_op(Device::cpu(), "causal_attention", {q, k, v});
      auto gpu = run_op(Device::cuda(), "causal_attention", {q, k, v});
      const std::string what = std::string(dtype_name(d)) + " " + label(c);
      SCOPED_TRACE(what);  // printed with every failure below, first in the message
      for (int i = 0; i < 2; ++i) {
        SCOPED_TRACE("output " + std::to_string(i));
        expect_sane(gpu[i], what + " gpu output " + std::to_string(i));
        EXPECT_LE(relative_error(gpu[i], cpu[i]), compare_rule("causal_attention", i, d).tolerance);
      }
      const std::vector<Tensor> ins = {q, k, v, cpu[0], cpu[1], dout};
      auto bcpu = run_op(Device::cpu(), "causal_attention_backward", ins);
      auto bgpu = run_op(Device::cuda(), "causal_attention_backward", ins);
      for (int i = 0; i < 3; ++i) {
        const char* names[] = {"dq", "dk", "dv"};
        SCOPED_TRACE(std::string("gradient ") + names[i]);
        expect_sane(bgpu[i], what + " gpu " + names[i]);
        if (c.seq == 1 && i < 2) {
          EXPECT_TRUE(all_zero(bgpu[i]));
        }
        EXPECT_LE(relative_error(bgpu[i], bcpu[i]),
                  compare_rule("causal_attention_backward", i, d).tolerance);
      }
    }
}

}  // namespace
}  // namespace qg
