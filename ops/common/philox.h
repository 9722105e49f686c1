// Philox-4x32-10, the counter-based generator of Salmon, Moraes, Dror and Shaw, "Parallel
// random numbers: as easy as 1, 2, 3" (SC 2011), written from its published definition and
// shared verbatim by the CPU and CUDA kernels, so both backends draw the same bits.
//
// One call maps a 128-bit counter and a 64-bit key to 128 random bits: ten rounds of
//   (c0, c1, c2, c3) -> (hi(M1 * c2) ^ c1 ^ k0, lo(M1 * c2), hi(M0 * c0) ^ c3 ^ k1, lo(M0 * c0))
// with the key bumped by the Weyl constants (W0, W1) between rounds.
// Keep this header free of Eigen and of the standard library beyond <cstdint>.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define QG_PHILOX_HD __host__ __device__ __forceinline__
#else
#define QG_PHILOX_HD inline
#endif

namespace qg::philox {

struct Words {
  uint32_t v[4];
};

constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;

QG_PHILOX_HD Words philox4x32_10(Words c, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c.v[0];
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c.v[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c.v[0] = hi1 ^ c.v[1] ^ k0;
    c.v[1] = lo1;
    c.v[2] = hi0 ^ c.v[3] ^ k1;
    c.v[3] = lo0;
  }
  return c;
}

// The 32 random bits of element i in run `step` under `seed`: elements 4j .. 4j + 3 share the
// counter (j, step) and take its four output words in order; the key is the seed.
QG_PHILOX_HD uint32_t element_bits(uint64_t seed, uint64_t step, uint64_t i) {
  const uint64_t j = i >> 2;
  Words c = {{static_cast<uint32_t>(j), static_cast<uint32_t>(j >> 32), static_cast<uint32_t>(step),
              static_cast<uint32_t>(step >> 32)}};
  return philox4x32_10(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)).v[i & 3];
}

// Dropout's keep rule: drop when the 32 bits fall below threshold = floor(p * 2^32), so the
// drop probability is threshold / 2^32 (p to within 2^-32). An integer comparison: exact on
// both backends.
QG_PHILOX_HD uint64_t drop_threshold(double p) {
  return static_cast<uint64_t>(p * 4294967296.0);
}
QG_PHILOX_HD uint8_t keep_bit(uint64_t seed, uint64_t step, uint64_t i, uint64_t threshold) {
  return static_cast<uint64_t>(element_bits(seed, step, i)) >= threshold ? 1 : 0;
}

}  // namespace qg::philox
