#include "runtime/scratch_pool.h"

#include <algorithm>

#include "core/error.h"
#include "runtime/memory_plan.h"

namespace qg {

ScratchPool::ScratchPool(Device device) : device_(device), backing_(&allocator_for(device)) {}

ScratchPool::~ScratchPool() {
  if (arena_ != nullptr) backing_->deallocate(arena_, static_cast<size_t>(arena_bytes_));
}

int ScratchPool::allocations_per_launch() const {
  size_t n = 0;
  for (const auto& s : sizes_) n += s.size();
  return static_cast<int>(n);
}

void ScratchPool::begin_launch() {
  recording_ = !recorded_;
  if (recording_) sizes_.clear();  // a recording launch that failed part-way starts over
  step_ = -1;
}

void ScratchPool::begin_step(int step) {
  step_ = step;
  next_ = 0;
  outstanding_ = 0;
  if (recording_ && static_cast<int>(sizes_.size()) <= step) sizes_.resize(step + 1);
}

void ScratchPool::end_step(const std::string& op) {
  // Checked before anything else so a kept scratch tensor is named after the op that kept it.
  QG_CHECK(outstanding_ == 0, op, "the kernel kept ", outstanding_,
           " temporary tensor(s) after it returned (as an output or state); a static run "
           "reuses scratch memory on every launch and cannot run such a kernel");
  // Fewer temporaries than recorded is fine (a kernel may skip its scratch, e.g. an observer
  // that does not update in eval mode); more or larger ones fail in allocate().
  step_ = -1;
}

void ScratchPool::end_launch() {
  if (!recording_) return;
  recording_ = false;
  recorded_ = true;
  offsets_.resize(sizes_.size());
  for (size_t s = 0; s < sizes_.size(); ++s) {
    int64_t at = 0;
    for (int64_t bytes : sizes_[s]) {
      offsets_[s].push_back(at);
      at += bytes;
    }
    arena_bytes_ = std::max(arena_bytes_, at);
  }
  if (arena_bytes_ > 0) arena_ = backing_->allocate(static_cast<size_t>(arena_bytes_));
}

void* ScratchPool::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  QG_CHECK(step_ >= 0, "static_run", "scratch allocation of ", bytes, " bytes outside a step");
  int64_t size =
      (static_cast<int64_t>(bytes) + kPlanAlignment - 1) / kPlanAlignment * kPlanAlignment;
  ++outstanding_;
  if (recording_) {
    sizes_[step_].push_back(size);
    ++next_;
    return backing_->allocate(bytes);
  }
  const bool known =
      step_ < static_cast<int>(sizes_.size()) && next_ < static_cast<int>(sizes_[step_].size());
  QG_CHECK(known && sizes_[step_][next_] >= size, "static_run", "step ", step_,
           " asked for temporary #", next_, " of ", bytes,
           " bytes, which the recorded launch did not (kernels must allocate the same sizes on "
           "every launch)");
  void* p = static_cast<char*>(arena_) + offsets_[step_][next_];
  ++next_;
  return p;
}

void ScratchPool::deallocate(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  --outstanding_;
  // Recording-launch blocks came from the device allocator; arena blocks stay in the arena.
  char* base = static_cast<char*>(arena_);
  char* p = static_cast<char*>(ptr);
  bool in_arena = base != nullptr && p >= base && p < base + arena_bytes_;
  if (!in_arena) backing_->deallocate(ptr, bytes);
}

}  // namespace qg
