// CUDA kernels for add/sub/mul/div (NumPy broadcasting), neg, sqrt, broadcast_to, sum_to and
// reshape. Each element is computed in the math type and rounded once, as cpu::binary_float does,
// so the results are bit-identical to the CPU. Same-shape operands take 16-byte vector loads when
// every pointer is aligned, with a scalar tail; so does an operand broadcast along leading
// axes only (a scalar, a bias row); other broadcasts map each index through the shapes.
#include "core/graph.h"
#include "ops/common/cuda_shape.cuh"

namespace qg {
namespace {

using namespace cuda;

struct AddF {
  template <typename M>
  __device__ M operator()(M a, M b) const {
    return a + b;
  }
};
struct SubF {
  template <typename M>
  __device__ M operator()(M a, M b) const {
    return a - b;
  }
};
struct MulF {
  template <typename M>
  __device__ M operator()(M a, M b) const {
    return a * b;
  }
};
struct DivF {
  template <typename M>
  __device__ M operator()(M a, M b) const {
    return a / b;  // IEEE division (no fast-math): bit-identical to the CPU
  }
};
struct SqrtF {
  template <typename M>
  __device__ M operator()(M a, M) const {
    return sqrt(a);  // correctly rounded (no fast-math), as std::sqrt on the CPU
  }
};
struct NegF {
  template <typename M>
  __device__ M operator()(M a, M) const {
    return -a;
  }
};

template <typename T, typename F>
__global__ void binary_bcast_kernel(const T* a, const T* b, T* y, int64_t n, BroadcastMap m, F f) {
  for (int64_t i = global_thread(); i < n; i += global_stride()) {
    int64_t ia, ib;
    broadcast_offsets(m, i, ia, ib);
    y[i] = from_math<T>(f(to_math(a[ia]), to_math(b[ib])));
  }
}

// The broadcast every bias add and scale multiply has: one operand has y's shape, the other
// (`small`, bn elements) matches y's trailing axes, so small's element is index % bn. The
// general kernel pays 64-bit divisions per axis per element for this (attention's score
// scaling ran at half the copy bandwidth); here the index is 32-bit and, when bn is a
// multiple of the pack, each 16-byte pack of `full` meets one contiguous pack of `small`.
// Same element expression as binary_bcast_kernel, so the same bits. kSmallFirst: small is a.
template <typename T, bool kSmallFirst, typename F>
__global__ void binary_suffix_kernel(const T* __restrict__ full, const T* __restrict__ small,
                                     T* __restrict__ y, uint32_t n, uint32_t bn, uint32_t nvec,
                                     F f) {
  constexpr int N = kVec<T>;
  using P = Pack<T, N>;
  auto apply = [&](T u, T s) {
    return kSmallFirst ? from_math<T>(f(to_math(s), to_math(u)))
                       : from_math<T>(f(to_math(u), to_math(s)));
  };
  const uint32_t stride = gridDim.x * blockDim.x;
  for (uint32_t v = blockIdx.x * blockDim.x + threadIdx.x; v < nvec; v += stride) {
    const P pu = reinterpret_cast<const P*>(full)[v];
    const P ps = reinterpret_cast<const P*>(small)[(v * N) % bn / N];
    P py;
#pragma unroll
    for (int j = 0; j < N; ++j) py.v[j] = apply(pu.v[j], ps.v[j]);
    reinterpret_cast<P*>(y)[v] = py;
  }
  for (uint32_t i = nvec * N + blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = apply(full[i], small[i % bn]);
}

// True when `small` broadcasts against y as a suffix: after dropping leading 1s, its shape
// is y's trailing axes.
bool suffix_of(const Shape& small, const Shape& y) {
  size_t lead = 0;
  while (lead < small.size() && small[lead] == 1) ++lead;
  const size_t k = small.size() - lead;
  if (k > y.size()) return false;
  for (size_t i = 0; i < k; ++i)
    if (small[lead + i] != y[y.size() - k + i]) return false;
  return true;
}

// Runs binary_suffix_kernel when one operand has y's shape and the other is a suffix of it
// (and every index fits 32 bits); false otherwise.
template <typename T, typename F>
bool try_suffix_broadcast(KernelContext& ctx, const Tensor& a, const Tensor& b, F f,
                          cudaStream_t stream) {
  Tensor& y = ctx.outputs[0];
  const int64_t n = y.numel();
  const bool a_full = a.shape() == y.shape(), b_full = b.shape() == y.shape();
  if (n >= (int64_t{1} << 31) || a_full == b_full) return false;
  const Tensor& full = a_full ? a : b;
  const Tensor& small = a_full ? b : a;
  if (small.numel() == 0 || !suffix_of(small.shape(), y.shape())) return false;
  constexpr int N = kVec<T>;
  const int64_t bn = small.numel();
  const bool vec = aligned16(full.raw_data()) && aligned16(small.raw_data()) &&
                   aligned16(y.raw_data()) && bn % N == 0;
  const int64_t nvec = vec ? n / N : 0;
  auto shape = elementwise_launch(nvec > 0 ? nvec : n);
  auto go = [&](auto kernel) {
    kernel<<<shape.blocks, shape.threads, 0, stream>>>(
        in_ptr<T>(full), in_ptr<T>(small), out_ptr<T>(y), static_cast<uint32_t>(n),
        static_cast<uint32_t>(bn), static_cast<uint32_t>(nvec), f);
  };
  if (a_full)
    go(binary_suffix_kernel<T, false, F>);
  else
    go(binary_suffix_kernel<T, true, F>);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
  return true;
}

// y = f(a, b); b may alias a for unary ops (NegF ignores it).
template <typename F>
void binary_cuda(KernelContext& ctx, const Tensor& a, const Tensor& b, F f) {
  Tensor& y = ctx.outputs[0];
  auto stream = cuda_stream(ctx.device);
  int64_t n = y.numel();
  if (n == 0) return;
  dispatch_float(y.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    if (a.shape() == y.shape() && b.shape() == y.shape()) {
      launch_map2<T>(ctx.op, a.raw_data(), b.raw_data(), y.raw_data(), n, f, stream);
    } else if (!try_suffix_broadcast<T>(ctx, a, b, f, stream)) {
      BroadcastMap m = broadcast_map(ctx.op, y.shape(), a.shape(), b.shape());
      auto shape = elementwise_launch(n);
      binary_bcast_kernel<T><<<shape.blocks, shape.threads, 0, stream>>>(in_ptr<T>(a), in_ptr<T>(b),
                                                                         out_ptr<T>(y), n, m, f);
      QG_CUDA_CHECK_LAUNCH(ctx.op);
    }
  });
}

template <typename T>
__global__ void broadcast_to_kernel(const T* x, T* y, int64_t n, BroadcastMap m) {
  for (int64_t i = global_thread(); i < n; i += global_stride()) {
    int64_t ix, unused;
    broadcast_offsets(m, i, ix, unused);
    y[i] = x[ix];
  }
}

void broadcast_to_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor& y = ctx.outputs[0];
  if (y.numel() == 0) return;
  BroadcastMap m = broadcast_map(ctx.op, y.shape(), x.shape(), y.shape());
  dispatch_float(y.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    auto shape = elementwise_launch(y.numel());
    broadcast_to_kernel<T><<<shape.blocks, shape.threads, 0, cuda_stream(ctx.device)>>>(
        in_ptr<T>(x), out_ptr<T>(y), y.numel(), m);
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

// sum_to: the target shape left-padded with 1s to x's rank marks the reduced axes.
void sum_to_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor& y = ctx.outputs[0];
  Shape keep(x.shape().size() - y.shape().size(), 1);
  keep.insert(keep.end(), y.shape().begin(), y.shape().end());
  dispatch_float(x.dtype(), ctx.op, [&](auto tag) {
    launch_reduce<decltype(tag)>(ctx.op, x, keep, false, 1.0, y, cuda_stream(ctx.device));
  });
}

}  // namespace

void add_arith_cuda_kernels(OpRegistry& r) {
  auto add = [&](const char* op, KernelFn fn) {
    r.get_mutable(op).kernels.push_back({DeviceType::cuda, kFloatDTypes, std::move(fn)});
  };
  add("add", [](KernelContext& c) { binary_cuda(c, c.inputs[0], c.inputs[1], AddF{}); });
  add("sub", [](KernelContext& c) { binary_cuda(c, c.inputs[0], c.inputs[1], SubF{}); });
  add("mul", [](KernelContext& c) { binary_cuda(c, c.inputs[0], c.inputs[1], MulF{}); });
  add("div", [](KernelContext& c) { binary_cuda(c, c.inputs[0], c.inputs[1], DivF{}); });
  add("neg", [](KernelContext& c) { binary_cuda(c, c.inputs[0], c.inputs[0], NegF{}); });
  add("sqrt", [](KernelContext& c) { binary_cuda(c, c.inputs[0], c.inputs[0], SqrtF{}); });
  add("broadcast_to", broadcast_to_cuda);
  add("sum_to", sum_to_cuda);
  // reshape only hands out a view of its input, so its CPU function serves the device too.
  OpDef& reshape = r.get_mutable("reshape");
  reshape.kernels.push_back({DeviceType::cuda, {}, reshape.kernels.at(0).fn});
}

}  // namespace qg
