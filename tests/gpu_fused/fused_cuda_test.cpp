// The single-kernel CUDA paths of fused observer + fake_quantize / quantize against the unfused CPU
// reference: outputs, masks, qparams and observer state bit for bit over several steps,
// with signed zeros, NaN and infinities in the data. Skips without a GPU.
#include <gtest/gtest.h>
#ifdef QG_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include <cmath>
#include <cstring>
#include <iostream>
#include <random>

#include "ops/fused/observe_quantize/middle_map_launches.h"
#include "runtime/backend.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"
#include "tests/common/tensor_compare.h"

namespace qg {
namespace {

using testing::first_difference;
using testing::NanRule;

struct Case {
  std::string observer;
  Shape shape;
  DType dtype;
  Attrs attrs;
  bool special_values;
  std::string quantizer = "fake_quantize";  // or "quantize" (s8/u8 codes)
  Attrs observer_only = {};                 // e.g. delayed
  double magnitude = 1.0;                   // scales the data (2.5e37: max - min overflows)
  // When > 0, runs of zero_run elements cycle through the signed-zero regimes of
  // zero_regime(), starting at zero_offset (the raw-bit statistics of the fast path).
  int64_t zero_run = 0;
  int zero_offset = 0;
  // For channels on a middle axis: the kernel the case must reach (checked on a GPU with
  // kCheckedMultiprocessors, the H100 and H200 the cases were sized for: the choice depends on
  // the resident grid).
  enum class Middle { unchecked, rows, channel_major, composed } middle = Middle::unchecked;
};

constexpr int kCheckedMultiprocessors = 132;

int multiprocessors() {
#ifdef QG_WITH_CUDA
  int dev = 0, count = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return 0;
  return count;
#else
  return 0;
#endif
}

// Regime r of a run: 0 all -0, 1 all +0, 2 alternating -0 / +0, 3 non-negative with -0
// (the min is -0), 4 non-positive with +0 (the max is +0).
double zero_regime(int r, int64_t i, double d) {
  switch (r % 5) {
    case 0:
      return -0.0;
    case 1:
      return 0.0;
    case 2:
      return i % 2 ? -0.0 : 0.0;
    case 3:
      return i % 7 == 3 ? -0.0 : std::fabs(d);
    default:
      return i % 7 == 3 ? 0.0 : -std::fabs(d);
  }
}

Tensor batch(const Case& c, int step) {
  std::mt19937 rng(11 + step);
  std::normal_distribution<double> d(0.0, 1.0 + step);
  std::vector<double> v(static_cast<size_t>(shape_numel(c.shape)));
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = d(rng) * c.magnitude;
    if (c.zero_run > 0)
      v[i] = zero_regime(static_cast<int>(static_cast<int64_t>(i) / c.zero_run) + c.zero_offset,
                         static_cast<int64_t>(i), v[i]);
  }
  if (c.special_values && v.size() > 8) {
    v[1] = -0.0;
    v[2] = 0.0;
    v[v.size() / 2] = NAN;
    v[v.size() - 3] = INFINITY;
    v[5] = -INFINITY;
  }
  return Tensor::from_doubles(c.shape, v, c.dtype);
}

class FusedCuda : public ::testing::TestWithParam<Case> {};

TEST_P(FusedCuda, MatchesUnfusedCpuBitForBit) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device present";
  const Case& c = GetParam();
  auto build = [&](Graph& g) {
    ValueId x = g.input("x", {c.dtype, c.shape});
    Attrs obs_attrs = c.attrs;
    for (const auto& [k, v] : c.observer_only.items()) obs_attrs.set(k, v);
    auto qp = g.apply(c.observer, {x}, obs_attrs);
    auto fq = g.apply(c.quantizer, {x, qp[0], qp[1]}, c.attrs);
    g.set_name(fq[0], "y");
    g.set_name(fq[1], "mask");
  };
  Graph ref, fused;
  build(ref);
  build(fused);
  ASSERT_EQ(optimize(fused, PassOptions{}).at(1).rewrites, 1);
  Executor cpu(ref), gpu(fused, Device::cuda());
  NodeId obs = ref.value(ref.node(ref.value(ref.at("y")).producer).inputs[1]).producer;
  NodeId f = fused.value(fused.at("y")).producer;
  const MiddleMapLaunches before = fused_middle_map_launches();
  for (int step = 0; step < 3; ++step) {
    if (step == 2) {  // eval: statistics frozen on both
      cpu.set_training(false);
      gpu.set_training(false);
    }
    Tensor x = batch(c, step);
    // qparams the quantizer rejects (a range wider than f32: an infinite scale) fail the
    // unfused CPU graph; the fused GPU node must fail too, not quantize with them.
    std::string cpu_error, gpu_error;
    std::vector<Tensor> a, b;
    try {
      a = cpu.run({{"x", x}}, {ref.at("y"), ref.at("mask")});
    } catch (const Error& e) {
      cpu_error = e.what();
    }
    try {
      b = gpu.run({{"x", x}}, {fused.at("y"), fused.at("mask")});
    } catch (const Error& e) {
      gpu_error = e.what();
    }
    if (!cpu_error.empty() || !gpu_error.empty()) {
      EXPECT_NE(cpu_error.find("scale"), std::string::npos) << "cpu: " << cpu_error;
      EXPECT_NE(gpu_error.find("scale"), std::string::npos) << "gpu: " << gpu_error;
      return;
    }
    EXPECT_EQ(first_difference(a[0], b[0]), "") << "y, step " << step;
    EXPECT_EQ(first_difference(a[1], b[1]), "") << "mask, step " << step;
    const auto& sa = cpu.states(obs);
    const auto& sb = gpu.states(f);
    for (size_t i = 0; i < sa.size(); ++i)
      EXPECT_EQ(first_difference(sa[i], sb[i]), "")
          << "state " << ref.node(obs).states[i].name << ", step " << step;
  }
  if (c.middle == Case::Middle::unchecked) return;
  if (multiprocessors() != kCheckedMultiprocessors) {
    std::cout << "[ note ] kernel choice not checked: " << multiprocessors()
              << " multiprocessors, the cases are sized for " << kCheckedMultiprocessors << "\n";
    return;
  }
  const MiddleMapLaunches after = fused_middle_map_launches();
  const int64_t rows = after.rows - before.rows, major = after.channels - before.channels;
  EXPECT_EQ(rows, c.middle == Case::Middle::rows ? 3 : 0) << "row-map launches";
  EXPECT_EQ(major, c.middle == Case::Middle::channel_major ? 3 : 0) << "channel-major launches";
}

