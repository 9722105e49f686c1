// causal_attention through cuDNN's fused SDPA (ops/attention/attention_cudnn.h): the backend
// switch and the cuDNN path's eligibility rules (no GPU needed); then, on a GPU with cuDNN
// built in, cuDNN forced (QG_ATTENTION_BACKEND=cudnn) against the CPU reference and against the
// project's kernels (QG_ATTENTION_BACKEND=kernel), forward and backward, bf16 and f16, head
// dims 64 and 128, GQA and MQA, T = 1 (forward only: cuDNN's backward refuses it) and odd T; each
// backward from the other's lse; strided views; a deterministic backward; and calls cuDNN cannot
// take, refused by name when cuDNN is forced and run by the project's kernels under `auto`.
//
// Tolerance: the crosscheck's rule for these ops (runtime/crosscheck.h): two storage ulps of the
// tensor's largest element (2^-7 relative for bf16, 2^-10 for f16). cuDNN and the CPU both sum
// in f32 and round each output once to the dtype; cuDNN also rounds P and dS to the dtype as
// tensor-core operands, as the project's kernels do, which stays near one ulp. Against the
// project's kernels: twice the rule, since each is held to the rule against the CPU.
// The measured errors are printed ("[cudnn attention]" lines) for the benchmark notes.
#include <gtest/gtest.h>

#include <cstdio>

#include "ops/attention/attention_backend.h"
#include "ops/attention/attention_cudnn.h"
#include "runtime/crosscheck.h"
#include "runtime/op_call.h"
#include "tests/common/scoped_env.h"
#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::relative_error;
using testing::run_op;
using testing::same_bits;
using testing::ScopedEnv;

struct Case {
  int64_t n, heads, kv_heads, seq, head_dim;
};

std::string label(const Case& c, DType d) {
  return std::string(dtype_name(d)) + " [" + std::to_string(c.n) + "," + std::to_string(c.heads) +
         "," + std::to_string(c.seq) + "," + std::to_string(c.head_dim) + "] kv " +
         std::to_string(c.kv_heads);
}

AttentionLayout layout_of(const Case& c) {
  AttentionLayout l;
  l.batch = c.n, l.heads = c.heads, l.kv_heads = c.kv_heads, l.seq = c.seq, l.head_dim = c.head_dim;
  return l;
}

Tensor random(const Shape& s, DType d, uint32_t seed) {
  return testing::random_f32(s, seed).cast(d);
}

// o [B, H, T, hd] laid out as [B, T, H, hd] (the layout a permuted view reads it back from).
// The backward's o must be the forward's output of the same q, k, v: cuDNN's backward is wrong
// for any other o (measured: dk off by 50-120% of its largest element for a random o, dq and
// dv within the rule), while the CPU reference reads o only through rowsum(do * o).
Tensor bthd_of(const Tensor& o) {
  const int64_t B = o.size(0), H = o.size(1), T = o.size(2), hd = o.size(3);
  const std::vector<double> x = o.to_doubles();
  std::vector<double> y(x.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t e = 0; e < hd; ++e)
          y[static_cast<size_t>(((b * T + t) * H + h) * hd + e)] =
              x[static_cast<size_t>(((b * H + h) * T + t) * hd + e)];
  return Tensor::from_doubles({B, T, H, hd}, y, o.dtype());
}

#define QG_REQUIRE_CUDNN_ATTENTION()                                                      \
  do {                                                                                    \
    QG_REQUIRE_GPU();                                                                     \
    if (!cudnn_attention::built())                                                        \
      GTEST_SKIP() << "built without the cuDNN frontend (configure found none): skipped"; \
  } while (0)

TEST(AttentionBackend, ReadsTheEnvironmentSwitch) {
  const std::string op = "causal_attention";
  EXPECT_EQ(parse_attention_backend(op, nullptr), AttentionBackend::automatic);
  EXPECT_EQ(parse_attention_backend(op, ""), AttentionBackend::automatic);
  EXPECT_EQ(parse_attention_backend(op, "auto"), AttentionBackend::automatic);
  EXPECT_EQ(parse_attention_backend(op, "cudnn"), AttentionBackend::cudnn);
  EXPECT_EQ(parse_attention_backend(op, "kernel"), AttentionBackend::kernel);
  {
    ScopedEnv env("QG_ATTENTION_BACKEND", "kernel");
    EXPECT_EQ(attention_backend(op), AttentionBackend::kernel);
  }
  {
    ScopedEnv env("QG_ATTENTION_BACKEND", nullptr);
    EXPECT_EQ(attention_backend(op), AttentionBackend::automatic);
    EXPECT_STREQ(attention_backend_name(attention_backend(op)), "auto");
  }
  {
    ScopedEnv env("QG_ATTENTION_DETERMINISTIC", nullptr);
    EXPECT_TRUE(attention_deterministic(op));
  }
  {
    ScopedEnv env("QG_ATTENTION_DETERMINISTIC", "0");
    EXPECT_FALSE(attention_deterministic(op));
  }
}

