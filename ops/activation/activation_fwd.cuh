// The element expressions of the activation forward ops on CUDA (y = f(x), called as f(x, x)
// by the binary map kernel), shared by their own kernels (activation_cuda.cu) and by the
// fused observer + fake-quantize node that applies the activation as it loads x
// (ops/fused/observe_quantize/cuda_activation_prologue.cu), so both round exactly the same way.
#pragma once

#include "ops/activation/activation_math.h"

namespace qg::cuda {

struct ReluF {
  template <typename M>
  __device__ M operator()(M v, M) const {
    return v > 0 ? v : (v != v ? v : M(0));  // NaN propagates, -0 becomes +0
  }
};
struct GeluErfF {
  template <typename M>
  __device__ M operator()(M x, M) const {
    return act::gelu_erf(x);
  }
};
struct GeluTanhF {
  template <typename M>
  __device__ M operator()(M x, M) const {
    return act::gelu_tanh(x);
  }
};
struct SiluF {
  template <typename M>
  __device__ M operator()(M x, M) const {
    return act::silu(x);
  }
};

}  // namespace qg::cuda