Case reaches(Case c, Case::Middle m) {
  c.middle = m;
  return c;
}
using Middle = Case::Middle;

const Attrs kChannel0{{"scope", "channel"}, {"axis", 0}};
const Attrs kLastAxis{{"scope", "channel"}, {"axis", -1}};
const Attrs kAxis1{{"scope", "channel"}, {"axis", 1}};

INSTANTIATE_TEST_SUITE_P(
    Paths, FusedCuda,
    ::testing::Values(
        // per tensor: fits in registers, and larger than the cached part (streamed re-read)
        Case{"moving_average_observer", {64, 768}, DType::f32, {}, true},
        Case{"minmax_observer", {64, 768}, DType::f32, {}, true},
        Case{"moving_average_observer", {2048, 2048}, DType::f32, {}, false},
        Case{"minmax_observer", {4096, 4096}, DType::f32, {}, true},
        Case{"moving_average_observer", {256, 1024}, DType::bf16, {}, true},
        Case{"minmax_observer", {256, 1024}, DType::f16, {{"signed", true}}, true},
        // per channel, rows contiguous
        Case{"moving_average_observer", {96, 4096}, DType::f32, kChannel0, true},
        Case{"minmax_observer", {33, 64}, DType::f32, kChannel0, true},
        // Rows of 129..256 packs in numbers that take the warp-per-row kernel with 8 packs
        // per lane (at least 16 rows per multiprocessor on the test GPU).
        Case{"moving_average_observer", {2304, 768}, DType::f32, kChannel0, true},
        Case{"minmax_observer", {2200, 2048}, DType::bf16, kChannel0, true},
        Case{"moving_average_observer", {4096, 608}, DType::f32, {{"scope", "token"}}, true},
        Case{"minmax_observer", {2304, 768}, DType::f32, kChannel0, true, "quantize"},
        Case{"moving_average_observer", {64, 768}, DType::bf16, kChannel0, true},
        // f32 rows that need a second wave of full blocks but fit one of half blocks (a
        // 132-multiprocessor GPU: 660 full, 1056 half), the transformer's [768, 768] weights.
        Case{"moving_average_observer", {768, 768}, DType::f32, kChannel0, true},
        Case{"minmax_observer", {1000, 2048}, DType::f32, kChannel0, true, "quantize"},
        // fallbacks (composed kernels): odd sizes, non-leading axis, f64
        Case{"minmax_observer", {7, 13}, DType::f32, {}, true},
        Case{"moving_average_observer",
             {12, 40},
             DType::f32,
             {{"scope", "channel"}, {"axis", 1}},
             true},
        Case{"minmax_observer", {16, 64}, DType::f64, {}, true},
        // per token and per group: rows of a block, rows of a warp, and fallbacks
        Case{"moving_average_observer", {64, 768}, DType::f32, {{"scope", "token"}}, true},
        Case{"minmax_observer", {8, 3, 64}, DType::bf16, {{"scope", "token"}}, true},
        Case{"minmax_observer",
             {256, 1024},
             DType::f32,
             {{"scope", "group"}, {"axis", -1}, {"group_size", 128}, {"bits", 4}, {"signed", true}},
             true},
        Case{"moving_average_observer",
             {64, 256},
             DType::bf16,
             {{"scope", "group"}, {"axis", -1}, {"group_size", 64}},
             true},
        Case{"minmax_observer",
             {16, 100},
             DType::f32,
             {{"scope", "group"}, {"axis", -1}, {"group_size", 32}},
             true},
        Case{"minmax_observer",
             {64, 16},
             DType::f32,
             {{"scope", "group"}, {"axis", 0}, {"group_size", 32}},
             true},
        Case{"moving_average_observer",
             {64, 768},
             DType::f32,
             {{"scope", "group"}, {"axis", -1}, {"group_size", 128}},
             true,
             "quantize"},
        // delayed mode: one-pass per-tensor kernel (many blocks, last-block fold) and rows
        Case{"moving_average_observer",
             {4096, 4096},
             DType::f32,
             {},
             true,
             "fake_quantize",
             {{"delayed", true}}},
        Case{"minmax_observer",
             {64, 768},
             DType::bf16,
             {},
             true,
             "fake_quantize",
             {{"delayed", true}}},
        Case{"minmax_observer",
             {2048, 2048},
             DType::f32,
             {{"signed", true}},
             true,
             "quantize",
             {{"delayed", true}}},
        Case{"moving_average_observer",
             {96, 4096},
             DType::f32,
             kChannel0,
             true,
             "fake_quantize",
             {{"delayed", true}}},
        // observer + quantize: codes from the same single-kernel paths
        Case{"moving_average_observer", {64, 768}, DType::f32, {}, true, "quantize"},
        Case{"minmax_observer", {2048, 2048}, DType::f32, {{"signed", true}}, true, "quantize"},
        Case{"moving_average_observer", {256, 1024}, DType::bf16, {}, true, "quantize"},
        Case{"minmax_observer", {96, 4096}, DType::f32, kChannel0, true, "quantize"},
        Case{"moving_average_observer",
             {64, 768},
             DType::f16,
             {{"scope", "channel"}, {"axis", 0}, {"signed", true}},
             true,
             "quantize"},
        Case{"minmax_observer",
             {300, 64},
             DType::f32,
             {{"scope", "channel"}, {"axis", -1}},
             true,
             "quantize"},
        Case{"moving_average_observer",
             {300, 64},
             DType::bf16,
             {{"scope", "channel"}, {"axis", 1}},
             true},
        // channels on the last axis: the two-phase cooperative kernel. Larger than the
        // on-chip cache (streamed re-read); 192 and 25 packs per row (grids of 3 and 25
        // blocks' multiples); more channels than folding lanes (the fold loops); delayed.
        Case{"minmax_observer", {4096, 4096}, DType::f32, kLastAxis, true},
        Case{"moving_average_observer", {2048, 768}, DType::f32, kLastAxis, true},
        Case{"minmax_observer", {256, 100}, DType::f32, kLastAxis, true, "quantize"},
        Case{"minmax_observer", {2, 32768}, DType::f32, kLastAxis, true},
        Case{"moving_average_observer",
             {8, 4, 1536},
             DType::f16,
             {{"scope", "channel"}, {"axis", 2}, {"signed", true}},
             true,
             "quantize"},
        Case{"minmax_observer", {64, 4096}, DType::bf16, kLastAxis, true},
        Case{"moving_average_observer",
             {512, 1024},
             DType::f32,
             kLastAxis,
             true,
             "fake_quantize",
             {{"delayed", true}}},
        // channels on a middle axis of [outer, C, inner]: the two-phase kernel with one
        // channel per thread. On chip, larger than the on-chip cache (streamed re-read), more
        // channels than folding lane groups, one pack per channel run, quantize codes,
        // bf16/f16 (the channel-major map: more threads than whole rows), delayed; then the
        // fallback of an inner run that is not whole packs (7 x 7), and an outer row longer
        // than the resident grid (the channel-major map). More in MiddleAxis below.
        reaches(Case{"minmax_observer", {4, 32, 16, 16}, DType::f32, kAxis1, true}, Middle::rows),
        reaches(Case{"moving_average_observer", {64, 64, 56, 56}, DType::f32, kAxis1, true},
                Middle::rows),
        Case{"minmax_observer", {8, 4096, 4}, DType::f32, kAxis1, true},
        Case{"moving_average_observer", {8, 2048, 8}, DType::bf16, kAxis1, true, "quantize"},
        reaches(Case{"minmax_observer",
                     {16, 64, 32, 32},
                     DType::f16,
                     {{"scope", "channel"}, {"axis", 1}, {"signed", true}},
                     true,
                     "quantize"},
                Middle::channel_major),
        Case{"moving_average_observer",
             {16, 64, 28, 28},
             DType::f32,
             kAxis1,
             true,
             "fake_quantize",
             {{"delayed", true}}},
        reaches(Case{"minmax_observer", {8, 16, 7, 7}, DType::f32, kAxis1, true}, Middle::composed),
        reaches(Case{"moving_average_observer", {2, 512, 64, 64}, DType::f32, kAxis1, true},
                Middle::channel_major)));

