// causal_attention through cuDNN's fused SDPA (see attention_cudnn.h). The eligibility rules and
// the backend choice compile in every build; the graphs only where CMake found the cuDNN
// frontend, which only this file includes.
#include "ops/attention/attention_cudnn.h"

#include <cstdint>

#include "core/error.h"
#include "ops/attention/attention_backend.h"

namespace qg::cudnn_attention {
namespace {

// The strides cuDNN is given: the tensor's own, except that an axis of extent 1 (never
// stepped, so its stride may be anything, 0 for a broadcast view) takes the stride a packed
// layout would give it, which keeps cuDNN's layout checks and the cache key meaningful.
std::vector<int64_t> dense_strides(const Tensor& t) {
  const Shape& s = t.shape();
  std::vector<int64_t> st(t.strides().begin(), t.strides().end());
  int64_t inner = 1;
  for (size_t a = s.size(); a-- > 0;) {
    if (s[a] == 1) st[a] = inner;
    inner = st[a] * s[a];
  }
  return st;
}

std::string describe(const char* what, size_t i, const Tensor& t) {
  return std::string(what) + " " + std::to_string(i) + " " + shape_str(t.shape()) + " (strides " +
         shape_str(t.strides()) + ")";
}

const char* direction(bool backward) {
  return backward ? "backward" : "forward";
}

}  // namespace

std::string unsupported(const AttentionLayout& a, const std::vector<Tensor>& inputs,
                        const std::vector<Tensor>& outputs) {
  const DType d = inputs.at(0).dtype();
  if (d != DType::bf16 && d != DType::f16)
    return std::string("dtype ") + dtype_name(d) + " (cuDNN's path takes bf16 and f16)";
  if (a.head_dim != 64 && a.head_dim != 128)
    return "head_dim = " + std::to_string(a.head_dim) + " (cuDNN's path takes 64 and 128)";
  // Measured on the H200 with cuDNN 9 (frontend 1.32): the backward graph is refused at build
  // ("s_q = s_kv = 1 is not supported"); a decode-length sequence stays on the project's kernels.
  const bool backward = inputs.size() == 6;
  if (backward && a.seq == 1) return "T = 1 (cuDNN's backward takes no single-token sequence)";
  const int64_t es = static_cast<int64_t>(dtype_size(d));
  for (size_t i = 0; i < inputs.size() + outputs.size(); ++i) {
    const bool is_input = i < inputs.size();
    const Tensor& t = is_input ? inputs[i] : outputs[i - inputs.size()];
    const char* what = is_input ? "input" : "output";
    const size_t at = is_input ? i : i - inputs.size();
    if (reinterpret_cast<uintptr_t>(t.raw_data()) % 16 != 0)
      return describe(what, at, t) + " starts off a 16-byte boundary";
    const std::vector<int64_t> st = dense_strides(t);
    if (t.shape().size() == 3) {  // lse: one f32 per row, rows packed
      if (st[2] != 1) return describe(what, at, t) + " has a seq stride other than 1";
      continue;
    }
    if (st[3] != 1) return describe(what, at, t) + " has a head_dim stride other than 1";
    for (int axis = 0; axis < 3; ++axis) {
      // A broadcast axis (stride 0, k and v shared across the batch) is left to the project's
      // kernels, which are tested on it.
      if (st[axis] == 0) return describe(what, at, t) + " broadcasts an axis (stride 0)";
      if ((st[axis] * es) % 16 != 0)
        return describe(what, at, t) + " has a row stride that is not a multiple of 16 bytes";
    }
  }
  return "";
}

}  // namespace qg::cudnn_attention

#if defined(QG_WITH_CUDNN_FRONTEND)

#include <cudnn_frontend.h>

#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "device/cuda/cuda_check.h"
#include "device/cuda/cuda_context.h"
#include "ops/common/cudnn_handle.h"

namespace qg::cudnn_attention {
namespace {

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// The variant pack's names for the tensors of both graphs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDo, kDq, kDk, kDv };

// A built graph and its workspace, or why cuDNN would not build it.
struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  std::string refusal;
};

using Key = std::vector<int64_t>;

Key key_of(const KernelContext& ctx, const AttentionLayout& a, bool backward, bool deterministic) {
  int64_t scale_bits = 0;
  std::memcpy(&scale_bits, &a.scale, sizeof scale_bits);
  Key k = {ctx.device.device().index,
           backward ? 1 : 0,
           deterministic ? 1 : 0,
           static_cast<int64_t>(ctx.inputs[0].dtype()),
           a.batch,
           a.heads,
           a.kv_heads,
           a.seq,
           a.head_dim,
           scale_bits};
  for (const Tensor& t : ctx.inputs)
    for (int64_t s : dense_strides(t)) k.push_back(s);
  return k;
}

std::vector<int64_t> dims4(const Tensor& t) {
  std::vector<int64_t> d(t.shape().begin(), t.shape().end());
  if (d.size() == 3) d.push_back(1);  // lse as cuDNN's Stats [N, H, T, 1]
  return d;
}

std::vector<int64_t> strides4(const Tensor& t) {
  std::vector<int64_t> s = dense_strides(t);
  if (s.size() == 3) s.push_back(1);
  return s;
}

std::vector<int64_t> packed_strides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (size_t a = dims.size() - 1; a-- > 0;) s[a] = s[a + 1] * dims[a + 1];
  return s;
}

