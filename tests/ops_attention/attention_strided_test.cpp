// causal_attention and its backward on strided views, called directly (runtime/op_call.h):
// q, k and v sliced out of one fused QKV projection buffer ([B, T, H + 2 KV, hd], the layout
// a fused projection writes), o and do as permuted views of [B, T, H, hd], lse as a permuted
// view of [B, T, H], k and v broadcast over the batch (stride 0). Each call must give the same
// bits as the same call on contiguous copies, on the CPU and on the GPU: the strides move the
// addresses, never the order of the sums. A head_dim axis of stride != 1, and on the GPU a
// row off a 16-byte boundary for the tensor-core kernels, are named errors.
#include <gtest/gtest.h>

#include <map>

#include "runtime/op_call.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/common/scoped_env.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::same_bits;

struct Case {
  int64_t n, heads, kv_heads, seq, head_dim;
};

std::string label(const Case& c, DType d) {
  return std::string(dtype_name(d)) + " [" + std::to_string(c.n) + "," + std::to_string(c.heads) +
         "," + std::to_string(c.seq) + "," + std::to_string(c.head_dim) + "] kv " +
         std::to_string(c.kv_heads);
}

// A contiguous copy of a view of a host tensor.
Tensor contiguous_copy(const Tensor& t) {
  return Tensor::from_doubles(t.shape(), t.to_doubles(), t.dtype());
}

Tensor random(const Shape& s, DType d, uint32_t seed) {
  return testing::random_f32(s, seed).cast(d);
}

// Views of host buffers, made again over the buffers' copies on `device` (a device tensor's
// view cannot be read back element by element, so the reference copies come from the host).
struct Views {
  explicit Views(Device d) : device(d) {}
  Device device;
  std::vector<Tensor> strided;  // the views, into buffers on `device`
  std::vector<Tensor> copies;   // the same values, contiguous, on the host

  Tensor on_device(const Tensor& host_buffer) {
    auto it = uploaded.find(host_buffer.raw_data());
    if (it == uploaded.end())
      it = uploaded.emplace(host_buffer.raw_data(), host_buffer.to(device)).first;
    return it->second;
  }
  void add(const Tensor& host_buffer, const Shape& shape, const Shape& strides,
           int64_t offset = 0) {
    const Tensor view = host_buffer.as_strided(shape, strides, offset);
    EXPECT_FALSE(view.is_contiguous()) << view.str();
    copies.push_back(contiguous_copy(view));
    strided.push_back(on_device(host_buffer).as_strided(shape, strides, offset));
  }

 private:
  std::map<const void*, Tensor> uploaded;  // one device buffer per host buffer: views share it
};

// q, k, v from one fused [B, T, H + 2 KV, hd] buffer; o and do permuted from [B, T, H, hd];
// lse permuted from [B, T, H]. With `broadcast_kv`, k and v are one [1, T, 2 KV, hd] buffer
// read with batch stride 0 instead.
Views make_views(const Case& c, DType d, Device device, uint32_t seed, bool broadcast_kv = false) {
  const int64_t B = c.n, H = c.heads, KV = c.kv_heads, T = c.seq, hd = c.head_dim;
  const int64_t width = (H + 2 * KV) * hd;  // one token's row of the fused buffer
  const Tensor qkv = random({B, T, H + 2 * KV, hd}, d, seed);
  const Tensor o = random({B, T, H, hd}, d, seed + 1), dout = random({B, T, H, hd}, d, seed + 2);
  // lse is f32 (f64 for f64); any finite values do here.
  const Tensor lse = random({B, T, H}, d == DType::f64 ? DType::f64 : DType::f32, seed + 3);
  Views v(device);
  v.add(qkv, {B, H, T, hd}, {T * width, hd, width, 1});
  if (broadcast_kv) {
    const Tensor kv = random({1, T, 2 * KV, hd}, d, seed + 4);
    v.add(kv, {B, KV, T, hd}, {0, hd, 2 * KV * hd, 1});
    v.add(kv, {B, KV, T, hd}, {0, hd, 2 * KV * hd, 1}, KV * hd);
  } else {
    v.add(qkv, {B, KV, T, hd}, {T * width, hd, width, 1}, H * hd);
    v.add(qkv, {B, KV, T, hd}, {T * width, hd, width, 1}, (H + KV) * hd);
  }
  v.add(o, {B, H, T, hd}, {T * H * hd, hd, H * hd, 1});
  v.add(lse, {B, H, T}, {T * H, 1, H});
  v.add(dout, {B, H, T, hd}, {T * H * hd, hd, H * hd, 1});
  return v;
}

