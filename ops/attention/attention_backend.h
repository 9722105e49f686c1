// Which implementation runs causal_attention and its backward on CUDA, chosen at run time so
// that one build can time cuDNN's fused attention against this project's kernels:
//   QG_ATTENTION_BACKEND unset, empty or "auto": cuDNN where the build has it and the call
//                        fits it (attention_cudnn.h), else the project's kernels;
//   "cudnn":  cuDNN only; a call it cannot take is a qg::Error saying why (no silent fallback,
//             so a benchmark or test knows what it measured);
//   "kernel": the project's kernels (attention_forward*.cu, attention_backward*.cu) only.
//   QG_ATTENTION_DETERMINISTIC=0 lets cuDNN's backward accumulate dq with atomics (faster,
//   not bit-reproducible run to run); unset or 1 keeps it deterministic, as the project's
//   kernels are.
// Both are read at every call (a kernel call, not a replay of a captured CUDA graph, which keeps
// what it captured), so a process can switch between them, as the attention benchmark does.
#pragma once

#include <string>

namespace qg {

enum class AttentionBackend { automatic, cudnn, kernel };

// The backend QG_ATTENTION_BACKEND names; qg::Error naming `op` and the value for any other.
AttentionBackend attention_backend(const std::string& op);
// The same for a given value (null: unset).
AttentionBackend parse_attention_backend(const std::string& op, const char* value);
const char* attention_backend_name(AttentionBackend b);

// Whether cuDNN's backward must be deterministic (QG_ATTENTION_DETERMINISTIC, default on);
// qg::Error naming `op` for a value other than 0 or 1.
bool attention_deterministic(const std::string& op);

}  // namespace qg
