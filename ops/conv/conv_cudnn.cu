// conv2d through cuDNN's convolution API (see conv_cudnn.h). One handle per DeviceContext,
// bound to its stream. Algorithms come from cuDNN's heuristics (the choice
// PyTorch makes with cudnn.benchmark off), cached per geometry and dtype; among the
// candidates that fit the workspace limit a deterministic one is preferred, so a repeated
// step gives the same bits. Workspace is a Tensor::empty on the device, which a StaticRun
// serves from its scratch pool, so the calls can be captured in a CUDA graph.
#include "ops/conv/conv_cudnn.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

#ifdef QG_WITH_CUDNN
#include <cudnn.h>

#include <map>
#include <mutex>
#include <tuple>

#include "ops/common/cudnn_handle.h"

namespace qg::cudnn_conv {
namespace {

// Large enough for the fast algorithms of the layers this project trains; a candidate that
// needs more is skipped (the heuristics always offer one that needs little or none).
constexpr size_t kWorkspaceLimit = size_t{512} << 20;

cudnnDataType_t data_type(const char* op, DType d) {
  switch (d) {
    case DType::f32:
      return CUDNN_DATA_FLOAT;
    case DType::f64:
      return CUDNN_DATA_DOUBLE;
    case DType::f16:
      return CUDNN_DATA_HALF;
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    default:
      QG_FAIL(op, "cuDNN convolution does not take ", dtype_name(d));
  }
}

// Half types accumulate in f32; f32 and f64 in their own type.
cudnnDataType_t compute_type(DType d) {
  return d == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
}

int to_int(const char* op, int64_t v) {
  QG_CHECK(v >= 0 && v <= INT32_MAX, op, "dimension ", v, " does not fit cuDNN's int");
  return static_cast<int>(v);
}

// The four descriptors of one convolution, destroyed with the object.
struct Descriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  const char* op;

  Descriptors(const char* op_name, const Geometry& g, DType dtype, bool allow_tf32) : op(op_name) {
    cudnnDataType_t t = data_type(op, dtype);
    QG_CUDNN_CHECK(op, cudnnCreateTensorDescriptor(&x));
    QG_CUDNN_CHECK(op, cudnnCreateTensorDescriptor(&y));
    QG_CUDNN_CHECK(op, cudnnCreateTensorDescriptor(&bias));
    QG_CUDNN_CHECK(op, cudnnCreateFilterDescriptor(&w));
    QG_CUDNN_CHECK(op, cudnnCreateConvolutionDescriptor(&conv));
    QG_CUDNN_CHECK(
        op, cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, t, to_int(op, g.n), to_int(op, g.c),
                                       to_int(op, g.h), to_int(op, g.w)));
    QG_CUDNN_CHECK(
        op, cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, t, to_int(op, g.n), to_int(op, g.o),
                                       to_int(op, g.ho), to_int(op, g.wo)));
    QG_CUDNN_CHECK(
        op, cudnnSetTensor4dDescriptor(bias, CUDNN_TENSOR_NCHW, t, 1, to_int(op, g.o), 1, 1));
    QG_CUDNN_CHECK(op, cudnnSetFilter4dDescriptor(w, t, CUDNN_TENSOR_NCHW, to_int(op, g.o),
                                                  to_int(op, g.c / g.groups), to_int(op, g.kh),
                                                  to_int(op, g.kw)));
    QG_CUDNN_CHECK(
        op, cudnnSetConvolution2dDescriptor(
                conv, to_int(op, g.ph), to_int(op, g.pw), to_int(op, g.sh), to_int(op, g.sw),
                to_int(op, g.dh), to_int(op, g.dw), CUDNN_CROSS_CORRELATION, compute_type(dtype)));
    QG_CUDNN_CHECK(op, cudnnSetConvolutionGroupCount(conv, to_int(op, g.groups)));
    // FMA math: no TF32 for f32 (PyTorch's allow_tf32 = False) unless the context's
    // precision flags allow it (tensor-op math, as PyTorch with allow_tf32 = True); tensor cores
    // stay allowed for the half types, which is what they are for.
    bool tensor_ops =
        dtype == DType::f16 || dtype == DType::bf16 || (dtype == DType::f32 && allow_tf32);
    QG_CUDNN_CHECK(
        op, cudnnSetConvolutionMathType(conv, tensor_ops ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH));
  }
  ~Descriptors() {
    cudnnDestroyTensorDescriptor(x);
    cudnnDestroyTensorDescriptor(y);
    cudnnDestroyTensorDescriptor(bias);
    cudnnDestroyFilterDescriptor(w);
    cudnnDestroyConvolutionDescriptor(conv);
  }
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
};

// The key holds the TF32 setting: the heuristic's best algorithm depends on the math type.
using Key = std::tuple<int, bool, DType, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;
Key key_of(int direction, const Geometry& g, DType d, bool allow_tf32) {
  return {direction, allow_tf32, d,    g.n,  g.c,  g.h,  g.w,  g.o,     g.kh,
          g.kw,      g.sh,       g.sw, g.ph, g.pw, g.dh, g.dw, g.groups};
}

struct Choice {
  int algo = 0;
  size_t workspace = 0;
};

// Picks among heuristic candidates (best first): the first deterministic one that fits the
// workspace limit, else the first that fits.
template <typename Perf>
Choice pick(const char* op, const Perf* perf, int count) {
  const Perf* fallback = nullptr;
  for (int i = 0; i < count; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > kWorkspaceLimit) continue;
    if (perf[i].determinism == CUDNN_DETERMINISTIC)
      return {static_cast<int>(perf[i].algo), perf[i].memory};
    if (fallback == nullptr) fallback = &perf[i];
  }
  QG_CHECK(fallback != nullptr, op, "cuDNN offers no convolution algorithm within ",
           kWorkspaceLimit >> 20, " MiB of workspace");
  return {static_cast<int>(fallback->algo), fallback->memory};
}

