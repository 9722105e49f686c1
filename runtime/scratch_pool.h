// Scratch memory for kernels that allocate temporaries (per-block partial reductions and
// the like) inside a StaticRun. Kernels keep calling Tensor::empty; while a launch runs, a
// ScopedAllocator routes those allocations here.
//
// The first launch records, per step, the sizes asked for in order (and serves them from the
// device allocator). Every later launch gets, for the k-th allocation of step s, the same
// bytes of one scratch arena: launches allocate nothing and the addresses are fixed, so the
// launch can be captured as a CUDA graph. Steps run one after the other on one stream, so
// every step's scratch starts at offset 0 and the arena is the largest step's need.
//
// A kernel whose scratch tensor outlives the kernel (kept as an output or state) breaks the
// scheme and is reported as an error naming the op; so is a later launch that asks for more
// or larger allocations than the recorded one (fewer is fine).
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"

namespace qg {

class ScratchPool final : public Allocator {
 public:
  explicit ScratchPool(Device device);
  ~ScratchPool() override;

  // Brackets one launch and each step (node) inside it.
  void begin_launch();
  void begin_step(int step);
  void end_step(const std::string& op);
  void end_launch();

  bool recorded() const { return recorded_; }
  int64_t bytes() const { return arena_bytes_; }
  int allocations_per_launch() const;

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  Device device() const override { return device_; }

 private:
  Device device_;
  Allocator* backing_;  // the device allocator, for the recording launch and the arena
  bool recorded_ = false;
  bool recording_ = false;
  std::vector<std::vector<int64_t>> sizes_;  // per step: the (aligned) sizes asked for
  std::vector<std::vector<int64_t>> offsets_;
  void* arena_ = nullptr;
  int64_t arena_bytes_ = 0;
  int step_ = -1;
  int next_ = 0;         // index of the next allocation within the step
  int outstanding_ = 0;  // allocations of this step not yet freed
};

}  // namespace qg
