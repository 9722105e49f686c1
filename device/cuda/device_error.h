// Runtime validation inside kernels. A kernel cannot throw, so a failed check (a scale <= 0,
// a zero point out of range, a label out of range) is recorded in one small device buffer of
// the kernel's DeviceContext: the first failure wins, with its code, the node, the element
// index and the offending value.
// The backend reads the buffer once at the end of Executor::run (the step's only host sync)
// and turns it into a qg::Error naming the op and the value, as the CPU kernels would.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace qg {
class Graph;
}

namespace qg::cuda {

enum DeviceErrorCode : int32_t {
  kNoDeviceError = 0,
  kBadScale = 1,            // value = scale[index]; must be positive and finite
  kBadZeroPoint = 2,        // value = zero_point[index]; must lie in [lo, hi]
  kLabelOutOfRange = 3,     // value = labels[index]; must lie in [0, hi)
  kBadGroupSize = 4,        // value = the offending size; generic range failure in [lo, hi]
  kValueOutOfRange = 5,     // value = input[index]; must lie in [lo, hi]
  kNonFiniteZeroPoint = 6,  // value = zero_point[index]; a learnable zero point must be finite
  kAffineOverflow = 7,      // scope `index` has range [lo, hi] too wide for an f32 scale
  kBadAbsmax = 8,           // value = absmax[index]; must be finite and >= 0
  kIndexOutOfRange = 9,     // value = indices[index]; must lie in [0, hi) (embedding rows)
  kNonFiniteGradNorm = 10,  // value = the total gradient norm (or grad_scale); must be finite
  kBadLearningRate = 11,    // value = the learning rate; must be finite and >= 0
  kPeerTimeout = 12,        // value = the rank whose statistics never came (peer_mailbox.h;
                            // -1: an earlier exchange had timed out), index = the
                            // exchange, hi = the wait in seconds
};

struct DeviceErrorRecord {
  int32_t code;
  int32_t node;
  int64_t index;
  double value;
  double lo;
  double hi;
};

// Reads `record` after synchronising `stream`; when set, clears it and throws qg::Error
// naming the node's op and name (looked up in `graph`, when given) and the value. Each
// DeviceContext owns one record (DeviceContext::check_errors calls this).
void check_device_errors(DeviceErrorRecord* record, cudaStream_t stream, const Graph* graph);

// Formats a record as the CPU kernels word the same failure (exposed for tests).
std::string describe_device_error(const DeviceErrorRecord& r);

#if defined(__CUDACC__)
// First failure wins: later ones (often the same failure seen by many threads) are dropped.
__device__ __forceinline__ void report_device_error(DeviceErrorRecord* rec, int32_t code,
                                                    int32_t node, int64_t index, double value,
                                                    double lo = 0, double hi = 0) {
  if (atomicCAS(&rec->code, 0, -1) == 0) {
    rec->node = node;
    rec->index = index;
    rec->value = value;
    rec->lo = lo;
    rec->hi = hi;
    __threadfence();
    atomicExch(&rec->code, code);
  }
}
#endif

}  // namespace qg::cuda
