// NumPy .npy files: the exchange format of `qat op` and the conformance suite.
#pragma once

#include <string>
#include <string_view>

#include "core/tensor.h"

namespace qg {

/// Reads a .npy file (format 1.0, 2.0 or 3.0) into a CPU tensor. Accepts little-endian
/// f32, f64, f16, i8, u8, i32, i64 and bool ('|b1') in C order. Anything else (another
/// dtype, big-endian data, Fortran order, a bad magic string, a malformed header, truncated
/// or surplus data) throws qg::Error with op "npy", naming the file and the problem.
Tensor load_npy(const std::string& path);

/// The same from the bytes of a whole .npy file in memory (an .npz member, a fuzz input);
/// `what` names the source in error messages.
Tensor parse_npy(std::string_view bytes, const std::string& what);

/// Writes a CPU tensor as a .npy file (format 1.0, or 2.0 when the header needs it). The
/// file is written to a temporary name in the same directory and renamed into place, so a
/// reader never sees a half-written file. bf16 has no NumPy dtype and is rejected.
void save_npy(const std::string& path, const Tensor& tensor);

/// The NumPy type string ('<f4', '|u1', ...) of a dtype; throws for bf16.
std::string npy_descr(DType dtype);

}  // namespace qg
