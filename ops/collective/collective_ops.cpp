// Collective ops: what a data-parallel step adds to the graph after autograd (runtime/
// distributed/gradient_sync.cpp builds the chain). A bucket is one flat buffer holding several
// gradients, so that one all-reduce moves them all:
//
//   g0 -> bucket_begin(size, offset 0) -> b
//   g1 -> bucket_put(b, offset n0) -> b'          (b' is b itself: an in-place view)
//   ...
//   bucket_all_reduce(b'', op avg) -> r          (every rank's buckets combined, in place)
//   bucket_get(r, offset n0, shape of g1) -> g1'  (one per gradient, a view into the bucket:
//                                                 what the optimizer reads)
//
// ZeRO stage 1 (runtime/distributed/optimizer_sharding.cpp) adds a second chain after the
// optimizer steps: each rank packs the parameters it updated into its shard (bucket_begin,
// bucket_put), all_gather concatenates the shards of all ranks in rank order, and
// bucket_assign copies each parameter another rank updated out of it, in place.
//
// all_reduce (a copy) and bucket_all_reduce (in place) call the communicator of the kernel's
// DeviceContext (device/communicator.h); with none (one process) it is the identity, so the same
// graph runs in one process. None of these ops is differentiable: they run after autograd.
#include <cstring>

#include "core/error.h"
#include "core/op_registry.h"
#include "device/communicator.h"
#include "device/device_context.h"
#include "ops/common/schema_helpers.h"

