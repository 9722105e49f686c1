// safetensors files: an 8-byte little-endian header length N, N bytes of UTF-8 JSON mapping
// each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to
// the data buffer that follows the header) plus an optional "__metadata__" object of
// string -> string, then the data buffer.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "core/tensor.h"

namespace qg {

/// Reads a safetensors file into CPU tensors keyed by name. Dtypes: F32, F16, BF16, I64,
/// and also F64, I32, I8, U8, BOOL (the other qatgraph dtypes). Everything is validated
/// before any data is copied; a bad file throws qg::Error with op "safetensors" naming the
/// file, the tensor and the values. `metadata`, when given, receives "__metadata__".
std::map<std::string, Tensor> load_safetensors(
    const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

/// The same from the bytes of a whole file in memory; `what` names it in error messages.
std::map<std::string, Tensor> parse_safetensors(
    std::string_view bytes, const std::string& what,
    std::map<std::string, std::string>* metadata = nullptr);

/// The bytes of a safetensors file holding `tensors` (in name order, the header padded with
/// spaces to a multiple of 8 bytes so the data buffer is 8-byte aligned).
std::string encode_safetensors(const std::map<std::string, Tensor>& tensors,
                               const std::map<std::string, std::string>& metadata = {});

/// Writes encode_safetensors() to a temporary file next to `path` and renames it into place.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// The safetensors dtype name ("F32", "BF16", ...) of a qatgraph dtype.
const char* safetensors_dtype_name(DType dtype);

}  // namespace qg
