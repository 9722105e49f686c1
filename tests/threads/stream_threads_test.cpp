// Streaming (non-temporal) stores change how the large outputs of the CPU fake-quantize
// kernels are written, never their bytes: with streaming on, fake_quantize, ste_backward, the
// fused observer + fake-quant and LSQ give, with 1, 2, 3 and 8 threads, the bytes of one
// thread with streaming off; above the default threshold as well as with every output
// streamed. The loops themselves stream or fall back on unaligned outputs with the same
// result. Shapes are not multiples of 8 or of the chunk; rows of the per-channel case start
// at every alignment, so heads, streamed bodies and tails all run.
#include <cstring>

#include "ops/common/quant_scope.h"
#include "ops/common/stream_store.h"
#include "ops/fake_quantize/fake_quantize_simd.h"
#include "tests/threads/thread_test_util.h"

namespace qg {
namespace {

using threads_test::Case;
using threads_test::data;
using threads_test::run_case;
using threads_test::same_bytes;

// Sets the streaming threshold (bytes) and restores it.
class StreamMinBytes {
 public:
  explicit StreamMinBytes(int64_t bytes) : old_(simd::stream_min_bytes()) {
    simd::set_stream_min_bytes(bytes);
  }
  ~StreamMinBytes() { simd::set_stream_min_bytes(old_); }

