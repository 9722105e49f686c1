// The byte accounting behind the CPU bench's copy references (bench/harness): kernel_bytes
// counts each kernel's inputs and outputs once and nothing for graph inputs, constants and
// views; measure() fills the thread-pool copy columns on the CPU.
#include <gtest/gtest.h>

#include "bench/harness/device_timer.h"
#include "bench/harness/perf_cases.h"
#include "core/thread_pool.h"
#include "runtime/memory_plan.h"

namespace qg {
namespace {

bench::PerfCase find_case(const std::string& label) {
  for (const auto& c : bench::perf_cases(DeviceType::cpu, false, {64, 128}))
    if (c.label() == label) return c;
  ADD_FAILURE() << "no case " << label;
  return {};
}

TEST(PerfCaseBytes, FakeQuantForwardBackwardCountsEveryKernelOperandOnce) {
  const int64_t n = 64 * 128;
  // fake_quantize reads x, scale, zero point (one f32 and one i32) and writes y and a bit
  // mask; ste_backward reads dy and the mask and writes dx.
  const int64_t mask = n / 8;
  struct Expected {
    const char* label;
    int64_t bytes;
  } cases[] = {
      {"fq fwd+bwd per-tensor f32[64, 128]", (4 * n + 8 + 4 * n + mask) + (4 * n + mask + 4 * n)},
      {"fq fwd+bwd per-tensor bf16[64, 128]", (2 * n + 8 + 2 * n + mask) + (2 * n + mask + 2 * n)},
      {"fq fwd per-tensor f32[64, 128]", 4 * n + 8 + 4 * n + mask}};
  for (const Expected& e : cases) {
    bench::CaseRunner runner(find_case(e.label), Device::cpu(), true);
    EXPECT_EQ(runner.moved_bytes(), e.bytes) << e.label;
  }
}

TEST(PerfCaseBytes, ViewsAndSourcesMoveNothing) {
  // x -> reshape (a view) -> relu: only relu's read and write count; a constant feeding add
  // is counted as add's input, not as a kernel of its own.
  Graph g;
  ValueId x = g.input("x", {DType::f32, {256}});
  ValueId r = g.apply1("reshape", {x}, {{"shape", Shape{16, 16}}});
  ValueId y = g.apply1("relu", {r});
  ValueId c = g.constant(Tensor::from_doubles({16, 16}, std::vector<double>(256, 1.0)));
  ValueId z = g.apply1("add", {y, c});
  EXPECT_EQ(bench::kernel_bytes(g, needed_order(g, {y})), 2 * 1024);
  EXPECT_EQ(bench::kernel_bytes(g, needed_order(g, {z})), 2 * 1024 + 3 * 1024);
}

TEST(PerfCaseBytes, CpuMeasurementHasThreadPoolCopies) {
  set_num_threads(2);
  set_min_parallel_work(0);  // the copies' chunks on the pool even at this size
  auto rows = bench::measure(find_case("fq fwd+bwd per-tensor f32[64, 128]"), Device::cpu(), 2);
  set_min_parallel_work(kDefaultMinParallelWork);
  set_num_threads(default_num_threads());
  ASSERT_EQ(rows.size(), 1u);
  bench::CaseRunner runner(find_case("fq fwd+bwd per-tensor f32[64, 128]"), Device::cpu(), true);
  EXPECT_EQ(rows[0].moved_bytes, runner.moved_bytes());
  EXPECT_GT(rows[0].pool_copy_us, 0);
  EXPECT_GT(rows[0].pool_copy_moved_us, 0);
  EXPECT_GT(rows[0].gbps(), 0);
}

TEST(PerfCaseBytes, PoolCopyTakesSizesThatAreNotWholeChunks) {
  // 3 chunks of f32 elements and a tail of 3 bytes.
  EXPECT_GT(bench::pool_copy_us(3 * kElementGrain * 4 + 3, 4, 2), 0);
}

}  // namespace
}  // namespace qg
