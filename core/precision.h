// Process-wide precision switches of the GPU backend.
//
// allow_tf32: whether f32 GEMMs (matmul, batched_matmul) and convolutions may run on TF32
// tensor cores, like PyTorch's torch.backends.cuda.matmul.allow_tf32 and
// torch.backends.cudnn.allow_tf32. Off by default: TF32 keeps 10 mantissa bits of each
// operand, which breaks the 1e-5 agreement between the CPU and GPU backends and with
// PyTorch's f32 results. It exists so training steps can be timed against PyTorch with TF32
// on both sides. The initial value comes from the environment variable QG_ALLOW_TF32
// ("1" turns it on); set_allow_tf32 changes it for the GEMMs and convolutions run afterwards.
// The CPU backend ignores it.
#pragma once

namespace qg {

bool allow_tf32();
void set_allow_tf32(bool on);

}  // namespace qg
