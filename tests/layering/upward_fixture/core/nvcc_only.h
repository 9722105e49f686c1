// A fixture of the layering test: CUDA headers that only nvcc sees are allowed in core (the
// check must not count these lines).
#pragma once

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif
