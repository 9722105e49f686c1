// QG_HOST_DEVICE marks a small function that host and device code both call: under nvcc it
// is __host__ __device__ and always inlined, under a plain C++ compiler just inline, so a
// core header that uses it never needs a CUDA header.
#pragma once

#if defined(__CUDACC__)
#define QG_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define QG_HOST_DEVICE inline
#endif