TEST(AttentionBackend, BadValuesAreNamedErrors) {
  {
    ScopedEnv env("QG_ATTENTION_BACKEND", "fast");
    expect_error([] { attention_backend("causal_attention"); },
                 {"[causal_attention]", "QG_ATTENTION_BACKEND = 'fast'", "auto, cudnn, kernel"});
  }
  ScopedEnv env("QG_ATTENTION_DETERMINISTIC", "yes");
  expect_error([] { attention_deterministic("causal_attention_backward"); },
               {"[causal_attention_backward]", "QG_ATTENTION_DETERMINISTIC = 'yes'", "0 or 1"});
}

// The rules hold for host tensors too (addresses and strides only), so they run without a GPU.
TEST(CudnnAttention, NamesTheCallsItCannotTake) {
  const Case c{1, 2, 1, 4, 64};
  const AttentionLayout l = layout_of(c);
  auto fwd = [&](DType d, int64_t hd) {
    return std::vector<Tensor>{Tensor::zeros({1, 2, 4, hd}, d), Tensor::zeros({1, 1, 4, hd}, d),
                               Tensor::zeros({1, 1, 4, hd}, d)};
  };
  const std::vector<Tensor> outs = {Tensor::zeros({1, 2, 4, 64}, DType::bf16),
                                    Tensor::zeros({1, 2, 4}, DType::f32)};
  EXPECT_EQ(cudnn_attention::unsupported(l, fwd(DType::bf16, 64), outs), "");
  EXPECT_EQ(cudnn_attention::unsupported(l, fwd(DType::f16, 64), outs), "");
  EXPECT_NE(cudnn_attention::unsupported(l, fwd(DType::f32, 64), outs).find("dtype f32"),
            std::string::npos);
  AttentionLayout l96 = l;
  l96.head_dim = 96;
  EXPECT_NE(cudnn_attention::unsupported(l96, fwd(DType::bf16, 96), outs).find("head_dim = 96"),
            std::string::npos);

  // q one element past a 16-byte boundary; q with rows 65 elements (130 bytes) apart.
  Tensor base = Tensor::zeros({1 + 2 * 4 * 65}, DType::bf16);
  std::vector<Tensor> ins = fwd(DType::bf16, 64);
  ins[0] = base.as_strided({1, 2, 4, 64}, {512, 256, 64, 1}, 1);
  EXPECT_NE(cudnn_attention::unsupported(l, ins, outs).find("input 0 [1, 2, 4, 64]"),
            std::string::npos);
  EXPECT_NE(cudnn_attention::unsupported(l, ins, outs).find("starts off a 16-byte boundary"),
            std::string::npos);
  ins[0] = base.as_strided({1, 2, 4, 64}, {520, 260, 65, 1});
  EXPECT_NE(cudnn_attention::unsupported(l, ins, outs).find("not a multiple of 16 bytes"),
            std::string::npos);

  // The backward's lse read with a seq stride: cuDNN is given packed statistics only.
  std::vector<Tensor> bwd = fwd(DType::bf16, 64);
  bwd.push_back(Tensor::zeros({1, 2, 4, 64}, DType::bf16));
  bwd.push_back(Tensor::zeros({1, 4, 2}, DType::f32).as_strided({1, 2, 4}, {8, 1, 2}));
  bwd.push_back(Tensor::zeros({1, 2, 4, 64}, DType::bf16));
  const std::string why = cudnn_attention::unsupported(l, bwd, fwd(DType::bf16, 64));
  EXPECT_NE(why.find("input 4"), std::string::npos) << why;
  EXPECT_NE(why.find("seq stride other than 1"), std::string::npos) << why;

  // A single-token backward (cuDNN refuses s_q = s_kv = 1); the forward of it is taken.
  AttentionLayout l1 = l;
  l1.seq = 1;
  auto one = [](const Shape& s, DType d) { return Tensor::zeros(s, d); };
  const std::vector<Tensor> fwd1 = {one({1, 2, 1, 64}, DType::bf16),
                                    one({1, 1, 1, 64}, DType::bf16),
                                    one({1, 1, 1, 64}, DType::bf16)};
  const std::vector<Tensor> out1 = {one({1, 2, 1, 64}, DType::bf16), one({1, 2, 1}, DType::f32)};
  EXPECT_EQ(cudnn_attention::unsupported(l1, fwd1, out1), "");
  std::vector<Tensor> bwd1 = fwd1;
  for (const Tensor& t : {out1[0], out1[1], out1[0]}) bwd1.push_back(t);
  EXPECT_NE(cudnn_attention::unsupported(l1, bwd1, fwd1).find("T = 1"), std::string::npos);
}

// f32 (and a head dim off 64/128) stays on the project's kernels: forcing cuDNN on it is a named
// error, `auto` runs the kernels and gives their bits.
TEST(CudnnAttention, ForcedOnACallItCannotTakeIsANamedError) {
  QG_REQUIRE_GPU();
  const std::string no_frontend = "no cuDNN frontend";
  for (auto [d, hd] : {std::pair{DType::f32, int64_t{64}}, std::pair{DType::bf16, int64_t{96}}}) {
    SCOPED_TRACE(std::string(dtype_name(d)) + " hd " + std::to_string(hd));
    Tensor q = random({1, 2, 5, hd}, d, 1), k = random({1, 1, 5, hd}, d, 2);
    const std::string reason = !cudnn_attention::built() ? no_frontend
                               : d == DType::f32         ? "dtype f32"
                                                         : "head_dim = 96";
    {
      ScopedEnv env("QG_ATTENTION_BACKEND", "cudnn");
      expect_error(
          [&] {
            run_op(Device::cuda(), "causal_attention", {q, k, k});
          },
          {"causal_attention", "QG_ATTENTION_BACKEND=cudnn", reason});
      Tensor lse = Tensor::zeros({1, 2, 5}, DType::f32);
      expect_error(
          [&] {
            run_op(Device::cuda(), "causal_attention_backward", {q, k, k, q, lse, q});
          },
          {"causal_attention_backward", "QG_ATTENTION_BACKEND=cudnn", reason});
    }
    std::vector<Tensor> automatic, kernel;
    {
      ScopedEnv env("QG_ATTENTION_BACKEND", "auto");
      automatic = run_op(Device::cuda(), "causal_attention", {q, k, k});
    }
    {
      ScopedEnv env("QG_ATTENTION_BACKEND", "kernel");
      kernel = run_op(Device::cuda(), "causal_attention", {q, k, k});
    }
    EXPECT_TRUE(same_bits(automatic[0], kernel[0]));
  }
}

std::vector<Tensor> run_on(const char* backend, const std::string& op,
                           const std::vector<Tensor>& inputs) {
  ScopedEnv env("QG_ATTENTION_BACKEND", backend);
  return run_op(Device::cuda(), op, inputs);
}

bool row_zero_is_zero(const Tensor& dq, const Case& c) {
  const std::vector<double> x = dq.to_doubles();
  for (int64_t nh = 0; nh < c.n * c.heads; ++nh)
    for (int64_t e = 0; e < c.head_dim; ++e)
      if (x[static_cast<size_t>(nh * c.seq * c.head_dim + e)] != 0.0) return false;
  return true;
}

void report(const std::string& what, const char* name, double vs_cpu, double vs_kernel) {
  std::printf("[cudnn attention] %-28s %-3s error vs cpu %.3e, vs kernel %.3e\n", what.c_str(),
              name, vs_cpu, vs_kernel);
}

