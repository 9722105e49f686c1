// One rank of the data-parallel tests (distributed_test.cpp starts 1, 2 or 3 of them with the
// torchrun variables through dist::launch_local, or none are set: one process).
//   dist_worker <scenario> <out dir> [args]
// Each rank writes what the test compares into <out dir>/<scenario>_w<world>_r<rank>.txt and
// exits 0; on a failure it reports to the group, writes the message to
// <out dir>/err_r<rank>.txt and exits 3.
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/graph.h"
#include "core/half_bits.h"
#include "data/digits.h"
#include "device/device_context.h"
#include "ops/common/quant_scope.h"
#include "ops/observer/observer_common.h"
#include "runtime/compile.h"
#include "runtime/distributed/process_group.h"
#include "tests/distributed/lm_scenarios.h"
#include "tests/distributed/worker_util.h"
#include "train/trainer.h"

using namespace qg;
using qg::testing::bytes_digest;
using qg::testing::hex_of;
using qg::testing::state_digest;

namespace {

// ---- collectives: every op and dtype against hand-computed values.
void collectives(Communicator& c, std::ostream& out) {
  const int r = c.rank(), n = c.world_size();
  auto expect = [&](bool ok, const std::string& what) {
    QG_CHECK(ok, "dist_worker", "rank ", r, ": ", what);
  };
  std::vector<float> f = {static_cast<float>(r + 1), -static_cast<float>(r), 0.5f};
  c.all_reduce(f.data(), 3, DType::f32, ReduceOp::sum);
  expect(f[0] == n * (n + 1) / 2.0f && f[1] == -(n * (n - 1) / 2.0f) && f[2] == 0.5f * n,
         "sum f32");
  std::vector<int32_t> i = {r, -r};
  c.all_reduce(i.data(), 2, DType::i32, ReduceOp::max);
  expect(i[0] == n - 1 && i[1] == 0, "max i32");
  std::vector<int64_t> l = {int64_t{1} << 40, r};
  c.all_reduce(l.data(), 2, DType::i64, ReduceOp::min);
  expect(l[0] == int64_t{1} << 40 && l[1] == 0, "min i64");
  std::vector<double> a = {2.0 * r};
  c.all_reduce(a.data(), 1, DType::f64, ReduceOp::avg);
  expect(a[0] == static_cast<double>(n - 1), "avg f64");
  // bf16 / f16 (gradient buckets with a half reduce dtype): each partial sum is rounded to the
  // 16-bit type. Element 0 sums exactly in any order (1 + k/64 over the ranks); element 1,
  // 1 + r/128 (bf16) or 1 + r/1024 (f16), sums for 2 ranks to 2 + one half-spacing at 2, a
  // tie that rounds to the even 2.0 where f32 would keep 2.0078125.
  for (const bool bf16 : {true, false}) {
    const float step0 = bf16 ? 1.0f / 64 : 1.0f / 512, step1 = bf16 ? 1.0f / 128 : 1.0f / 1024;
    auto narrow = [&](float v) {
      return bf16 ? half_bits::f32_to_bf16(v) : half_bits::f32_to_f16(v);
    };
    auto widen = [&](uint16_t h) {
      return bf16 ? half_bits::bf16_to_f32(h) : half_bits::f16_to_f32(h);
    };
    const DType d = bf16 ? DType::bf16 : DType::f16;
    std::vector<uint16_t> h = {narrow(1 + r * step0), narrow(1 + r * step1)};
    c.all_reduce(h.data(), 2, d, ReduceOp::sum);
    const float exact = n + step0 * n * (n - 1) / 2;
    expect(widen(h[0]) == exact, std::string("sum ") + dtype_name(d));
    if (n == 2) expect(widen(h[1]) == 2.0f, std::string("rounded sum ") + dtype_name(d));
    h = {narrow(1 + r * step0)};
    c.all_reduce(h.data(), 1, d, ReduceOp::avg);
    expect(widen(h[0]) == exact / n, std::string("avg ") + dtype_name(d));
    h = {narrow(r == 1 ? -2.5f : 0.5f * r)};
    c.all_reduce(h.data(), 1, d, ReduceOp::min);
    expect(widen(h[0]) == -2.5f, std::string("min ") + dtype_name(d));
  }
  std::vector<char> b(5, static_cast<char>(r == n - 1 ? 'x' : 'o'));
  c.broadcast(b.data(), 5, n - 1);
  expect(std::string(b.begin(), b.end()) == "xxxxx", "broadcast from the last rank");
  std::vector<int32_t> mine = {r * 10, r * 10 + 1}, all(2 * n);
  c.all_gather(mine.data(), all.data(), 8);
  for (int k = 0; k < n; ++k)
    expect(all[2 * k] == 10 * k && all[2 * k + 1] == 10 * k + 1, "all_gather");
  std::vector<std::vector<float>> lists = {std::vector<float>(r, 1.0f * r),
                                           {static_cast<float>(r)}};
  auto g = all_gather_lists(c, lists);
  size_t total = 0;
  for (int k = 0; k < n; ++k) total += k;
  expect(g[0].size() == total && g[1].size() == static_cast<size_t>(n) && g[1].back() == n - 1,
         "all_gather_lists");
  c.barrier();
  out << "ok\n";
}

// ---- observers: every kind and scope, fused and unfused, on shards of one global batch
// whose rank-1 rows hold a NaN and an infinity. Written: qparams and every state per step.
// On the GPU the rows are 1024 wide, so that the fused per-tensor kernels run (whole packs)
// on several blocks, and y is written as a digest.
constexpr int64_t kRows = 12, kCols = 8, kCudaCols = 1024;

float value(int step, int64_t row, int64_t col) {
  if (step == 1 && row == 6 && col == 2) return std::numeric_limits<float>::quiet_NaN();
  if (step == 1 && row == 7 && col == 5) return std::numeric_limits<float>::infinity();
  if (row == 6 && col == 0) return -0.0f;
  const int64_t k = (row * 31 + col * 7 + step * 13) % 29;
  return (static_cast<float>(k) - 11.0f) * (0.25f + 0.125f * static_cast<float>(col % 3)) +
         0.01f * static_cast<float>(step);
}

void observers(Communicator* c, bool fused, std::ostream& out, Device device = Device::cpu()) {
  const int world = c ? c->world_size() : 1, rank = c ? c->rank() : 0;
  const bool cuda = device.is_cuda();
  const int64_t rows = kRows / world, cols = cuda ? kCudaCols : kCols;
  struct Case {
    std::string op, scope;
  };
  std::vector<Case> cases;
  for (const char* op : {"minmax_observer", "moving_average_observer"})
    for (const char* scope : {"tensor", "channel"}) cases.push_back({op, scope});
  for (const char* op : {"histogram_observer", "percentile_observer"})
    for (const char* scope : {"tensor", "channel"}) cases.push_back({op, scope});
  for (const Case& cs : cases) {
    for (int delayed = 0; delayed < 2; ++delayed) {
      if (delayed && cs.op.find("histogram") != std::string::npos) continue;
      if (delayed && cs.op.find("percentile") != std::string::npos) continue;
      Graph g;
      ValueId x = g.input("x", {DType::f32, {rows, cols}});
      Attrs scope = {{"scope", cs.scope}};
      if (cs.scope != "tensor") scope.set("axis", int64_t{1});
      Attrs oa = scope;
      if (delayed) oa.set("delayed", true);
      if (cs.op == "histogram_observer") oa.set("bins", int64_t{64});
      if (cs.op == "percentile_observer") oa.set("bins", int64_t{64});
      auto q = g.apply(cs.op, {x}, oa, "obs");
      auto y = g.apply("fake_quantize", {x, q[0], q[1]}, scope, "fq");
      CompileOptions options;
      // Only y is fetched: fetching the qparams would keep the pair from fusing (the qparams
      // follow from the states, which are compared, and shape y, which is compared whole).
      options.outputs = {y[0]};
      if (!fused) options.passes.disabled = {"all"};
      options.context.communicator = c;
      options.device = device;
      CompiledStep step(g, TrainingSpec{}, options);
      int fused_nodes = 0;  // the fused mode must run the fused kernels
      for (NodeId id = 0; id < g.num_nodes(); ++id)
        if (!g.node(id).dead && g.node(id).op->name == "fused_observe_quantize") ++fused_nodes;
      out << cs.op << '/' << cs.scope << (delayed ? "/delayed" : "") << " fused nodes "
          << fused_nodes << '\n';
      for (int s = 0; s < 3; ++s) {
        std::vector<float> v;
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < cols; ++j) v.push_back(value(s, rank * rows + i, j));
        const auto& got = step.forward({{"x", Tensor::from_vector<float>({rows, cols}, v)}}, {y[0]},
                                       /*training=*/true);
        step.synchronize();
        // The global batch's y: every rank's shard, in rank order.
        Tensor whole = Tensor::empty({kRows, cols}, DType::f32, device);
        if (c)
          c->all_gather(got[0].raw_data(), whole.raw_data(), static_cast<int64_t>(got[0].nbytes()),
                        cuda ? step.executor().context().stream() : nullptr);
        else
          whole = got[0];
        step.synchronize();
        out << cs.op << '/' << cs.scope << (delayed ? "/delayed" : "") << '/' << s << " y "
            << (cuda ? bytes_digest(whole) : hex_of(whole));
        for (const auto& [key, t] : state_index(step.executor()))
          out << ' ' << key << ' ' << hex_of(*t);
        out << '\n';
      }
    }
  }
}