namespace qg {
namespace {

// Byte copies: any float dtype a gradient travels in (bf16/f16 with a half reduce dtype).
const std::vector<DType> kBucketTypes = {DType::f32, DType::f64, DType::bf16, DType::f16};

// The parsed attributes of every collective op (each reads the fields it declares).
struct CollectiveArgs : KernelArgs {
  int64_t offset = 0;               // bucket_begin, bucket_put, bucket_get, bucket_assign
  ReduceOp reduce = ReduceOp::avg;  // all_reduce
  int64_t ranks = 1;                // all_gather
  Shape shape;                      // bucket_get
};

ReduceOp reduce_op(const std::string& name) {
  if (name == "sum") return ReduceOp::sum;
  if (name == "min") return ReduceOp::min;
  if (name == "max") return ReduceOp::max;
  return ReduceOp::avg;
}

std::shared_ptr<const KernelArgs> parse_collective(const ArgsSource& s) {
  auto a = std::make_shared<CollectiveArgs>();
  if (s.attrs.has("offset")) a->offset = s.attrs.get_int("offset");
  if (s.attrs.has("op")) a->reduce = reduce_op(s.attrs.get_string("op"));
  if (s.attrs.has("ranks")) a->ranks = s.attrs.get_int("ranks");
  if (s.attrs.has("shape")) a->shape = s.attrs.get_ints("shape");
  return a;
}

int64_t offset_of(const KernelContext& ctx) {
  return ctx.args<CollectiveArgs>().offset;
}

// Copies `bytes` on the kernel's device (stream-ordered on CUDA, capturable in a graph).
void device_copy(KernelContext& ctx, void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  const Device d = ctx.inputs[0].device();
  if (d.is_cpu())
    std::memcpy(dst, src, bytes);
  else
    ctx.device.copy(dst, d, src, d, bytes);
}

int64_t checked_offset(const InferContext& ctx, int64_t bucket, int64_t len) {
  const int64_t offset = ctx.attrs.get_int("offset");
  QG_CHECK(offset >= 0 && offset + len <= bucket, ctx.op, "attribute 'offset' = ", offset, " with ",
           len, " elements does not fit a bucket of ", bucket);
  return offset;
}

void define_bucket_begin(OpRegistry& r) {
  OpDef& op = r.define("bucket_begin");
  op.parse_args = parse_collective;
  op.doc = "A flat bucket of `size` elements holding x (flattened) at `offset`; the rest unset.";
  op.inputs = {"x"};
  op.outputs = {"bucket"};
  op.attrs = {int_attr("size", std::nullopt, "elements in the bucket", 1),
              int_attr("offset", 0, "where x goes", 0)};
  op.infer = [](const InferContext& ctx) {
    const int64_t size = ctx.attrs.get_int("size");
    checked_offset(ctx, size, ctx.inputs[0].numel());
    return std::vector<TensorType>{{ctx.inputs[0].dtype, {size}}};
  };
  KernelFn fn = [](KernelContext& ctx) {
    const Tensor& x = ctx.inputs[0];
    auto* dst = static_cast<char*>(ctx.outputs[0].raw_data());
    device_copy(ctx, dst + offset_of(ctx) * dtype_size(x.dtype()), x.raw_data(), x.nbytes());
  };
  op.kernels.push_back({DeviceType::cpu, kBucketTypes, fn});
  op.kernels.push_back({DeviceType::cuda, kBucketTypes, fn});
}

void define_bucket_put(OpRegistry& r) {
  OpDef& op = r.define("bucket_put");
  op.parse_args = parse_collective;
  op.doc = "Writes x (flattened) into the bucket at `offset`, in place; the output is the bucket.";
  op.inputs = {"bucket", "x"};
  op.outputs = {"bucket"};
  op.aliases_input = true;  // the bucket's own buffer: a bucket is filled without copies of it
  op.attrs = {int_attr("offset", std::nullopt, "where x goes", 0)};
  op.infer = [](const InferContext& ctx) {
    expect_same_dtype(ctx, 0, 1);
    expect_rank(ctx, 0, 1);
    checked_offset(ctx, ctx.inputs[0].numel(), ctx.inputs[1].numel());
    return std::vector<TensorType>{ctx.inputs[0]};
  };
  KernelFn fn = [](KernelContext& ctx) {
    ctx.outputs[0] = ctx.inputs[0];
    const Tensor& x = ctx.inputs[1];
    auto* dst = static_cast<char*>(ctx.outputs[0].raw_data());
    device_copy(ctx, dst + offset_of(ctx) * dtype_size(x.dtype()), x.raw_data(), x.nbytes());
  };
  op.kernels.push_back({DeviceType::cpu, kBucketTypes, fn});
  op.kernels.push_back({DeviceType::cuda, kBucketTypes, fn});
}

void define_bucket_get(OpRegistry& r) {
  OpDef& op = r.define("bucket_get");
  op.parse_args = parse_collective;
  op.doc =
      "The elements [offset, offset + numel(shape)) of a bucket, shaped `shape`: a view into the "
      "bucket (no copy), read once its all-reduce is done.";
  op.inputs = {"bucket"};
  op.outputs = {"y"};
  // A view: the optimizer reads the averaged gradient where the all-reduce left it (the
  // gradient sync places every gradient on a 512-byte boundary of its bucket, so the view is
  // as aligned as a planned buffer).
  op.aliases_input = true;
  op.attrs = {int_attr("offset", std::nullopt, "first element", 0),
              ints_attr("shape", std::nullopt, "shape of the result")};
  op.infer = [](const InferContext& ctx) {
    expect_rank(ctx, 0, 1);
    const Shape shape = ctx.attrs.get_ints("shape");
    checked_offset(ctx, ctx.inputs[0].numel(), shape_numel(shape));
    return std::vector<TensorType>{{ctx.inputs[0].dtype, shape}};
  };
  KernelFn fn = [](KernelContext& ctx) {
    const Tensor& bucket = ctx.inputs[0];
    if (Communicator* comm = ctx.device.communicator())
      comm->wait_for(bucket.raw_data(), ctx.device.stream());
    const int64_t bytes_in = offset_of(ctx) * static_cast<int64_t>(dtype_size(bucket.dtype()));
    ctx.outputs[0] = bucket.view(bytes_in, ctx.args<CollectiveArgs>().shape, bucket.dtype());
  };
  op.kernels.push_back({DeviceType::cpu, kBucketTypes, fn});
  op.kernels.push_back({DeviceType::cuda, kBucketTypes, fn});
}

// all_reduce's and bucket_all_reduce's kernel: y = x combined over the ranks, with y a copy of
// x (all_reduce) or x itself (bucket_all_reduce).
KernelFn all_reduce_kernel(bool in_place) {
  return [in_place](KernelContext& ctx) {
    const Tensor& x = ctx.inputs[0];
    if (in_place)
      ctx.outputs[0] = x;
    else
      device_copy(ctx, ctx.outputs[0].raw_data(), x.raw_data(), x.nbytes());
    Tensor& y = ctx.outputs[0];
    Communicator* comm = ctx.device.communicator();
    if (comm == nullptr || y.numel() == 0) return;
    QG_CHECK(comm->memory() == y.device().type, ctx.op, "the ", comm->backend(),
             " communicator takes ", device_type_name(comm->memory()), " buffers, this op runs on ",
             y.device().str());
    comm->all_reduce(y.raw_data(), y.numel(), y.dtype(), ctx.args<CollectiveArgs>().reduce,
                     ctx.device.stream());
  };
}

void define_reduce_op(OpRegistry& r, const char* name, bool in_place) {
  OpDef& op = r.define(name);
  // Issued as soon as its input is complete; its readers wait (bucket_get) as late as the
  // order allows, so the all-reduce overlaps the rest of the backward pass.
  op.overlaps_async = true;
  op.aliases_input = in_place;
  op.parse_args = parse_collective;
  op.doc = in_place
               ? "The bucket combined over the data-parallel ranks in place (its own buffer, no "
                 "copy): the gradient all-reduce. Sum, min, max, or avg = sum / ranks."
               : "x combined over the data-parallel ranks (sum, min, max, or avg = sum / ranks, "
                 "as DDP averages gradients); the identity in one process.";
  op.inputs = {in_place ? "bucket" : "x"};
  op.outputs = {in_place ? "bucket" : "y"};
  op.attrs = {string_attr("op", std::string("avg"), {"sum", "min", "max", "avg"}, "the reduction")};
  op.infer = [in_place](const InferContext& ctx) {
    if (in_place) expect_rank(ctx, 0, 1);
    return std::vector<TensorType>{ctx.inputs[0]};
  };
  op.kernels.push_back({DeviceType::cpu, {}, all_reduce_kernel(in_place)});
  op.kernels.push_back({DeviceType::cuda, {}, all_reduce_kernel(in_place)});
}

// The communicator a collective kernel uses, checked against the ranks the graph was built for.
Communicator* checked_communicator(KernelContext& ctx, int64_t ranks, const Device& device) {
  Communicator* comm = ctx.device.communicator();
  const int64_t world = comm == nullptr ? 1 : comm->world_size();
  QG_CHECK(world == ranks, ctx.op, "built for ", ranks, " ranks (attribute 'ranks'), the run has ",
           world);
  if (comm != nullptr)
    QG_CHECK(comm->memory() == device.type, ctx.op, "the ", comm->backend(), " communicator takes ",
             device_type_name(comm->memory()), " buffers, this op runs on ", device.str());
  return comm;
}

void define_all_gather(OpRegistry& r) {
  OpDef& op = r.define("all_gather");
  op.parse_args = parse_collective;
  op.doc = "Every rank's x (flat), concatenated in rank order: `ranks` x numel(x) elements.";
  op.inputs = {"x"};
  op.outputs = {"y"};
  op.attrs = {int_attr("ranks", std::nullopt, "ranks of the run (the communicator's size)", 1)};
  op.infer = [](const InferContext& ctx) {
    expect_rank(ctx, 0, 1);
    return std::vector<TensorType>{
        {ctx.inputs[0].dtype, {ctx.attrs.get_int("ranks") * ctx.inputs[0].numel()}}};
  };
  KernelFn fn = [](KernelContext& ctx) {
    const Tensor& x = ctx.inputs[0];
    Tensor& y = ctx.outputs[0];
    Communicator* comm = checked_communicator(ctx, ctx.args<CollectiveArgs>().ranks, y.device());
    if (comm == nullptr) {
      device_copy(ctx, y.raw_data(), x.raw_data(), x.nbytes());
      return;
    }
    if (x.numel() > 0)
      comm->all_gather(x.raw_data(), y.raw_data(), static_cast<int64_t>(x.nbytes()),
                       ctx.device.stream());
  };
  op.kernels.push_back({DeviceType::cpu, {}, fn});
  op.kernels.push_back({DeviceType::cuda, {}, fn});
}

void define_bucket_assign(OpRegistry& r) {
  OpDef& op = r.define("bucket_assign");
  op.parse_args = parse_collective;
  op.doc =
      "Overwrites target, in place, with the bucket's elements [offset, offset + numel(target)) "
      "(a parameter another rank updated).";
  op.inputs = {"target", "bucket"};
  op.attrs = {int_attr("offset", std::nullopt, "first element", 0)};
  op.infer = [](const InferContext& ctx) {
    expect_same_dtype(ctx, 0, 1);
    expect_rank(ctx, 1, 1);
    checked_offset(ctx, ctx.inputs[1].numel(), ctx.inputs[0].numel());
    return std::vector<TensorType>{};
  };
  op.side_effects = true;
  KernelFn fn = [](KernelContext& ctx) {
    Tensor& target = ctx.inputs[0];
    QG_CHECK(target.is_contiguous(), ctx.op, "the target ", target.str(), " is not contiguous");
    if (Communicator* comm = ctx.device.communicator())
      comm->wait_for(ctx.inputs[1].raw_data(), ctx.device.stream());
    const auto* src = static_cast<const char*>(ctx.inputs[1].raw_data());
    device_copy(ctx, target.raw_data(), src + offset_of(ctx) * dtype_size(target.dtype()),
                target.nbytes());
  };
  op.kernels.push_back({DeviceType::cpu, kBucketTypes, fn});
  op.kernels.push_back({DeviceType::cuda, kBucketTypes, fn});
}

}  // namespace

void define_collective_ops(OpRegistry& r) {
  define_bucket_begin(r);
  define_bucket_put(r);
  define_bucket_get(r);
  define_reduce_op(r, "all_reduce", /*in_place=*/false);
  // The gradient sync's: the bucket is read by nothing else, so it is reduced where it lies.
  define_reduce_op(r, "bucket_all_reduce", /*in_place=*/true);
  define_all_gather(r);
  define_bucket_assign(r);
}

}  // namespace qg
