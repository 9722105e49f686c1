// `qat steps --model llama` on N ranks (--nproc N, or the torchrun variables): the
// data-parallel Llama step, timed on every rank, and the gradient all-reduce alone, so that
// the share of the all-reduce hidden behind the backward pass can be estimated as
//   1 - (T_step - T_step_without_sync) / T_all_reduce_alone
// (--no-grad-sync times the step without any communication).
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "apps/qat/steps_common.h"
#include "core/error.h"
#include "nn/qconfig.h"
#include "runtime/backend.h"
#include "runtime/distributed/gather_bytes.h"
#include "runtime/distributed/gradient_sync.h"

namespace qg::cli {
namespace {

struct Bucket {
  Tensor buffer;
  DType dtype = DType::f32;
  int64_t count = 0;
};

// The buckets the step's gradient sync all-reduces: `sync` applied to stand-ins of the
// parameters' gradients (a gradient has its parameter's type), read off its all_reduce nodes.
std::vector<Bucket> gradient_buckets(const StepGraph& s, const GradientSync& sync, Device device) {
  Graph g;
  std::vector<ValueId> grads;
  for (ValueId p : s.parameters) {
    const Value& v = s.graph.value(p);
    grads.push_back(g.input(v.name + ".grad", v.type));
  }
  sync(g, grads);
  std::vector<Bucket> buckets;
  for (NodeId id = 0; id < g.num_nodes(); ++id) {
    const Node& n = g.node(id);
    if (n.op->name != "bucket_all_reduce") continue;
    const TensorType& t = g.value(n.inputs[0]).type;
    Bucket b;
    b.dtype = t.dtype;
    b.count = t.numel();
    b.buffer = Tensor::zeros({b.count}, b.dtype, device);
    buckets.push_back(std::move(b));
  }
  return buckets;
}

// Microseconds of one all-reduce (avg) of every bucket, issued as the step issues them (on
// CUDA: on the communication stream, the compute stream waiting for each), back to back:
// the mean over `reps` rounds after `warmup`, this rank's.
double all_reduce_alone_us(Communicator& comm, std::vector<Bucket>& buckets, Device device,
                           int reps) {
  auto backend = make_backend(device);
  void* stream = backend->stream();
  auto round = [&] {
    for (Bucket& b : buckets)
      comm.all_reduce(b.buffer.raw_data(), b.count, b.dtype, ReduceOp::avg, stream);
    for (Bucket& b : buckets) comm.wait_for(b.buffer.raw_data(), stream);
  };
  for (int i = 0; i < std::max(2, reps / 10); ++i) round();
  backend->synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) round();
  backend->synchronize();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
         reps;
}

}  // namespace

void time_llama_data_parallel(dist::ProcessGroup& group, const DataParallelSteps& o) {
  const int world = group.world_size(), rank = group.rank();
  Device device = Device::cpu();
  if (o.device == "cuda" || (o.device == "auto" && cuda_available()))
    device = Device::cuda(group.env().local_rank);
  auto backend = make_backend(device);
  Communicator& comm = group.communicator(device);
  const GradientSync sync = dist::bucketed_all_reduce(o.bucket_bytes, o.grad_reduce_dtype);
  if (rank == 0) {
    std::printf(
        "qat steps on %d ranks (%s, %s per rank), median of %d steps; gradient all-reduce %s "
        "(%.0f MiB buckets, in %s); ms: the slowest rank's, tokens/s: the global batch's\n",
        world, comm.backend().c_str(), device.is_cpu() ? "cpu" : "one GPU", o.reps,
        o.grad_sync ? "on" : "off (--no-grad-sync: no communication in the step)",
        static_cast<double>(o.bucket_bytes) / (1 << 20), dtype_name(o.grad_reduce_dtype));
    std::printf("%-32s %8s %12s\n", "case", "kernels", "ms");
    std::fflush(stdout);
  }
  for (bool qat : {false, true}) {
    if (o.variant != "both" && qat != (o.variant == "qat")) continue;
    StepGraph s;
    build_llama_step(s, qat ? nn::parse_recipe(o.recipe, o.group_size) : nn::QConfig::float32(),
                     o.small, nn::parse_precision(o.precision), "adam", o.recompute);
    ContextOptions context;
    if (o.grad_sync) context.communicator = &comm;
    int kernels = 0;
    size_t resident = 0;
    double times[2] = {time_step(s, device, context, o.reps, o.wall, &kernels, &resident,
                                 o.grad_sync ? sync : GradientSync{}),
                       0.0};
    std::vector<Bucket> buckets = gradient_buckets(s, sync, device);
    times[1] = all_reduce_alone_us(comm, buckets, device, o.reps);
    dist::all_reduce_host(comm, times, 2, ReduceOp::max, device);
    if (rank != 0) continue;
    const int64_t tokens = s.feeds.at("input_ids").numel() * world;  // per step, all ranks
    const bool named_recipe = o.recipe != "8da4w" || o.group_size != 32;
    const std::string recipe_label =
        o.recipe + (o.recipe == "w8a8_dynamic" ? "" : "/" + std::to_string(o.group_size));
    const std::string label = std::string("step llama") + (qat ? " qat" : " float") +
                              (qat && named_recipe ? " " + recipe_label : "") +
                              (o.precision != "f32" ? " " + o.precision : " fp32") +
                              (o.recompute ? " recompute" : "");
    std::printf("%-32s %8d %12.3f", label.c_str(), kernels, times[0] / 1000.0);
    if (resident > 0) std::printf("   resident %.2f GiB", resident / 1073741824.0);
    std::printf(
        "   world %d   grad-sync %s   tokens/s %.0f   all-reduce alone %.3f ms (%zu buckets)",
        world, o.grad_sync ? "on" : "off", tokens / (times[0] * 1e-6), times[1] / 1000.0,
        buckets.size());
    // Where in the step's node order the all-reduces start: the earlier, the more of the
    // backward pass they can overlap.
    const auto& at = s.all_reduce_positions;
    if (!at.empty() && s.nodes_run > 0)
      std::printf("   issued at nodes %.0f%%-%.0f%% of %d", 100.0 * at.front() / s.nodes_run,
                  100.0 * at.back() / s.nodes_run, s.nodes_run);
    std::printf("\n");
    std::fflush(stdout);
  }
}

}  // namespace qg::cli