std::vector<Tensor> on(Device device, const std::vector<Tensor>& host) {
  std::vector<Tensor> out;
  for (const Tensor& t : host) out.push_back(t.to(device));
  return out;
}

std::vector<Tensor> to_host(std::vector<Tensor> ts) {
  for (Tensor& t : ts) t = t.to(Device::cpu());
  return ts;
}

// Forward on (q, k, v) and backward on all six inputs, strided against contiguous copies.
void expect_views_match_copies(Device device, const Case& c, DType d, uint32_t seed,
                               bool broadcast_kv = false) {
  SCOPED_TRACE(label(c, d) + (broadcast_kv ? " kv broadcast" : ""));
  auto ctx = make_device_context(device);
  const Views v = make_views(c, d, device, seed, broadcast_kv);
  ASSERT_EQ(v.strided.size(), 6u);
  const std::vector<Tensor> copies = on(device, v.copies);
  const std::vector<Tensor> qkv(v.strided.begin(), v.strided.begin() + 3);
  const std::vector<Tensor> qkv_copies(copies.begin(), copies.begin() + 3);
  const auto fwd = to_host(call_op(*ctx, "causal_attention", qkv));
  const auto fwd_ref = to_host(call_op(*ctx, "causal_attention", qkv_copies));
  for (size_t i = 0; i < fwd.size(); ++i) {
    EXPECT_TRUE(fwd[i].is_contiguous());
    EXPECT_TRUE(same_bits(fwd[i], fwd_ref[i])) << "forward output " << i;
  }
  const auto bwd = to_host(call_op(*ctx, "causal_attention_backward", v.strided));
  const auto bwd_ref = to_host(call_op(*ctx, "causal_attention_backward", copies));
  for (size_t i = 0; i < bwd.size(); ++i)
    EXPECT_TRUE(same_bits(bwd[i], bwd_ref[i])) << "gradient " << i;
}

// Head dims 64 and 128 take the tiled CUDA kernels (tensor cores for bf16 and f16), 8 and 96
// the per-row ones; GQA, MQA and plain heads; T = 1 and T past several tiles.
const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {2, 4, 2, 37, 64}, {1, 2, 1, 70, 128}, {2, 2, 2, 1, 64}, {1, 4, 2, 9, 8}, {1, 2, 1, 33, 96}};
  return c;
}

TEST(CausalAttentionStrided, ViewsMatchContiguousCopiesOnCpu) {
  uint32_t seed = 100;
  for (const Case& c : cases())
    for (DType d : {DType::f32, DType::bf16, DType::f64}) {
      expect_views_match_copies(Device::cpu(), c, d, seed);
      seed += 8;
    }
  expect_views_match_copies(Device::cpu(), {2, 4, 2, 5, 16}, DType::f16, seed, true);
}

// The project's kernels: their strides move addresses, never the order of the sums. (cuDNN's
// path, which `auto` would take for some of these, is held to a tolerance instead:
// attention_cudnn_test.cpp.)
TEST(CausalAttentionStrided, ViewsMatchContiguousCopiesOnGpu) {
  QG_REQUIRE_GPU();
  testing::ScopedEnv kernels("QG_ATTENTION_BACKEND", "kernel");
  uint32_t seed = 200;
  for (const Case& c : cases())
    for (DType d : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
      expect_views_match_copies(Device::cuda(), c, d, seed);
      seed += 8;
    }
  for (DType d : {DType::f32, DType::bf16})
    expect_views_match_copies(Device::cuda(), {2, 4, 2, 40, 64}, d, seed, true);
}

