// The element expressions of the activation backward ops on CUDA (dx = f(dy, x)), shared by
// their own kernels (activation_cuda.cu) and by the fused STE + activation backward
// (ops/fused/ste_backward/ste_backward_cuda.cu), so a fused node computes exactly what the two
// unfused nodes compute.
#pragma once

#include "ops/activation/activation_math.h"

namespace qg::cuda {

struct ReluBackwardF {
  template <typename M>
  __device__ M operator()(M dy, M x) const {
    return x > 0 ? dy : M(0);
  }
};
struct GeluErfBackwardF {
  template <typename M>
  __device__ M operator()(M dy, M x) const {
    return dy * act::gelu_erf_grad(x);
  }
};
struct GeluTanhBackwardF {
  template <typename M>
  __device__ M operator()(M dy, M x) const {
    return dy * act::gelu_tanh_grad(x);
  }
};
struct SiluBackwardF {
  template <typename M>
  __device__ M operator()(M dy, M x) const {
    return dy * act::silu_grad(x);
  }
};

}  // namespace qg::cuda