// ---- gather_input (ops/observer/observer_common.h), which the CUDA histogram and percentile
// observers sync through: each rank's shard of the global rows, gathered in rank order, for the
// per-tensor and the per-channel (axis 1) layout; then a row scope, which it must refuse.
void gather_inputs(Communicator* c, std::ostream& out) {
  const int world = c ? c->world_size() : 1, rank = c ? c->rank() : 0;
  const int64_t rows = kRows / world;
  std::vector<float> v;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < kCols; ++j) v.push_back(value(1, rank * rows + i, j));
  const Tensor x = Tensor::from_vector<float>({rows, kCols}, v);
  for (const std::string scope : {"tensor", "channel"}) {
    Attrs attrs = {{"scope", scope}};
    if (scope == "channel") attrs.set("axis", int64_t{1});
    const ScopeLayout l = scope_layout("gather_input", attrs, x.shape());
    const GatheredInput g = c ? gather_input(*c, x, l, nullptr) : GatheredInput{x, l};
    out << scope << " outer " << g.layout.outer << " axis_len " << g.layout.axis_len << " qparams "
        << g.layout.num_qparams << " x " << hex_of(g.x) << '\n';
  }
  if (c == nullptr) return;
  Attrs rows_scope = {{"scope", std::string("channel")}, {"axis", int64_t{0}}};
  try {
    gather_input(*c, x, scope_layout("gather_input", rows_scope, x.shape()), nullptr);
    out << "channel axis 0: gathered\n";
  } catch (const Error&) {
    out << "channel axis 0: refused\n";
  }
}

