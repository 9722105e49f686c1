// Contiguous-group code loop of the CPU nf4_quantize_pack kernel (groups along the last
// axis; their absmax comes from int4_cpu::finite_absmax). The scalar template is the
// reference (and the f64 path and the SIMD head and tail); the f32/bf16/f16 overloads use
// SSE4.1 where the build has it and give the same bytes (tests/ops_nf4 compares them).
#pragma once

#include <cstdint>

#include "core/half.h"
#include "ops/int4/int4_math.h"
#include "ops/nf4/nf4_math.h"

namespace qg::nf4_cpu {

// ORs the NF4 codes of x[0, n), flat elements first .. first + n - 1, into `packed`.
template <typename T, typename M = math_t<T>>
void encode_pack_scalar(const T* x, int64_t n, int64_t first, M inv_absmax, bool high_first,
                        uint8_t* packed) {
  for (int64_t j = 0; j < n; ++j) {
    const int64_t k = first + j;
    uint8_t c = nf4::encode<M>(static_cast<M>(x[j]), inv_absmax);
    packed[k >> 1] |= static_cast<uint8_t>(c << int4::nibble_shift(k, high_first));
  }
}

// The SIMD versions: the bytes they cover must be 0 on entry; bytes whose two nibbles both
// lie in the run may be stored rather than OR-ed.
void encode_pack(const float* x, int64_t n, int64_t first, float inv_absmax, bool high_first,
                 uint8_t* packed);
void encode_pack(const bf16* x, int64_t n, int64_t first, float inv_absmax, bool high_first,
                 uint8_t* packed);
void encode_pack(const f16* x, int64_t n, int64_t first, float inv_absmax, bool high_first,
                 uint8_t* packed);
inline void encode_pack(const double* x, int64_t n, int64_t first, double inv_absmax,
                        bool high_first, uint8_t* packed) {
  encode_pack_scalar(x, n, first, inv_absmax, high_first, packed);
}

}  // namespace qg::nf4_cpu