 private:
  int64_t old_;
};

constexpr int64_t kNever = int64_t{1} << 62;

// Every tensor of the case, streamed with 1, 2, 3 and 8 threads, equals the unstreamed
// single-thread run.
void expect_streaming_changes_nothing(const Case& c, int64_t min_bytes) {
  SCOPED_TRACE(c.label);
  std::vector<Tensor> reference;
  {
    StreamMinBytes off(kNever);
    reference = run_case(c, 1);
  }
  StreamMinBytes on(min_bytes);
  for (int threads : {1, 2, 3, 8}) {
    const std::vector<Tensor> got = run_case(c, threads);
    ASSERT_EQ(got.size(), reference.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(same_bytes(reference[i], got[i]))
          << c.label << ": tensor " << i << " differs, streamed with " << threads << " threads";
  }
}

Case observer_fake_quantize_ste(const std::string& label, const Shape& shape, const Attrs& attrs,
                                DType dtype, bool fuse) {
  Case c;
  c.label = label + (fuse ? " fused " : " ") + dtype_name(dtype);
  c.fuse = fuse;
  c.feeds = {{"x", data(shape, dtype, 11, 3.0)}, {"dy", data(shape, dtype, 12)}};
  c.build = [shape, attrs, dtype](Graph& g) {
    ValueId x = g.input("x", {dtype, shape});
    ValueId dy = g.input("dy", {dtype, shape});
    auto qp = g.apply("moving_average_observer", {x}, attrs);
    auto fq = g.apply("fake_quantize", {x, qp[0], qp[1]}, attrs);
    g.apply("ste_backward", {dy, fq[1]});
  };
  return c;
}

// Every output streamed (threshold 0), every dtype the loops stream, unfused and fused.
TEST(StreamThreads, EveryOutputStreamed) {
  const struct {
    std::string label;
    Shape shape;
    Attrs attrs;
  } scopes[] = {
      {"tensor", {263, 1031}, {}},
      {"channel_last", {1031, 67}, {{"scope", "channel"}, {"axis", -1}}},
      {"token", {129, 2053}, {{"scope", "token"}}},
  };
  for (const auto& s : scopes)
    for (DType dtype : {DType::f32, DType::bf16, DType::f16})
      for (bool fuse : {false, true})
        expect_streaming_changes_nothing(
            observer_fake_quantize_ste(s.label, s.shape, s.attrs, dtype, fuse), 0);
}

// Above the default threshold: a [2053, 2053] f32 tensor is 16.1 MiB.
TEST(StreamThreads, AboveDefaultThreshold) {
  const Shape shape{2053, 2053};
  ASSERT_GE(shape_numel(shape) * 4, simd::kDefaultStreamMinBytes);
  // Unfused, one step: the fused kernel and the other dtypes stream the same loops above.
  Case c = observer_fake_quantize_ste("tensor", shape, {}, DType::f32, false);
  c.steps = 1;
  expect_streaming_changes_nothing(c, simd::kDefaultStreamMinBytes);
}

TEST(StreamThreads, LsqForward) {
  const Shape shape{517, 1031};
  Attrs attrs{{"scope", "channel"}, {"axis", -1}};
  const ScopeLayout l = scope_layout("lsq_fake_quantize", attrs, shape);
  std::vector<double> scale(l.num_qparams), zp(l.num_qparams);
  for (int64_t q = 0; q < l.num_qparams; ++q) {
    scale[q] = 0.01 + 0.001 * static_cast<double>(q % 13);
    zp[q] = static_cast<double>(q % 7) * 3.4;
  }
  Case c;
  c.label = "lsq channel_last f32";
  c.feeds = {{"x", data(shape, DType::f32, 13)},
             {"scale", Tensor::from_doubles(l.qparam_shape, scale, DType::f32)},
             {"zp", Tensor::from_doubles(l.qparam_shape, zp, DType::f32)}};
  c.build = [shape, l, attrs](Graph& g) {
    ValueId x = g.input("x", {DType::f32, shape});
    ValueId sc = g.input("scale", {DType::f32, l.qparam_shape});
    ValueId z = g.input("zp", {DType::f32, l.qparam_shape});
    g.apply("lsq_fake_quantize", {x, sc, z}, attrs);
  };
  expect_streaming_changes_nothing(c, 0);
}

// The loops on outputs at every offset from a 64-byte boundary (in elements: 16-byte aligned
// ones stream, the others fall back), on the pool in chunks as the kernels run them; the
// bytes must equal the unstreamed loop's, and bytes around the output must stay untouched.
template <typename T>
void expect_loops_stream_anywhere(DType dtype) {
  SCOPED_TRACE(dtype_name(dtype));
  const int64_t n = 3 * kElementGrain + 1001;
  const Tensor xt = data({n}, dtype, 14, 3.0);
  const Tensor dyt = data({n}, dtype, 15);
  const T* x = xt.data<T>();
  const T* dy = dyt.data<T>();
  const fq_simd::RunQParams rp{8.0f, 0.125f, 3.0f, -128.0f, 127.0f};
  std::vector<float> inv(n), scale(n), zp(n);
  for (int64_t i = 0; i < n; ++i) {
    scale[i] = 0.05f + 0.01f * static_cast<float>(i % 7);
    inv[i] = 1.0f / scale[i];
    zp[i] = static_cast<float>(i % 5);
  }
  const fq_simd::LaneQParams lp{inv.data(), scale.data(), zp.data(), -8.0f, 7.0f};
  constexpr int64_t kPad = 64 / sizeof(T);
  const T sentinel = static_cast<T>(-7.0f);
  // Kernel 0: fake_quant_run, 1: fake_quant_lanes (both write y and mask), 2: ste_backward
  // (writes y from dy and `mask`). y starts `offset` elements past a 64-byte boundary, with
  // sentinels on both sides.
  auto run = [&](int kernel, int64_t offset, bool stream, std::vector<T>& buf,
                 std::vector<uint8_t>& mask) {
    buf.assign(static_cast<size_t>(n + 2 * kPad), sentinel);
    if (kernel != 2) mask.assign(static_cast<size_t>(n / 8 + 1), 0);
    T* y = buf.data() + kPad + offset;
    threads_test::ThreadCount tc(3);
    parallel_for(n, kElementGrain, [&](int64_t b, int64_t e) {
      if (kernel == 0) {
        fq_simd::fake_quant_run(x + b, y + b, mask.data(), b, e - b, rp, stream);
      } else if (kernel == 1) {
        const fq_simd::LaneQParams at_b{lp.inv_scale + b, lp.scale + b, lp.zero_point + b, lp.qmin,
                                        lp.qmax};
        fq_simd::fake_quant_lanes(x + b, y + b, mask.data(), b, e - b, at_b, stream);
      } else {
        fq_simd::ste_backward(dy + b, mask.data() + b / 8, y + b, e - b, stream);
      }
      if (stream) simd::stream_fence();
    });
  };
  std::vector<T> want, got;
  std::vector<uint8_t> fq_mask;
  run(0, 0, false, want, fq_mask);  // the mask ste_backward reads
  for (int kernel = 0; kernel < 3; ++kernel)
    for (int64_t offset = 0; offset < kPad; ++offset) {
      SCOPED_TRACE("kernel " + std::to_string(kernel) + ", offset " + std::to_string(offset));
      std::vector<uint8_t> want_mask = fq_mask, got_mask = fq_mask;
      run(kernel, 0, false, want, want_mask);
      run(kernel, offset, true, got, got_mask);
      ASSERT_EQ(std::memcmp(want.data() + kPad, got.data() + kPad + offset, n * sizeof(T)), 0);
      ASSERT_EQ(want_mask, got_mask);
      for (int64_t i = 0; i < kPad + offset; ++i)
        ASSERT_EQ(std::memcmp(&got[i], &sentinel, sizeof(T)), 0) << "element " << i << " before";
      for (int64_t i = kPad + offset + n; i < n + 2 * kPad; ++i)
        ASSERT_EQ(std::memcmp(&got[i], &sentinel, sizeof(T)), 0) << "element " << i << " after";
    }
}

TEST(StreamThreads, LoopsOnUnalignedOutputs) {
  expect_loops_stream_anywhere<float>(DType::f32);
  expect_loops_stream_anywhere<bf16>(DType::bf16);
  expect_loops_stream_anywhere<f16>(DType::f16);
}

TEST(StreamThreads, BadThreshold) {
  EXPECT_THROW(simd::set_stream_min_bytes(-1), Error);
}

}  // namespace
}  // namespace qg