// ---- training: a small model on the digits, with per-step mean losses and state digests.
nn::TrainConfig small_config(const std::string& kind, Communicator* c, int64_t global_batch) {
  nn::TrainConfig cfg;
  cfg.model = kind;
  cfg.mlp.hidden = {16};
  cfg.mlp.batch = global_batch / (c ? c->world_size() : 1);
  cfg.cnn.channels = {4, 8, 8};
  cfg.transformer.d_model = 16;
  cfg.transformer.heads = 2;
  cfg.transformer.mlp_hidden = 32;
  cfg.qconfig = nn::QConfig::w8a8();
  cfg.optimizer.lr = kind == "cnn" ? 1e-2 : 3e-3;
  cfg.seed = 5;
  cfg.comm = c;
  return cfg;
}

nn::Dataset head(const nn::Dataset& d, int64_t n) {
  nn::Dataset out;
  out.features = d.features;
  out.x.assign(d.x.begin(), d.x.begin() + n * d.features);
  out.labels.assign(d.labels.begin(), d.labels.begin() + n);
  return out;
}

void train(Communicator* c, const std::string& kind, std::ostream& out) {
  nn::Dataset all = nn::load_digits();
  nn::Dataset data = head(all, 240), test = head(all, 48);
  nn::Trainer t(small_config(kind, c, 48), data, test);
  int64_t k = 0;
  double prev = 0;
  t.train_epoch([&](const nn::StepInfo& info) {
    // This step's loss on this rank's shard, then its mean over the ranks: the global batch's.
    ++k;
    double loss = info.loss * static_cast<double>(k) - prev * static_cast<double>(k - 1);
    prev = info.loss;
    if (c) {
      c->all_reduce(&loss, 1, DType::f64, ReduceOp::sum);
      loss /= c->world_size();
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9g", loss);
    out << "step " << k << " loss " << buf << " state " << state_digest(t.executor()) << '\n';
  });
}

// ---- ZeRO-1: the same training with the optimizer state sharded ("on") or not ("off"). Each
// step prints the loss and the digest of everything but the optimizer state (which a sharded
// rank holds only in part); then rank 0 writes <dir>/zero1_<arg>.qgck.
void zero1(Communicator* c, const std::string& arg, const std::string& dir, std::ostream& out,
           Device device = Device::cpu()) {
  nn::Dataset all = nn::load_digits();
  nn::Dataset data = head(all, 240), test = head(all, 48);
  nn::TrainConfig cfg = small_config("mlp", c, 48);
  cfg.device = device;
  cfg.shard_optimizer_states = arg == "on";
  nn::Trainer t(cfg, data, test);
  int64_t k = 0;
  t.train_epoch([&](const nn::StepInfo& info) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9g", info.loss);
    out << "step " << ++k << " loss " << buf << " state " << state_digest(t.executor(), false)
        << '\n';
  });
  out << "optimizer_state_bytes " << t.optimizer_state_bytes() << '\n';
  t.save_checkpoint(dir + "/zero1_" + arg + ".qgck");
  out << "final " << state_digest(t.executor(), !cfg.shard_optimizer_states) << '\n';
}

