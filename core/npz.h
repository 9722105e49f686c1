// NumPy .npz files: a ZIP archive of .npy members, stored (numpy.savez) or deflated
// (numpy.savez_compressed).
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "core/tensor.h"

namespace qg {

/// Reads every member of an .npz file; the keys are the member names without ".npy". The
/// central directory, every offset and size (against the file length), the compression
/// method, the inflated size and the CRC-32 are checked, and each member is parsed with
/// parse_npy. ZIP64 sizes and offsets in a central-directory entry are understood; a ZIP64
/// end-of-central-directory record (over 65535 members or a 4 GiB directory) and encrypted
/// or multi-disk archives are a qg::Error with op "npz" naming the file and the member.
std::map<std::string, Tensor> load_npz(const std::string& path);

/// The same from the bytes of a whole file in memory; `what` names it in error messages.
std::map<std::string, Tensor> parse_npz(std::string_view bytes, const std::string& what);

}  // namespace qg