TensorPtr input(fe::graph::Graph& g, const char* name, Uid uid, const Tensor& t) {
  auto attrs =
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims4(t)).set_stride(
          strides4(t));
  if (t.dtype() == DType::f32) attrs.set_data_type(fe::DataType_t::FLOAT);
  return g.tensor(attrs);
}

void output(const TensorPtr& t, Uid uid, const Tensor& like) {
  const std::vector<int64_t> d = dims4(like);
  t->set_output(true).set_uid(uid).set_dim(d).set_stride(packed_strides(d));
  if (like.dtype() == DType::f32) t->set_data_type(fe::DataType_t::FLOAT);
}

std::shared_ptr<fe::graph::Graph> new_graph(DType d) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(d == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

// Causal with the diagonal at the top left: query i sees keys 0..i (T_q = T_kv).
template <typename Attributes>
Attributes& causal(Attributes& attrs, double scale) {
  attrs.set_attn_scale(static_cast<float>(scale))
      .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
      .set_diagonal_band_right_bound(0);
  return attrs;
}

Plan finish(cudnnHandle_t handle, std::shared_ptr<fe::graph::Graph> g) {
  Plan p;
  try {
    fe::error_t st = g->build(handle, {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
    if (st.is_good()) st = g->get_workspace_size(p.workspace);
    if (st.is_bad()) {
      p.refusal = st.get_message();
      return p;
    }
  } catch (const std::exception& e) {  // the frontend throws for a missing library, for one
    p.refusal = e.what();
    return p;
  }
  p.graph = std::move(g);
  return p;
}

Plan build_forward(cudnnHandle_t handle, const KernelContext& ctx, const AttentionLayout& a) {
  auto g = new_graph(ctx.inputs[0].dtype());
  TensorPtr q = input(*g, "q", kQ, ctx.inputs[0]);
  TensorPtr k = input(*g, "k", kK, ctx.inputs[1]);
  TensorPtr v = input(*g, "v", kV, ctx.inputs[2]);
  auto attrs = fe::graph::SDPA_attributes().set_name("causal_attention").set_generate_stats(true);
  auto [o, stats] = g->sdpa(q, k, v, causal(attrs, a.scale));
  output(o, kO, ctx.outputs[0]);
  output(stats, kStats, ctx.outputs[1]);
  return finish(handle, std::move(g));
}

Plan build_backward(cudnnHandle_t handle, const KernelContext& ctx, const AttentionLayout& a,
                    bool deterministic) {
  auto g = new_graph(ctx.inputs[0].dtype());
  TensorPtr q = input(*g, "q", kQ, ctx.inputs[0]);
  TensorPtr k = input(*g, "k", kK, ctx.inputs[1]);
  TensorPtr v = input(*g, "v", kV, ctx.inputs[2]);
  TensorPtr o = input(*g, "o", kO, ctx.inputs[3]);
  TensorPtr stats = input(*g, "lse", kStats, ctx.inputs[4]);
  TensorPtr dout = input(*g, "do", kDo, ctx.inputs[5]);
  auto attrs = fe::graph::SDPA_backward_attributes()
                   .set_name("causal_attention_backward")
                   .set_deterministic_algorithm(deterministic);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, causal(attrs, a.scale));
  output(dq, kDq, ctx.outputs[0]);
  output(dk, kDk, ctx.outputs[1]);
  output(dv, kDv, ctx.outputs[2]);
  return finish(handle, std::move(g));
}

// Built once per key for the process (a plan runs on any handle of its device); a refusal is
// kept as well, so `auto` does not ask cuDNN again for the same call.
std::shared_ptr<const Plan> cached_plan(const Key& key, const std::function<Plan()>& build) {
  static std::mutex mu;
  static std::map<Key, std::shared_ptr<const Plan>> plans;
  std::lock_guard<std::mutex> lock(mu);
  auto it = plans.find(key);
  if (it != plans.end()) return it->second;
  auto p = std::make_shared<const Plan>(build());
  plans.emplace(key, p);
  return p;
}

std::string shape_of(const AttentionLayout& a) {
  return "[N " + std::to_string(a.batch) + ", H " + std::to_string(a.heads) + ", KV " +
         std::to_string(a.kv_heads) + ", T " + std::to_string(a.seq) + ", hd " +
         std::to_string(a.head_dim) + "]";
}

// The op's definition: row 0 sees one key, so ds_00 = 0 and dq's row 0 is zero. cuDNN leaves
// rounding noise there, which this overwrites. (T = 1, where that term is all of dk, never
// reaches cuDNN's backward: see unsupported.)
void zero_single_key_terms(const KernelContext& ctx, const AttentionLayout& a, cudaStream_t s) {
  const Tensor& dq = ctx.outputs[0];
  const size_t row = static_cast<size_t>(a.head_dim) * dtype_size(dq.dtype());
  QG_CUDA_CHECK(ctx.op, cudaMemset2DAsync(dq.raw_data(), row * static_cast<size_t>(a.seq), 0, row,
                                          static_cast<size_t>(a.batch * a.heads), s));
}

bool run(KernelContext& ctx, const AttentionLayout& a, bool backward, bool required) {
  DeviceContext& dc = ctx.device;
  cudnnHandle_t handle = cudnn_handle(dc);
  const bool deterministic = backward && attention_deterministic(ctx.op);
  std::shared_ptr<const Plan> plan = cached_plan(key_of(ctx, a, backward, deterministic), [&] {
    return backward ? build_backward(handle, ctx, a, deterministic) : build_forward(handle, ctx, a);
  });
  if (!plan->graph) {
    QG_CHECK(!required, ctx.op, "QG_ATTENTION_BACKEND=cudnn, but cuDNN refused the ",
             direction(backward), " graph for ", dtype_name(ctx.inputs[0].dtype()), " ",
             shape_of(a), ": ", plan->refusal);
    return false;
  }
  std::unordered_map<int64_t, void*> pack;
  const Uid in_uids[] = {kQ, kK, kV, kO, kStats, kDo};
  for (size_t i = 0; i < ctx.inputs.size(); ++i) pack[in_uids[i]] = ctx.inputs[i].raw_data();
  const Uid fwd_out[] = {kO, kStats}, bwd_out[] = {kDq, kDk, kDv};
  for (size_t i = 0; i < ctx.outputs.size(); ++i)
    pack[backward ? bwd_out[i] : fwd_out[i]] = ctx.outputs[i].raw_data();
  // From the caller's allocator: a StaticRun serves it from its scratch pool, so the call can
  // be captured in a CUDA graph.
  Tensor workspace;
  if (plan->workspace > 0)
    workspace = Tensor::empty({plan->workspace}, DType::u8, ctx.inputs[0].device());
  fe::error_t st =
      plan->graph->execute(handle, pack, workspace.defined() ? workspace.raw_data() : nullptr);
  QG_CHECK(st.is_good(), ctx.op, "cuDNN's fused attention ", direction(backward), " failed for ",
           dtype_name(ctx.inputs[0].dtype()), " ", shape_of(a), ": ", st.get_message());
  if (backward) zero_single_key_terms(ctx, a, cuda_stream(dc));
  return true;
}

}  // namespace

bool built() {
  return true;
}

}  // namespace qg::cudnn_attention