// Loads <dir>/zero1_on.qgck (written by 2 sharded ranks) into this run, sharded ("on") or not
// ("off"), and prints the digests of what it holds.
void zero1_resume(Communicator* c, const std::string& arg, const std::string& dir,
                  std::ostream& out) {
  nn::Dataset all = nn::load_digits();
  nn::Dataset data = head(all, 240), test = head(all, 48);
  nn::TrainConfig cfg = small_config("mlp", c, 48);
  cfg.shard_optimizer_states = arg == "on";
  nn::Trainer t(cfg, data, test);
  t.load_checkpoint(dir + "/zero1_on.qgck");
  out << "final " << state_digest(t.executor(), !cfg.shard_optimizer_states) << '\n';
  out << "optimizer_state_bytes " << t.optimizer_state_bytes() << '\n';
}

// ---- the watchdog: rank 1 dies; rank 0 sleeps as if in a GPU collective that never ends, and
// its watchdog writes the message and ends it (exit code 3) long before the sleep is over.
void watchdog(dist::ProcessGroup& group, const std::string& dir) {
  const int rank = group.rank();
  group.start_watchdog([dir, rank](const std::string& message) {
    std::ofstream(dir + "/err_r" + std::to_string(rank) + ".txt") << message << '\n';
    std::_Exit(3);
  });
  group.store().set("ready/" + std::to_string(rank), "1");
  group.store().wait({"ready/0", "ready/1"}, std::chrono::seconds(30));
  if (rank == 1) std::raise(SIGKILL);
  std::this_thread::sleep_for(std::chrono::seconds(40));
}