const Attrs kNone{};
const Attrs kDelayed{{"delayed", true}};

Case zeros(Case c, int64_t run, int offset) {
  c.zero_run = run;
  c.zero_offset = offset;
  return c;
}

Case huge(Case c) {
  c.magnitude = 2.5e37;
  return c;
}

// The fast paths (raw-bit statistics, quantization without NaN selects) for 16-bit types:
// clean data (every thread fast), NaN / infinities (threads on the exact path beside fast
// ones), signed-zero extremes, all-zero tensors, rows and channels, a range whose width
// overflows f32 (an infinite scale: the unfused quantizer rejects it, so the fused node must), and
// tails of the delayed kernel.
INSTANTIATE_TEST_SUITE_P(
    FastPaths, FusedCuda,
    ::testing::Values(
        // per tensor: registers only, and streamed re-read
        Case{"minmax_observer", {256, 1024}, DType::bf16, kNone, false},
        Case{"moving_average_observer", {256, 1024}, DType::f16, kNone, false, "quantize"},
        Case{"minmax_observer", {4096, 4096}, DType::bf16, kNone, false},
        Case{"moving_average_observer", {4096, 4096}, DType::f16, kNone, true},
        Case{"minmax_observer", {2048, 2048}, DType::bf16, {{"signed", true}}, true, "quantize"},
        zeros(Case{"minmax_observer", {64, 768}, DType::bf16, kNone, false}, 64 * 768, 0),
        zeros(Case{"minmax_observer", {64, 768}, DType::f16, kNone, false}, 64 * 768, 1),
        zeros(Case{"minmax_observer", {64, 768}, DType::bf16, kNone, false}, 64 * 768, 2),
        zeros(Case{"moving_average_observer", {64, 768}, DType::bf16, kNone, false}, 64 * 768, 3),
        zeros(Case{"minmax_observer", {64, 768}, DType::f16, kNone, false}, 64 * 768, 4),
        zeros(Case{"minmax_observer", {64, 768}, DType::f32, kNone, false}, 64 * 768, 3),
        zeros(Case{"minmax_observer", {64, 768}, DType::f32, kNone, false}, 64 * 768, 4),
        huge(Case{"minmax_observer", {256, 1024}, DType::bf16, kNone, false}),
        huge(Case{"minmax_observer", {256, 1024}, DType::f32, kNone, false}),
        // delayed: a tail group (320 packs: a block of 64), clean and special, zeros
        Case{"minmax_observer", {40, 64}, DType::bf16, kNone, false, "fake_quantize", kDelayed},
        Case{"moving_average_observer", {40, 64}, DType::f16, kNone, true, "quantize", kDelayed},
        Case{"minmax_observer", {2048, 2048}, DType::bf16, kNone, true, "fake_quantize", kDelayed},
        Case{"minmax_observer", {2048, 2048}, DType::f16, kNone, false, "fake_quantize", kDelayed},
        zeros(
            Case{
                "minmax_observer", {64, 768}, DType::bf16, kNone, false, "fake_quantize", kDelayed},
            64 * 768, 3),
        huge(Case{"moving_average_observer",
                  {256, 1024},
                  DType::bf16,
                  kNone,
                  false,
                  "fake_quantize",
                  kDelayed}),
        // rows: per channel (block rows), token and group (warp rows)
        Case{"minmax_observer", {96, 4096}, DType::bf16, kChannel0, false},
        Case{"moving_average_observer", {96, 4096}, DType::f16, kChannel0, true},
        zeros(Case{"minmax_observer", {96, 4096}, DType::bf16, kChannel0, false}, 4096, 0),
        zeros(Case{"minmax_observer", {64, 768}, DType::f16, kChannel0, false, "quantize"}, 768, 0),
        zeros(Case{"moving_average_observer", {64, 768}, DType::f32, kChannel0, false}, 768, 0),
        zeros(Case{"minmax_observer", {8, 3, 64}, DType::bf16, {{"scope", "token"}}, false}, 192,
              0),
        zeros(Case{"minmax_observer",
                   {64, 256},
                   DType::f16,
                   {{"scope", "group"}, {"axis", -1}, {"group_size", 64}},
                   false},
              64, 0),
        huge(Case{"minmax_observer", {96, 4096}, DType::bf16, kChannel0, false}),
        // channels on a middle axis (NCHW axis 1) and on the last axis
        Case{"minmax_observer", {16, 64, 32, 32}, DType::bf16, kAxis1, false},
        Case{"moving_average_observer", {32, 64, 32, 32}, DType::f16, kAxis1, true},
        zeros(Case{"minmax_observer", {4, 20, 16, 16}, DType::bf16, kAxis1, false}, 256, 0),
        zeros(Case{"minmax_observer", {4, 20, 16, 16}, DType::f32, kAxis1, false}, 256, 0),
        zeros(Case{"minmax_observer", {4, 20, 16, 16}, DType::f16, kAxis1, false, "quantize"}, 256,
              0),
        Case{"minmax_observer", {256, 1024}, DType::bf16, kLastAxis, false},
        Case{"moving_average_observer", {256, 1024}, DType::f16, kLastAxis, false, "quantize"}));

