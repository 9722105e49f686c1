// CUDA kernels for the plumbing ops. Sources and stop_gradient only hand tensors around, so
// they reuse the device-agnostic CPU functions; full_like fills on the device.
#include "core/graph.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/cuda_context.h"
#include "device/cuda/launch.h"
#include "ops/graph_io/graph_io_args.h"

namespace qg {
namespace {

template <typename T>
__global__ void fill_kernel(T* out, int64_t n, T value) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = value;
}

template <typename T>
void launch_fill(Tensor& t, T value, cudaStream_t s) {
  if (t.numel() == 0) return;
  auto shape = cuda::elementwise_launch(t.numel());
  fill_kernel<T>
      <<<shape.blocks, shape.threads, 0, s>>>(static_cast<T*>(t.raw_data()), t.numel(), value);
  QG_CUDA_CHECK_LAUNCH("full_like");
}

void full_like_cuda(KernelContext& ctx) {
  Tensor& out = ctx.outputs[0];
  const double v = ctx.args<FullLikeArgs>().value;
  auto s = cuda_stream(ctx.device);
  // f16/bf16 fill values are converted on the host (CPU rounding) and stored as raw bits.
  Tensor host = Tensor::from_doubles({}, {v}, out.dtype());
  switch (dtype_size(out.dtype())) {
    case 8:
      launch_fill(out, *static_cast<const uint64_t*>(host.raw_data()), s);
      break;
    case 4:
      launch_fill(out, *static_cast<const uint32_t*>(host.raw_data()), s);
      break;
    case 2:
      launch_fill(out, *static_cast<const uint16_t*>(host.raw_data()), s);
      break;
    default:
      launch_fill(out, *static_cast<const uint8_t*>(host.raw_data()), s);
      break;
  }
}

void add_passthrough(OpRegistry& r, const char* op) {
  OpDef& def = r.get_mutable(op);
  def.kernels.push_back({DeviceType::cuda, {}, def.kernels.at(0).fn});
}

}  // namespace

void add_graph_io_cuda_kernels(OpRegistry& r) {
  for (const char* op : {"input", "constant", "parameter", "variable", "stop_gradient"})
    add_passthrough(r, op);
  r.get_mutable("full_like").kernels.push_back({DeviceType::cuda, {}, full_like_cuda});
}

}  // namespace qg