TEST(CudnnAttention, MatchesTheCpuAndTheKernels) {
  QG_REQUIRE_CUDNN_ATTENTION();
  // Odd T, MQA, T = 1, T past several tiles, Llama's 16 heads over 8.
  const std::vector<Case> cases = {{2, 4, 2, 65, 64},
                                   {1, 8, 1, 130, 128},
                                   {3, 2, 2, 1, 64},
                                   {1, 4, 2, 257, 128},
                                   {2, 16, 8, 128, 64}};
  uint32_t seed = 300;
  for (const Case& c : cases)
    for (DType d : {DType::bf16, DType::f16}) {
      const std::string what = label(c, d);
      SCOPED_TRACE(what);
      const Shape qs{c.n, c.heads, c.seq, c.head_dim}, ks{c.n, c.kv_heads, c.seq, c.head_dim};
      Tensor q = random(qs, d, seed++), k = random(ks, d, seed++), v = random(ks, d, seed++);
      Tensor dout = random(qs, d, seed++);
      const auto cpu = run_op(Device::cpu(), "causal_attention", {q, k, v});
      const auto cud = run_on("cudnn", "causal_attention", {q, k, v});
      const auto own = run_on("kernel", "causal_attention", {q, k, v});
      const char* fwd_names[] = {"o", "lse"};
      for (int i = 0; i < 2; ++i) {
        SCOPED_TRACE(fwd_names[i]);
        const double tol = compare_rule("causal_attention", i, d).tolerance;
        const double e_cpu = relative_error(cud[i], cpu[i]), e_own = relative_error(cud[i], own[i]);
        report(what, fwd_names[i], e_cpu, e_own);
        EXPECT_LE(e_cpu, tol);
        EXPECT_LE(e_own, 2 * tol);
      }
      // The backward from the CPU's o and lse, then each GPU backward from the other's forward.
      const std::vector<Tensor> ins = {q, k, v, cpu[0], cpu[1], dout};
      const auto bcpu = run_op(Device::cpu(), "causal_attention_backward", ins);
      if (c.seq == 1) {  // cuDNN refuses this backward: named when forced, the kernels' under auto
        expect_error([&] { run_on("cudnn", "causal_attention_backward", ins); },
                     {"causal_attention_backward", "QG_ATTENTION_BACKEND=cudnn", "T = 1"});
        const auto automatic = run_on("auto", "causal_attention_backward", ins);
        const auto kernel = run_on("kernel", "causal_attention_backward", ins);
        for (int i = 0; i < 3; ++i) EXPECT_TRUE(same_bits(automatic[i], kernel[i])) << i;
        continue;
      }
      const auto bcud = run_on("cudnn", "causal_attention_backward", ins);
      const auto bown = run_on("kernel", "causal_attention_backward", ins);
      const auto bcud_from_own =
          run_on("cudnn", "causal_attention_backward", {q, k, v, own[0], own[1], dout});
      const auto bown_from_cud =
          run_on("kernel", "causal_attention_backward", {q, k, v, cud[0], cud[1], dout});
      const char* names[] = {"dq", "dk", "dv"};
      for (int i = 0; i < 3; ++i) {
        SCOPED_TRACE(names[i]);
        const double tol = compare_rule("causal_attention_backward", i, d).tolerance;
        const double e_cpu = relative_error(bcud[i], bcpu[i]);
        const double e_own = relative_error(bcud[i], bown[i]);
        report(what, names[i], e_cpu, e_own);
        EXPECT_LE(e_cpu, tol);
        EXPECT_LE(e_own, 2 * tol);
        EXPECT_LE(relative_error(bcud_from_own[i], bcpu[i]), 2 * tol);
        EXPECT_LE(relative_error(bown_from_cud[i], bcpu[i]), 2 * tol);
      }
      // Row 0 sees one key: dq's row 0 is exactly zero.
      EXPECT_TRUE(row_zero_is_zero(bcud[0], c));
    }
}

// The default backward is deterministic (no atomics across query tiles): a repeated step gives
// the same bits, as the project's kernels do.
TEST(CudnnAttention, DefaultBackwardIsDeterministic) {
  QG_REQUIRE_CUDNN_ATTENTION();
  ScopedEnv det("QG_ATTENTION_DETERMINISTIC", nullptr);
  const Case c{2, 16, 8, 256, 64};
  const Shape qs{c.n, c.heads, c.seq, c.head_dim}, ks{c.n, c.kv_heads, c.seq, c.head_dim};
  Tensor q = random(qs, DType::bf16, 1), k = random(ks, DType::bf16, 2);
  Tensor v = random(ks, DType::bf16, 3), dout = random(qs, DType::bf16, 4);
  const auto fwd = run_on("cudnn", "causal_attention", {q, k, v});
  const std::vector<Tensor> ins = {q, k, v, fwd[0], fwd[1], dout};
  const auto a = run_on("cudnn", "causal_attention_backward", ins);
  const auto b = run_on("cudnn", "causal_attention_backward", ins);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(same_bits(a[i], b[i])) << "gradient " << i;
}

