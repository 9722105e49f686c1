#include <sstream>

#include "core/error.h"
#include "core/graph.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/device_error.h"

namespace qg::cuda {

std::string describe_device_error(const DeviceErrorRecord& r) {
  std::ostringstream os;
  switch (r.code) {
    case kBadScale:
      os << "scale[" << r.index << "] = " << r.value << " must be positive and finite";
      break;
    case kBadZeroPoint:
      os << "zero_point[" << r.index << "] = " << r.value
         << " is outside [quant_min, quant_max] = [" << r.lo << ", " << r.hi << "]";
      break;
    case kNonFiniteZeroPoint:
      os << "zero_point[" << r.index << "] = " << r.value << " must be finite";
      break;
    case kAffineOverflow:
      os << "scope " << r.index << " has range [" << r.lo << ", " << r.hi
         << "] whose width overflows f32; the affine scale is not finite";
      break;
    case kBadAbsmax:
      os << "absmax[" << r.index << "] = " << r.value << " must be finite and >= 0";
      break;
    case kLabelOutOfRange:
      os << "labels[" << r.index << "] = " << r.value << " is outside [0, " << r.hi << ")";
      break;
    case kIndexOutOfRange:
      os << "indices[" << r.index << "] = " << r.value << " is outside [0, " << r.hi
         << ") (the weight has " << r.hi << " rows)";
      break;
    case kNonFiniteGradNorm:
      os << "the total gradient norm is " << r.value
         << " (not finite), so it cannot be clipped; the step was skipped (error_if_nonfinite)";
      break;
    case kBadLearningRate:
      os << "learning rate " << r.value << " must be finite and >= 0; the step was skipped";
      break;
    case kPeerTimeout:
      if (r.value < 0)
        os << "statistics exchange " << r.index << " skipped: an earlier exchange waited " << r.hi
           << " s in vain; this rank's result is wrong";
      else
        os << "no statistics from rank " << r.value << " for exchange " << r.index << " within "
           << r.hi << " s (it died, stalled, or stopped waiting itself); this rank's result is "
           << "wrong";
      break;
    case kBadGroupSize:
      os << "size " << r.value << " at " << r.index << " is outside [" << r.lo << ", " << r.hi
         << "]";
      break;
    case kValueOutOfRange:
      os << "input[" << r.index << "] = " << r.value << " is outside [" << r.lo << ", " << r.hi
         << "]";
      break;
    default:
      os << "device-side check failed with code " << r.code << " at index " << r.index << " (value "
         << r.value << ")";
  }
  return os.str();
}

void check_device_errors(DeviceErrorRecord* dev, cudaStream_t stream, const Graph* graph) {
  DeviceErrorRecord host{};
  QG_CUDA_CHECK("cuda_backend",
                cudaMemcpyAsync(&host, dev, sizeof(host), cudaMemcpyDeviceToHost, stream));
  QG_CUDA_CHECK("cuda_backend", cudaStreamSynchronize(stream));
  if (host.code == kNoDeviceError) return;
  QG_CUDA_CHECK("cuda_backend", cudaMemsetAsync(dev, 0, sizeof(host), stream));
  QG_CUDA_CHECK("cuda_backend", cudaStreamSynchronize(stream));
  std::string op = "cuda kernel", where;
  if (graph != nullptr && host.node >= 0 && host.node < graph->num_nodes()) {
    const Node& n = graph->node(host.node);
    op = n.op->name;
    where = " (node '" + n.name + "')";
  }
  throw Error(op, describe_device_error(host) + where, __FILE__, __LINE__);
}

}  // namespace qg::cuda