// A head_dim axis that is not contiguous: every kernel reads a row as consecutive elements.
void expect_head_dim_stride_refused(Device device) {
  auto ctx = make_device_context(device);
  Tensor buf = random({1, 2, 4, 16}, DType::f32, 7).to(device);
  Tensor q = buf.as_strided({1, 2, 4, 8}, {128, 64, 16, 2});  // every other element
  Tensor k = random({1, 1, 4, 8}, DType::f32, 8).to(device);
  expect_error(
      [&] {
        call_op(*ctx, "causal_attention", {q, k, k});
      },
      {"causal_attention", "input 0 ('q')", "strides [128, 64, 16, 2]",
       "head_dim axis (the last) must have stride 1"});
  Tensor q_ok = random({1, 2, 4, 8}, DType::f32, 9).to(device);
  Tensor lse = Tensor::zeros({1, 2, 4}, DType::f32, device);
  expect_error(
      [&] {
        call_op(*ctx, "causal_attention_backward", {q_ok, k, k, q_ok, lse, q});
      },
      {"causal_attention_backward", "input 5 ('do')",
       "head_dim axis (the last) must have stride 1"});
}

TEST(CausalAttentionStrided, HeadDimStrideIsANamedErrorOnCpu) {
  expect_head_dim_stride_refused(Device::cpu());
}

TEST(CausalAttentionStrided, HeadDimStrideIsANamedErrorOnGpu) {
  QG_REQUIRE_GPU();
  expect_head_dim_stride_refused(Device::cuda());
}

// Rows 65 bf16 elements (130 bytes) apart: the tensor-core kernels' 16-byte loads cannot read
// them, so the call is refused by name; the f32 SIMT kernels read element by element and take
// the same layout.
TEST(CausalAttentionStrided, GpuTensorCoreKernelsRefuseMisalignedRows) {
  QG_REQUIRE_GPU();
  auto gpu = make_device_context(Device::cuda());
  for (DType d : {DType::bf16, DType::f16, DType::f32}) {
    SCOPED_TRACE(dtype_name(d));
    Tensor host = random({1, 2, 4, 65}, d, 11);
    Tensor q = host.to(Device::cuda()).as_strided({1, 2, 4, 64}, {520, 260, 65, 1});
    Tensor k = random({1, 1, 4, 64}, d, 12).to(Device::cuda());
    if (d == DType::f32) {
      Tensor q_copy = contiguous_copy(host.as_strided({1, 2, 4, 64}, {520, 260, 65, 1}));
      EXPECT_TRUE(
          same_bits(call_op(*gpu, "causal_attention", {q, k, k})[0].to(Device::cpu()),
                    call_op(*gpu, "causal_attention", {q_copy.to(Device::cuda()), k, k})[0].to(
                        Device::cpu())));
      continue;
    }
    expect_error(
        [&] {
          call_op(*gpu, "causal_attention", {q, k, k});
        },
        {"causal_attention", "input 0 ('q')", "strides [520, 260, 65, 1]",
         "rows on 16-byte boundaries", "multiple of 8 elements"});
    Tensor lse = Tensor::zeros({1, 2, 4}, DType::f32, Device::cuda());
    Tensor q_ok = random({1, 2, 4, 64}, d, 13).to(Device::cuda());
    expect_error(
        [&] {
          call_op(*gpu, "causal_attention_backward", {q_ok, k, k, q_ok, lse, q});
        },
        {"causal_attention_backward", "input 5 ('do')", "16-byte boundaries"});
  }
}

}  // namespace
}  // namespace qg