const Attrs kAxis1Signed{{"scope", "channel"}, {"axis", 1}, {"signed", true}};

// Channels on a middle axis with the channel-major map
// (ops/fused/observe_quantize/cuda_cooperative_middle_axis.cuh: T_c threads per channel, T_c the
// resident threads per channel rounded down to a multiple of 32), taken where it runs more threads
// than whole outer rows; the shapes are sized for the 396 resident blocks (101376 threads) of a
// 132-multiprocessor GPU. NaN and infinities put threads on the exact path (settle() re-reads the
// thread's packs in the same order); zero runs of one regime per channel (C % 5 == 0) give
// signed-zero extremes.
INSTANTIATE_TEST_SUITE_P(
    MiddleAxis, FusedCuda,
    ::testing::Values(
        // whole rows would use 256 (f32) or 384 (bf16) of the 396 blocks; larger than the
        // on-chip cache: register, shared-memory and streamed packs
        reaches(Case{"minmax_observer", {128, 64, 64, 64}, DType::f32, kAxis1, true},
                Middle::channel_major),
        reaches(Case{"moving_average_observer", {128, 64, 64, 64}, DType::bf16, kAxis1, true},
                Middle::channel_major),
        // C = 24: T_c = 4224 (132 * 32), one or two packs per thread
        reaches(Case{"minmax_observer", {32, 24, 32, 32}, DType::f32, kAxis1, true},
                Middle::channel_major),
        // runs of 96 packs (a divisor that is not a power of two) and of 64, codes
        reaches(
            Case{"moving_average_observer", {4, 384, 16, 24}, DType::f32, kAxis1, true, "quantize"},
            Middle::channel_major),
        reaches(
            Case{"minmax_observer", {32, 96, 16, 32}, DType::f16, kAxis1Signed, true, "quantize"},
            Middle::channel_major),
        // shared-memory packs (4 per thread)
        reaches(Case{"moving_average_observer", {32, 96, 32, 32}, DType::f32, kAxis1, true},
                Middle::channel_major),
        // an outer row longer than the resident grid: 1000 channels of 96 threads
        reaches(Case{"minmax_observer", {2, 1000, 16, 32}, DType::f32, kAxis1, true},
                Middle::channel_major),
        // 5 channels of 20256 threads: the last 96 threads of the grid have no packs
        reaches(Case{"minmax_observer", {80, 5, 1024}, DType::f32, kAxis1, true},
                Middle::channel_major),
        reaches(Case{"moving_average_observer",
                     {32, 64, 32, 32},
                     DType::f32,
                     kAxis1,
                     true,
                     "fake_quantize",
                     kDelayed},
                Middle::channel_major),
        // clean data (every thread on the fast paths) and signed-zero extremes
        reaches(Case{"minmax_observer", {16, 160, 32, 32}, DType::bf16, kAxis1, false},
                Middle::channel_major),
        reaches(zeros(Case{"minmax_observer", {16, 160, 32, 32}, DType::bf16, kAxis1, false}, 1024,
                      0),
                Middle::channel_major),
        reaches(zeros(Case{"moving_average_observer",
                           {4, 160, 32, 32},
                           DType::f32,
                           kAxis1,
                           false,
                           "quantize"},
                      1024, 2),
                Middle::channel_major),
        reaches(zeros(Case{"minmax_observer", {16, 160, 32, 32}, DType::f16, kAxis1, false}, 1024,
                      3),
                Middle::channel_major),
        // the boundaries: C * 32 = the resident threads (T_c = 32, no whole row fits) takes the
        // map, one channel more falls back to the composed kernels; equal threads take whole
        // rows; runs that are not a multiple of 32 packs take whole rows (98 packs) or, when
        // a row exceeds the grid, the composed kernels (16 packs)
        reaches(Case{"minmax_observer", {2, 3168, 256}, DType::f32, kAxis1, true},
                Middle::channel_major),
        reaches(Case{"minmax_observer", {2, 3169, 256}, DType::f32, kAxis1, true},
                Middle::composed),
        reaches(Case{"minmax_observer", {8, 48, 32, 32}, DType::f32, kAxis1, true}, Middle::rows),
        reaches(Case{"minmax_observer", {16, 64, 28, 28}, DType::bf16, kAxis1, true}, Middle::rows),
        reaches(Case{"minmax_observer", {2, 8192, 64}, DType::f32, kAxis1, true},
                Middle::composed)));

}  // namespace
}  // namespace qg
