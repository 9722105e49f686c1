// The arithmetic of rope that the CPU and CUDA kernels share. Llama's rotary embedding as
// transformers computes it (LlamaRotaryEmbedding + apply_rotary_pos_emb), for x of dtype T
// with math type M (f32 for f16/bf16/f32, f64 for f64), head_dim D, half = D / 2:
//   inv_freq_i = 1 / f32(theta ^ (f32(2i) / D))     in f32, i < half (theta as f32)
//   angle      = f32(position) * inv_freq_i         in f32
//   c, s       = T(f32(cos(angle))), T(f32(sin(angle)))  (cat(freqs, freqs): element j
//                                                          and j + half share angle i = j)
//   y_j        = T(T(x_j * c) + T(-x_{j+half} * s))       j < half
//   y_{j+half} = T(T(x_{j+half} * c) + T(x_j * s))        (x * cos + rotate_half(x) * sin)
// Every product and the sum round to T, as torch's ops on T do. The power and cos/sin are
// evaluated in f64 and rounded to f32 once (correctly rounded but for the rarest ties; torch
// 1.13's vectorised f32 cos/sin/pow are within an ulp of these). The inverse rotation (the
// backward: the transpose of a rotation) uses -s; its roundings are those of torch's
// autograd of the forward, T(T(dy_j * c) + T(dy_{j+half} * s)) and
// T(T(dy_{j+half} * c) - T(dy_j * s)), since T(-v) = -T(v).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"
#include "ops/rope/rope_args.h"

namespace qg::rope_math {

// f32(cos(a)) and f32(sin(a)) of an f32 angle, through f64.
QG_HOST_DEVICE float cos_f32(float a) {
  return static_cast<float>(cos(static_cast<double>(a)));
}
QG_HOST_DEVICE float sin_f32(float a) {
  return static_cast<float>(sin(static_cast<double>(a)));
}

// The angle of frequency i at an integer position: f32(position) * inv_freq_i in f32.
QG_HOST_DEVICE float angle_of(int64_t position, float inv_freq) {
  return static_cast<float>(position) * inv_freq;
}

// Fills layout.inv_freq[0, dim / 2) (host).
inline void fill_inv_freq(RopeLayout& layout, double theta) {
  const int64_t half = layout.dim / 2;
  const float base = static_cast<float>(theta);
  for (int64_t i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(layout.dim);
    const float p = static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(e)));
    layout.inv_freq[i] = 1.0f / p;
  }
}

}  // namespace qg::rope_math
