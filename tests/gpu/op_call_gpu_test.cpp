// Kernels called directly on the GPU (runtime/op_call.h): every op with gradient-check
// samples and a CUDA kernel for them gives, called directly on a stream the caller owns,
// what its CPU kernel gives (under the crosscheck's comparison rules); strided kernels read
// views; and a tensor on the wrong device is a named error.
#include <gtest/gtest.h>

#include <random>

#include "core/op_registry.h"
#include "runtime/crosscheck.h"
#include "runtime/op_call.h"
#include "tests/common/draw_input.h"
#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::draw_input;
using testing::expect_error;

TEST(GpuOpCall, EveryOpDirectlyOnACallerStreamMatchesTheCpu) {
  QG_REQUIRE_GPU();
  // A stream the caller owns: here another context's, borrowed as a torch op borrows torch's.
  auto owner = make_device_context(Device::cuda());
  {
    ContextOptions options;
    options.stream = owner->stream();
    auto gpu = make_device_context(Device::cuda(), options);
    auto cpu = make_device_context(Device::cpu());
    std::mt19937_64 rng(11);
    int compared = 0;
    for (const OpDef* def : OpRegistry::instance().all()) {
      const OpDef& op = *def;
      if (op.is_source || !op.gradcheck_samples || op.side_effects) continue;
      for (const GradcheckSample& s : op.gradcheck_samples()) {
        std::vector<Tensor> inputs, on_gpu;
        std::vector<DType> key;
        for (const GradcheckInput& spec : s.inputs) {
          inputs.push_back(draw_input(spec, rng));
          on_gpu.push_back(inputs.back().to(Device::cuda()));
          key.push_back(spec.dtype);
        }
        if (op.find_kernel(DeviceType::cuda, key) == nullptr) continue;
        SCOPED_TRACE(op.name + " / " + s.label);
        std::vector<TensorType> types;
        for (const Tensor& t : inputs) types.push_back({t.dtype(), t.shape()});
        PreparedOp prepared(op.name, s.attrs, types, DeviceType::cuda);
        std::vector<Tensor> gpu_states = prepared.initial_states(Device::cuda());
        std::vector<Tensor> cpu_states = prepared.initial_states(Device::cpu());
        std::vector<Tensor> want =
            PreparedOp(op.name, s.attrs, types, DeviceType::cpu).run(*cpu, inputs, cpu_states);
        std::vector<Tensor> got = prepared.run(*gpu, on_gpu, gpu_states);
        gpu->check_errors(nullptr);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          CrosscheckMismatch m;
          double max_error = 0;
          CompareRule rule = compare_rule(op.name, static_cast<int>(i), want[i].dtype());
          EXPECT_TRUE(compare_tensors(want[i], got[i].to(Device::cpu()), rule, m, max_error))
              << "output " << i << ": " << m.str();
        }
        for (size_t i = 0; i < gpu_states.size(); ++i) {
          CrosscheckMismatch m;
          double max_error = 0;
          EXPECT_TRUE(compare_tensors(cpu_states[i], gpu_states[i].to(Device::cpu()), CompareRule{},
                                      m, max_error))
              << "state " << i << ": " << m.str();
        }
        ++compared;
      }
    }
    EXPECT_GT(compared, 50);
  }
}

TEST(GpuOpCall, StridedCastAndRefusedViews) {
  QG_REQUIRE_GPU();
  auto gpu = make_device_context(Device::cuda());
  Tensor x = Tensor::from_doubles({2, 3}, {1, 2, 3, 4, 5, 6}).to(Device::cuda());
  Tensor transposed = x.as_strided({3, 2}, {1, 3});
  std::vector<Tensor> y = call_op(*gpu, "cast", {transposed}, {{"dtype", "f16"}});
  EXPECT_EQ(y[0].to(Device::cpu()).to_doubles(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
  expect_error([&] { call_op(*gpu, "relu", {transposed}); }, {"relu", "strided"});
  Tensor host = Tensor::from_doubles({3}, {1, 2, 3});
  expect_error([&] { call_op(*gpu, "relu", {host}); }, {"relu", "is on cpu", "runs on cuda"});
}

}  // namespace
}  // namespace qg