// ---- calibration (PTQ): `batches` global batches of 32 rows, each rank observing its share;
// the observers end as one process's observing the same rows.
void calibrate(Communicator* c, std::ostream& out) {
  nn::Dataset all = nn::load_digits();
  nn::Dataset data = head(all, 160), test = head(all, 32);
  nn::Trainer t(small_config("mlp", c, 32), data, test);
  const int world = c ? c->world_size() : 1;
  t.calibrate(data, 4 * world);  // 4 global batches
  out << "state " << state_digest(t.executor()) << '\n';
}

// ---- faults: one epoch and a checkpoint, then rank 1 fails in the second epoch (a batch with
// labels out of range, an exception; or SIGKILL, a death without a word).
void fault(Communicator* c, const std::string& mode, const std::string& dir, std::ostream& out) {
  nn::Dataset all = nn::load_digits();
  nn::Dataset data = head(all, 192), test = head(all, 32);
  nn::Trainer t(small_config("mlp", c, 32), data, test);
  t.train_epoch();
  t.save_checkpoint(dir + "/checkpoint.qgck");
  out << "epoch 1 done\n";
  out.flush();
  const bool victim = c && c->rank() == 1;
  if (victim && mode == "badbatch")
    for (int64_t& l : data.labels) l = 99;  // the trainer reads this dataset by reference
  t.train_epoch([&](const nn::StepInfo& info) {
    if (victim && mode == "kill" && info.step_in_epoch == 2) std::raise(SIGKILL);
    // Stuck past the timeout (QG_DIST_TIMEOUT): the peers' collectives time out.
    if (victim && mode == "stall" && info.step_in_epoch == 2)
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  });
  out << "epoch 2 done\n";
}

// ---- NCCL (2-GPU machine): collectives on device buffers, and W8A8 QAT on N GPUs against
// one GPU (gradients, observer and batch-norm statistics through NCCL).
void collectives_cuda(Communicator& c, std::ostream& out) {
  const int r = c.rank(), n = c.world_size();
  const Device dev = Device::cuda(c.rank());
  auto context = make_device_context(dev);  // installs the CUDA allocator
  Tensor f = Tensor::from_vector<float>({3}, {static_cast<float>(r + 1), 2.0f * r, 1.0f}).to(dev);
  c.all_reduce(f.raw_data(), 3, DType::f32, ReduceOp::sum);
  Tensor h = f.to(Device::cpu());
  QG_CHECK(h.data<float>()[0] == n * (n + 1) / 2.0f && h.data<float>()[2] == static_cast<float>(n),
           "dist_worker", "rank ", r, ": NCCL sum");
  Tensor a = Tensor::from_vector<float>({1}, {2.0f * r}).to(dev);
  c.all_reduce(a.raw_data(), 1, DType::f32, ReduceOp::avg);
  QG_CHECK(a.to(Device::cpu()).data<float>()[0] == static_cast<float>(n - 1), "dist_worker",
           "rank ", r, ": NCCL avg");
  c.barrier();
  out << "ok\n";
}