// q, k and v sliced out of one fused [B, T, H + 2 KV, hd] projection buffer, o and do permuted
// from [B, T, H, hd]: cuDNN reads the strides (lse stays packed). Compared with the CPU on
// contiguous copies, to the rule. Under `auto`, a permuted lse sends the backward to the
// project's kernels, whose bits it then gives.
TEST(CudnnAttention, TakesStridedViews) {
  QG_REQUIRE_CUDNN_ATTENTION();
  const int64_t B = 2, H = 4, KV = 2, T = 40, hd = 64, width = (H + 2 * KV) * hd;
  const DType d = DType::bf16;
  const Tensor qkv = random({B, T, H + 2 * KV, hd}, d, 7);
  const Tensor dob = random({B, T, H, hd}, d, 9);
  auto copy = [](const Tensor& t) {
    return Tensor::from_doubles(t.shape(), t.to_doubles(), t.dtype());
  };
  const Shape row{T * width, hd, width, 1}, perm{T * H * hd, hd, H * hd, 1};
  const std::vector<Tensor> host = {qkv.as_strided({B, H, T, hd}, row),
                                    qkv.as_strided({B, KV, T, hd}, row, H * hd),
                                    qkv.as_strided({B, KV, T, hd}, row, (H + KV) * hd)};
  const Tensor qkv_dev = qkv.to(Device::cuda());
  const std::vector<Tensor> dev = {qkv_dev.as_strided({B, H, T, hd}, row),
                                   qkv_dev.as_strided({B, KV, T, hd}, row, H * hd),
                                   qkv_dev.as_strided({B, KV, T, hd}, row, (H + KV) * hd)};
  std::vector<Tensor> copies;
  for (const Tensor& t : host) copies.push_back(copy(t));
  const auto fwd_cpu = run_op(Device::cpu(), "causal_attention", copies);
  const Tensor ob = bthd_of(fwd_cpu[0]);
  const Tensor ob_dev = ob.to(Device::cuda()), dob_dev = dob.to(Device::cuda());
  auto gpu = make_device_context(Device::cuda());
  auto host_of = [](std::vector<Tensor> ts) {
    for (Tensor& t : ts) t = t.to(Device::cpu());
    return ts;
  };
  std::vector<Tensor> fwd;
  {
    ScopedEnv env("QG_ATTENTION_BACKEND", "cudnn");
    fwd = host_of(call_op(*gpu, "causal_attention", dev));
  }
  EXPECT_LE(relative_error(fwd[0], fwd_cpu[0]), compare_rule("causal_attention", 0, d).tolerance);

  const Tensor lse_dev = fwd_cpu[1].to(Device::cuda());
  const std::vector<Tensor> bdev = {dev[0],  dev[1],
                                    dev[2],  ob_dev.as_strided({B, H, T, hd}, perm),
                                    lse_dev, dob_dev.as_strided({B, H, T, hd}, perm)};
  const std::vector<Tensor> bcopies = {copies[0],  copies[1],
                                       copies[2],  copy(ob.as_strided({B, H, T, hd}, perm)),
                                       fwd_cpu[1], copy(dob.as_strided({B, H, T, hd}, perm))};
  std::vector<Tensor> bwd;
  {
    ScopedEnv env("QG_ATTENTION_BACKEND", "cudnn");
    bwd = host_of(call_op(*gpu, "causal_attention_backward", bdev));
  }
  const auto bwd_cpu = run_op(Device::cpu(), "causal_attention_backward", bcopies);
  for (int i = 0; i < 3; ++i)
    EXPECT_LE(relative_error(bwd[i], bwd_cpu[i]),
              compare_rule("causal_attention_backward", i, d).tolerance)
        << "gradient " << i;

  // A permuted lse ([B, T, H] read as [B, H, T]): refused by name when forced, the kernels'
  // bits under auto.
  const Tensor lse_bth =
      Tensor::from_doubles({B, T, H}, std::vector<double>(static_cast<size_t>(B * T * H), 0.5),
                           DType::f32)
          .to(Device::cuda());
  std::vector<Tensor> permuted = bdev;
  permuted[4] = lse_bth.as_strided({B, H, T}, {T * H, 1, H});
  {
    ScopedEnv env("QG_ATTENTION_BACKEND", "cudnn");
    expect_error([&] { call_op(*gpu, "causal_attention_backward", permuted); },
                 {"causal_attention_backward", "QG_ATTENTION_BACKEND=cudnn", "input 4",
                  "seq stride other than 1"});
  }
  std::vector<Tensor> automatic, kernel;
  {
    ScopedEnv env("QG_ATTENTION_BACKEND", "auto");
    automatic = host_of(call_op(*gpu, "causal_attention_backward", permuted));
  }
  {
    ScopedEnv env("QG_ATTENTION_BACKEND", "kernel");
    kernel = host_of(call_op(*gpu, "causal_attention_backward", permuted));
  }
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(same_bits(automatic[i], kernel[i])) << "gradient " << i;
}

