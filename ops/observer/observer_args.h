// The parsed arguments of the observer ops (minmax, moving average, percentile, histogram):
// what their CPU and CUDA kernels read, parsed once per call site. Fields an observer kind
// has no attribute for keep their defaults. The values were validated by shape inference.
#pragma once

#include <cstdint>

#include "core/kernel_args.h"
#include "ops/common/quant_math.h"
#include "ops/common/quant_scope.h"

namespace qg {

struct ObserverArgs : KernelArgs {
  ScopeLayout layout;  // over x's shape
  qmath::QParamsConfig cfg;
  bool delayed = false;           // qparams from the range before this batch
  double averaging_constant = 0;  // moving average
  int64_t bins = 0;               // percentile, histogram
  int64_t upsample_rate = 0;      // histogram
  int64_t dst_nbins = 0;          // histogram: 2^bits
  double percentile = 0;          // percentile
  bool symmetric = false;         // percentile: qscheme == symmetric
  bool replicated = false;        // the same input on every rank: statistics are not synced
};

std::shared_ptr<const KernelArgs> parse_observer_args(const ArgsSource& source);

}  // namespace qg
