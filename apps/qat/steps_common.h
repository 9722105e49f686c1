// Pieces of `qat steps` shared with its data-parallel timing (steps_distributed.cpp): the
// step graph, the Llama step of the PERF.md anchor, and the timing of one compiled step.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/graph.h"
#include "nn/llama.h"
#include "runtime/compile.h"
#include "runtime/distributed/gradient_sync.h"
#include "runtime/distributed/process_group.h"
#include "train/optimizer.h"

namespace qg::cli {

struct StepGraph {
  Graph graph;
  ValueId loss = kNoValue;
  std::vector<ValueId> parameters;
  nn::OptimizerConfig optimizer{"sgd", 0.01, 0.0};
  std::vector<NodeId> updates;  // the optimizer nodes, once compiled (--profile runs them)
  Executor::Feeds feeds;
  std::vector<RecomputeRegion> recompute;  // regions whose activations the backward recomputes
  int64_t planned_arena = 0;               // the compiled step's memory plan, once timed
  // Where the data-parallel all-reduces are issued: their positions in the step's node order
  // (the executor's validated run) out of `nodes_run`; how much backward each can overlap.
  std::vector<int> all_reduce_positions;
  int nodes_run = 0;
  // Where time_step writes the compiled graph (Graph::dump, after the passes), or empty.
  std::string dump_path;
  // Language-model steps: tokens a step trains on, and the model FLOPs MFU counts
  // (llama_model_flops, steps_floors.h).
  int64_t tokens = 0;
  double model_flops = 0;
};

// The Llama decoder of bench/torch_llama_qat_bench.py (207M parameters, batch 8 x 1024
// tokens, Adam; `optimizer` "adamw": AdamW with weight decay 0.01 and the runtime rate, whose
// steps the fuse_multi_tensor_adamw pass merges); `small`: a tiny one for smoke runs;
// `recompute`: each decoder block's activations are recomputed in the backward.
void build_llama_step(StepGraph& s, const nn::QConfig& qc, bool small,
                      const nn::PrecisionPolicy& precision, const std::string& optimizer = "adam",
                      bool recompute = false);

// Compiles the step as every caller does (passes, memory plan, CUDA graph; with
// `gradient_sync`, the data-parallel all-reduce through context.communicator) and returns the
// median microseconds of one step (`wall`: the mean of back-to-back steps). `kernels` gets
// the kernels per launch, `resident_bytes` the device memory the step held while timed.
double time_step(StepGraph& s, Device device, const ContextOptions& context, int reps, bool wall,
                 int* kernels, size_t* resident_bytes, const GradientSync& gradient_sync = {});

struct DevicePeaks;  // steps_floors.h

// Prints where one step's time goes per op, over `runs` executor runs (steps_profile.cpp): GPU
// time between CUDA events after every node, or host wall time on the CPU; with `peaks`, each
// op's floor beside it; on the GPU with `node_ops` (comma-separated op names), every node of
// those ops too.
void profile_step(StepGraph& s, Device device, const ContextOptions& context, int runs,
                  const std::string& node_ops, const DevicePeaks* peaks);

// What `qat steps --model llama` times on every rank of a data-parallel group.
struct DataParallelSteps {
  std::string device = "auto", variant = "both", precision = "f32", recipe = "8da4w";
  int group_size = 32, reps = 20;
  bool small = false, wall = false;
  bool recompute = false;  // activation recomputation per decoder block
  bool grad_sync = true;   // false: the ranks do not communicate (the step alone)
  int64_t bucket_bytes = dist::kDefaultBucketBytes;
  DType grad_reduce_dtype = DType::f32;  // what the buckets travel in
};

// Every rank times the compiled Llama step on its own device (cuda:LOCAL_RANK, or the CPU)
// with its own batch and the bucketed gradient all-reduce, and the all-reduce of the whole
// gradient alone; rank 0 prints the slowest rank's times and the global tokens/s.
void time_llama_data_parallel(dist::ProcessGroup& group, const DataParallelSteps& o);

}  // namespace qg::cli