// Each operand's layout on its own, GQA and not: q, k, v sliced from a fused projection or
// packed; o and do permuted from [B, T, H, hd] or packed. Every combination either matches the
// CPU to the rule when cuDNN is forced, or is refused by name.
TEST(CudnnAttention, StridedLayoutsOfEachOperand) {
  QG_REQUIRE_CUDNN_ATTENTION();
  const int64_t B = 2, H = 4, T = 40, hd = 64;
  const DType d = DType::bf16;
  auto gpu = make_device_context(Device::cuda());
  uint32_t seed = 900;
  for (int64_t KV : {int64_t{2}, int64_t{4}})
    for (bool sliced : {false, true})
      for (bool permuted : {false, true}) {
        const std::string what = "kv " + std::to_string(KV) +
                                 (sliced ? " sliced qkv" : " packed qkv") +
                                 (permuted ? ", permuted o/do" : ", packed o/do");
        SCOPED_TRACE(what);
        const int64_t width = (H + 2 * KV) * hd;
        auto packed = [](const Tensor& t) {
          return Tensor::from_doubles(t.shape(), t.to_doubles(), t.dtype());
        };
        const Tensor qkv = random({B, T, H + 2 * KV, hd}, d, seed++);
        const Tensor dob = random({B, T, H, hd}, d, seed++);
        const Shape row{T * width, hd, width, 1}, perm{T * H * hd, hd, H * hd, 1};
        const int64_t offsets[] = {0, H * hd, (H + KV) * hd};
        const Tensor qkv_dev = qkv.to(Device::cuda());
        std::vector<Tensor> host, dev;
        for (int i = 0; i < 3; ++i) {
          const Shape s{B, i == 0 ? H : KV, T, hd};
          host.push_back(packed(qkv.as_strided(s, row, offsets[i])));
          dev.push_back(sliced ? qkv_dev.as_strided(s, row, offsets[i])
                               : host.back().to(Device::cuda()));
        }
        const auto fwd_cpu = run_op(Device::cpu(), "causal_attention", host);
        const Tensor ob = bthd_of(fwd_cpu[0]);
        const Tensor ob_dev = ob.to(Device::cuda()), dob_dev = dob.to(Device::cuda());
        const Tensor o_host = packed(ob.as_strided({B, H, T, hd}, perm));
        const Tensor do_host = packed(dob.as_strided({B, H, T, hd}, perm));
        const Tensor o =
            permuted ? ob_dev.as_strided({B, H, T, hd}, perm) : o_host.to(Device::cuda());
        const Tensor dout =
            permuted ? dob_dev.as_strided({B, H, T, hd}, perm) : do_host.to(Device::cuda());
        const std::vector<Tensor> ins = {dev[0], dev[1], dev[2], o, fwd_cpu[1].to(Device::cuda()),
                                         dout};
        const std::vector<Tensor> cpu_ins = {host[0], host[1],    host[2],
                                             o_host,  fwd_cpu[1], do_host};
        const auto bcpu = run_op(Device::cpu(), "causal_attention_backward", cpu_ins);
        std::vector<Tensor> bcud, bown;
        {
          ScopedEnv env("QG_ATTENTION_BACKEND", "cudnn");
          bcud = call_op(*gpu, "causal_attention_backward", ins);
        }
        {
          ScopedEnv env("QG_ATTENTION_BACKEND", "kernel");
          bown = call_op(*gpu, "causal_attention_backward", ins);
        }
        const char* names[] = {"dq", "dk", "dv"};
        for (int i = 0; i < 3; ++i) {
          const double tol = compare_rule("causal_attention_backward", i, d).tolerance;
          const Tensor ours = bcud[i].to(Device::cpu());
          const double e_cpu = relative_error(ours, bcpu[i]);
          const double e_own = relative_error(ours, bown[i].to(Device::cpu()));
          report(what, names[i], e_cpu, e_own);
          EXPECT_LE(e_cpu, tol) << names[i];
          EXPECT_LE(e_own, 2 * tol) << names[i];
        }
      }
}

}  // namespace
}  // namespace qg