// Heuristic algorithm choice, cached: the host-side query runs once per shape, so a
// captured CUDA graph never contains it.
template <typename Query>
Choice cached_choice(const Key& key, Query query) {
  static std::mutex mu;
  static std::map<Key, Choice> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  Choice c = query();
  cache.emplace(key, c);
  return c;
}

// Scalars for alpha/beta: double for f64 tensors, float otherwise (cuDNN's rule).
struct Scalars {
  double d1 = 1, d0 = 0;
  float f1 = 1, f0 = 0;
  bool dbl;
  explicit Scalars(DType t) : dbl(t == DType::f64) {}
  const void* one() const { return dbl ? static_cast<const void*>(&d1) : &f1; }
  const void* zero() const { return dbl ? static_cast<const void*>(&d0) : &f0; }
};

void* workspace(const Tensor& like, size_t bytes, Tensor& holder) {
  if (bytes == 0) return nullptr;
  holder = Tensor::empty({static_cast<int64_t>(bytes)}, DType::u8, like.device());
  return holder.raw_data();
}

// One convolution call: the handle on the caller's stream, the descriptors, the cached
// algorithm choice (query: cuDNN's heuristic for this direction), the workspace, then `call`.
template <typename Perf, int kCount, typename Query, typename Call>
void convolve(const char* op, int direction, const Geometry& g, const Tensor& like,
              DeviceContext& context, Query query, Call call) {
  cudnnHandle_t h = cudnn_handle(context);
  const bool tf32 = context.allow_tf32();
  Descriptors d(op, g, like.dtype(), tf32);
  Choice c = cached_choice(key_of(direction, g, like.dtype(), tf32), [&] {
    Perf perf[kCount];
    int n = 0;
    QG_CUDNN_CHECK(op, query(h, d, kCount, &n, perf));
    return pick(op, perf, n);
  });
  Tensor holder;
  void* ws = workspace(like, c.workspace, holder);
  Scalars s(like.dtype());
  QG_CUDNN_CHECK(op, call(h, d, c, ws, s));
}

}  // namespace

bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("QG_CONV_BACKEND");
    return v == nullptr || std::strcmp(v, "im2col") != 0;
  }();
  return on;
}

void forward(const char* op, const Geometry& g, const Tensor& x, const Tensor& w,
             const Tensor* bias, Tensor& y, DeviceContext& context) {
  convolve<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT>(
      op, 0, g, x, context,
      [](cudnnHandle_t h, const Descriptors& d, int count, int* n, auto* perf) {
        return cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, count, n, perf);
      },
      [&](cudnnHandle_t h, const Descriptors& d, const Choice& c, void* ws, const Scalars& s) {
        cudnnStatus_t st =
            cudnnConvolutionForward(h, s.one(), d.x, x.raw_data(), d.w, w.raw_data(), d.conv,
                                    static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), ws, c.workspace,
                                    s.zero(), d.y, y.raw_data());
        if (st != CUDNN_STATUS_SUCCESS || bias == nullptr || !bias->defined()) return st;
        return cudnnAddTensor(h, s.one(), d.bias, bias->raw_data(), s.one(), d.y, y.raw_data());
      });
}

void backward_data(const char* op, const Geometry& g, const Tensor& dy, const Tensor& w, Tensor& dx,
                   DeviceContext& context) {
  convolve<cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT>(
      op, 1, g, dy, context,
      [](cudnnHandle_t h, const Descriptors& d, int count, int* n, auto* perf) {
        return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x, count, n,
                                                           perf);
      },
      [&](cudnnHandle_t h, const Descriptors& d, const Choice& c, void* ws, const Scalars& s) {
        return cudnnConvolutionBackwardData(h, s.one(), d.w, w.raw_data(), d.y, dy.raw_data(),
                                            d.conv,
                                            static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo), ws,
                                            c.workspace, s.zero(), d.x, dx.raw_data());
      });
}

void backward_filter(const char* op, const Geometry& g, const Tensor& dy, const Tensor& x,
                     Tensor& dw, DeviceContext& context) {
  convolve<cudnnConvolutionBwdFilterAlgoPerf_t, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT>(
      op, 2, g, dy, context,
      [](cudnnHandle_t h, const Descriptors& d, int count, int* n, auto* perf) {
        return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x, d.y, d.conv, d.w, count, n,
                                                             perf);
      },
      [&](cudnnHandle_t h, const Descriptors& d, const Choice& c, void* ws, const Scalars& s) {
        return cudnnConvolutionBackwardFilter(h, s.one(), d.x, x.raw_data(), d.y, dy.raw_data(),
                                              d.conv,
                                              static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo),
                                              ws, c.workspace, s.zero(), d.w, dw.raw_data());
      });
}

}  // namespace qg::cudnn_conv

#else  // built without cuDNN: the im2col + cuBLAS path is the only one.

namespace qg::cudnn_conv {

bool enabled() {
  return false;
}

void forward(const char* op, const Geometry&, const Tensor&, const Tensor&, const Tensor*, Tensor&,
             DeviceContext&) {
  QG_FAIL(op, "this build has no cuDNN (configure found none)");
}
void backward_data(const char* op, const Geometry&, const Tensor&, const Tensor&, Tensor&,
                   DeviceContext&) {
  QG_FAIL(op, "this build has no cuDNN (configure found none)");
}
void backward_filter(const char* op, const Geometry&, const Tensor&, const Tensor&, Tensor&,
                     DeviceContext&) {
  QG_FAIL(op, "this build has no cuDNN (configure found none)");
}

}  // namespace qg::cudnn_conv

#endif
