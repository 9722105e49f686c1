// Tensor-core pieces of the bf16/f16 causal attention kernels: mma.sync m16n8k16 with f32
// accumulation, ldmatrix (transposed) for the B operand of P V, and 16-byte staging of
// [rows, hd] tiles into shared memory rows padded by 16 bytes (so the 32-bit fragment loads
// and the 8 row addresses of an ldmatrix hit distinct banks).
//
// Fragment layouts of m16n8k16 (g = lane / 4, t = lane % 4):
//   A 16x16: a0 (row g, cols 2t, 2t+1), a1 (row g+8, same), a2 (row g, cols 2t+8, 2t+9),
//            a3 (row g+8, same); two 16-bit values per register, the lower column low.
//   B 16x8:  b0 (rows 2t, 2t+1, col g), b1 (rows 2t+8, 2t+9, col g).
//   C 16x8:  c0, c1 (row g, cols 2t, 2t+1), c2, c3 (row g+8, same), f32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "ops/common/cuda_common.cuh"

namespace qg::cuda::attention {

template <typename T>
constexpr bool kHasMma = std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Four 8x8 b16 matrices, transposed: lanes 8m .. 8m + 7 give the row addresses of matrix m,
// and register m of lane (g, t) holds matrix m's elements (2t, g) and (2t + 1, g).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <typename T>
__device__ __forceinline__ uint32_t ld32(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

template <typename T>
__device__ __forceinline__ uint32_t bits16(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat16_as_ushort(v);
  else
    return __half_as_ushort(v);
}

// Two f32 values rounded to T (as the CPU rounds) in one register, `lo` in the low half.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  return bits16(from_math<T>(lo)) | (bits16(from_math<T>(hi)) << 16);
}

// Rows [row0, row0 + rows) of a [seq, hd] 16-bit matrix whose rows lie `src_stride` elements
// apart into a tile of row stride `stride` (elements, a multiple of 8), 16 bytes at a time,
// zero past seq. src and src_stride must keep every row on a 16-byte boundary
// (check_vector_aligned). The whole block takes part.
template <typename T>
__device__ __forceinline__ void stage16(T* tile, int stride, const T* src, int64_t src_stride,
                                        int64_t row0, int rows, int hd, int64_t seq) {
  const int chunks = hd / 8;
  for (int e = threadIdx.x; e < rows * chunks; e += blockDim.x) {
    const int r = e / chunks, c = (e % chunks) * 8;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (row0 + r < seq) val = *reinterpret_cast<const uint4*>(src + (row0 + r) * src_stride + c);
    *reinterpret_cast<uint4*>(tile + r * stride + c) = val;
  }
}

}  // namespace qg::cuda::attention