// kind "mlp_kill": rank 1 is killed in the third step (the NCCL fault test); "mlp_stall": rank
// 1 sleeps 8 s after its second step (past QG_DIST_TIMEOUT), so that rank 0's observer kernels
// wait for its statistics in vain.
void train_cuda(Communicator* c, std::string kind, int local_rank, std::ostream& out) {
  const bool kill = kind == "mlp_kill", stall = kind == "mlp_stall";
  if (kill || stall) kind = "mlp";
  nn::Dataset all = nn::load_digits();
  nn::Dataset data = head(all, 240), test = head(all, 48);
  nn::TrainConfig cfg = small_config(kind, c, 48);
  cfg.device = Device::cuda(local_rank);
  nn::Trainer t(cfg, data, test);
  int64_t k = 0;
  double prev = 0;
  t.train_epoch([&](const nn::StepInfo& info) {
    if (kill && c != nullptr && c->rank() == 1 && info.step_in_epoch == 2) std::raise(SIGKILL);
    if (stall && c != nullptr && c->rank() == 1 && info.step_in_epoch == 2)
      std::this_thread::sleep_for(std::chrono::seconds(8));
    ++k;
    const double loss = info.loss * static_cast<double>(k) - prev * static_cast<double>(k - 1);
    prev = info.loss;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9g", loss);
    out << "step " << k << " loss " << buf << " state " << state_digest(t.executor()) << '\n';
  });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: dist_worker <scenario> <out dir> [args]\n";
    return 2;
  }
  const std::string scenario = argv[1], dir = argv[2], arg = argc > 3 ? argv[3] : "";
  std::unique_ptr<dist::ProcessGroup> group;
  int rank = 0, world = 1;
  try {
    if (auto env = dist::LaunchEnv::from_environment()) {
      rank = env->rank;  // before connecting, so a failed rendezvous names the right rank
      dist::GroupOptions go;
      go.timeout = dist::timeout_from_environment(go.timeout);
      group = dist::ProcessGroup::connect(*env, go);
      rank = env->rank;
      world = env->world_size;
    }
    // The CPU communicator (Gloo) only for the scenarios that run on the CPU, so the NCCL
    // scenarios also run in a build without Gloo.
    const bool on_cuda = scenario.find("cuda") != std::string::npos || scenario == "watchdog";
    Communicator* c =
        group && world > 1 && !on_cuda ? &group->communicator(Device::cpu()) : nullptr;
    std::ofstream out(dir + "/" + scenario + (arg.empty() ? "" : "_" + arg) + "_w" +
                      std::to_string(world) + "_r" + std::to_string(rank) + ".txt");
    if (scenario == "connect")  // the rendezvous alone: every rank exits right after it
      out << "ok\n";
    else if (scenario == "collectives")
      collectives(group->communicator(Device::cpu()), out);
    else if (scenario == "observers")
      observers(c, arg == "fused", out);
    else if (scenario == "gather_input")
      gather_inputs(c, out);
    else if (scenario == "train")
      train(c, arg, out);
    else if (scenario == "collectives_cuda")
      collectives_cuda(group->communicator(Device::cuda(rank)), out);
    else if (scenario == "train_cuda")
      train_cuda(group && world > 1 ? &group->communicator(Device::cuda(rank)) : nullptr, arg, rank,
                 out);
    else if (scenario == "observers_cuda") {
      Communicator* cuda = group && world > 1 ? &group->communicator(Device::cuda(rank)) : nullptr;
      // How the statistics travelled, for the test to check the path it meant to cover.
      if (cuda != nullptr)
        std::ofstream(dir + "/mailbox_r" + std::to_string(rank) + ".txt")
            << cuda->peer_mailbox_status() << '\n';
      observers(cuda, arg == "fused", out, Device::cuda(rank));
    } else if (scenario == "zero1")
      zero1(c, arg, dir, out);
    else if (scenario == "zero1_cuda")
      zero1(group && world > 1 ? &group->communicator(Device::cuda(rank)) : nullptr, arg, dir, out,
            Device::cuda(rank));
    else if (scenario == "zero1_resume")
      zero1_resume(c, arg, dir, out);
    else if (scenario == "watchdog")
      watchdog(*group, dir);
    else if (scenario == "calibrate")
      calibrate(c, out);
    else if (scenario == "fault")
      fault(c, arg, dir, out);
    else if (!testing::run_lm_scenario(scenario, c, dir, arg, out))
      QG_FAIL("dist_worker", "unknown scenario '", scenario, "'");
  } catch (const std::exception& e) {
    if (group) group->report_failure(e.what());
    std::ofstream(dir + "/err_r" + std::to_string(rank) + ".txt") << e.what() << '\n';
    std::cerr << "rank " << rank << ": " << e.what() << '\n';
    return 3;
  }
  return 0;
}