#else  // built without the cuDNN frontend: the project's kernels are the only ones.

namespace qg::cudnn_attention {
namespace {

bool run(KernelContext& ctx, const AttentionLayout&, bool, bool) {
  QG_FAIL(ctx.op, "this build has no cuDNN frontend");
}

}  // namespace

bool built() {
  return false;
}

}  // namespace qg::cudnn_attention

#endif

namespace qg::cudnn_attention {
namespace {

bool dispatch(KernelContext& ctx, const AttentionLayout& a, bool backward) {
  const AttentionBackend b = attention_backend(ctx.op);
  if (b == AttentionBackend::kernel) return false;
  const bool required = b == AttentionBackend::cudnn;
  const std::string why = built() ? unsupported(a, ctx.inputs, ctx.outputs)
                                  : "this build has no cuDNN frontend (configure found none)";
  if (!why.empty()) {
    QG_CHECK(!required, ctx.op, "QG_ATTENTION_BACKEND=cudnn, but cuDNN cannot take this ",
             direction(backward), ": ", why);
    return false;
  }
  return run(ctx, a, backward, required);
}

}  // namespace

bool forward(KernelContext& ctx, const AttentionLayout& a) {
  return dispatch(ctx, a, false);
}

bool backward(KernelContext& ctx, const AttentionLayout& a) {
  return dispatch(ctx, a, true);
}

}  // namespace qg::cudnn_attention
