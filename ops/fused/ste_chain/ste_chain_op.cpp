// fused_ste_chain(dy, mask_first, mask_second) -> dx: two ste_backward nodes in a row, the
// second reading the first's output as its dy and nothing else reading it, made into one node
// by the fuse_ste_chain pass (ste_chain_fusion.cpp). A value fake-quantized twice (a residual sum
// quantized, then the block output quantizer on top of it) or two quantizers on one path
// give this backward: dy masked by one quantizer's bits, then by the other's. The masks come
// from different fake-quantize nodes (each from its own x and qparams); each is a plain bit
// per element here.
//
// Element i of the unfused pair is second_i ? (first_i ? dy_i : +0) : +0, which is dy_i where
// both bits are set and +0 otherwise (either clear bit gives +0, and masking +0 again gives
// +0). So the fused node is ste_backward with the two masks ANDed byte by byte: the same
// select of dy's bits or +0, with no float arithmetic, and bit-identical to the pair.
#include "ops/fused/ste_chain/ste_chain.h"

#include <algorithm>

#include "core/error.h"
#include "core/graph.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "ops/common/bitmask.h"
#include "ops/fake_quantize/fake_quantize_simd.h"
#include "ops/fused/ste_chain/ste_chain_fusion.h"

namespace qg {

void check_fused_ste_chain_inputs(const KernelContext& ctx) {
  const Tensor& dy = ctx.inputs.at(0);
  const int64_t bytes = bitmask_bytes(dy.numel());
  for (int k : {1, 2}) {
    const Tensor& m = ctx.inputs.at(k);
    QG_CHECK(m.dtype() == DType::u8 && m.numel() == bytes && m.is_contiguous(), ctx.op,
             k == 1 ? "mask_first " : "mask_second ", m.str(),
             " must be a contiguous u8 bit mask of ", bytes, " bytes for dy ", dy.str());
  }
  QG_CHECK(dy.is_contiguous(), ctx.op, "dy must be contiguous, got ", dy.str());
}

namespace {

// Elements per ANDed mask block on the stack (a multiple of 8, so blocks start on whole
// mask bytes; chunks of kElementGrain do too).
constexpr int64_t kBlock = 4096;

void fused_ste_chain_cpu(KernelContext& ctx) {
  check_fused_ste_chain_inputs(ctx);
  dispatch_float(ctx.inputs[0].dtype(), "fused_ste_chain", [&](auto tag) {
    using T = decltype(tag);
    const T* dy = ctx.inputs[0].data<T>();
    const uint8_t* first = ctx.inputs[1].data<uint8_t>();
    const uint8_t* second = ctx.inputs[2].data<uint8_t>();
    T* dx = ctx.outputs[0].data<T>();
    parallel_for(ctx.outputs[0].numel(), kElementGrain, [&](int64_t b, int64_t e) {
      uint8_t both[kBlock / 8];
      for (int64_t s = b; s < e; s += kBlock) {
        const int64_t len = std::min(kBlock, e - s);
        for (int64_t k = 0; k < bitmask_bytes(len); ++k)
          both[k] = first[s / 8 + k] & second[s / 8 + k];
        fq_simd::ste_backward(dy + s, both, dx + s, len);
      }
    });
  });
}

}  // namespace

void define_fused_ste_chain_op(OpRegistry& r) {
  OpDef& op = r.define("fused_ste_chain");
  op.doc =
      "Two ste_backward nodes in a row, fused by the fuse_ste_chain pass: dx = dy where both "
      "masks' bits are set, else +0.";
  op.inputs = {"dy", "mask_first", "mask_second"};
  op.outputs = {"dx"};
  op.infer = [](const InferContext& ctx) -> std::vector<TensorType> {
    QG_FAIL(ctx.op, "fused nodes are created by the fuse_ste_chain pass, not by apply()");
  };
  op.is_source = false;
  op.kernels.push_back(
      {DeviceType::cpu, {DType::f32, DType::f64, DType::f16, DType::bf16}, fused_ste_chain_cpu});
  op.fusion_rules = {ste_chain_fusion_rule()};
}

}  // namespace qg
