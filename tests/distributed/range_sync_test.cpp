// The observers' CPU range sync (device/communicator.h: all_reduce_range_keys_and_count) on a
// stand-in group of three whose all-gather hands back fixed rows for the other ranks: the
// fold takes the least min key and the greatest max key per channel (signed zeros and
// infinities ordered as ordered_min / ordered_max order them), sums the counts, and issues one
// collective.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/float_order.h"
#include "device/communicator.h"

namespace qg {
namespace {

// Rank 0 of three; the other ranks' rows are `others` ([2 n + 1] int64 each, as the sync lays
// them out: min keys, max keys, count).
class GatherOnly final : public Communicator {
 public:
  explicit GatherOnly(std::vector<std::vector<int64_t>> others) : others_(std::move(others)) {}
  int rank() const override { return 0; }
  int world_size() const override { return 3; }
  std::string backend() const override { return "stand-in"; }
  DeviceType memory() const override { return DeviceType::cpu; }
  void all_reduce(void*, int64_t, DType, ReduceOp, void*) override { ADD_FAILURE(); }
  void broadcast(void*, int64_t, int, void*) override { ADD_FAILURE(); }
  void all_gather(const void* in, void* out, int64_t bytes, void*) override {
    ++gathers;
    std::memcpy(out, in, static_cast<size_t>(bytes));
    for (size_t r = 0; r < others_.size(); ++r) {
      ASSERT_EQ(others_[r].size() * sizeof(int64_t), static_cast<size_t>(bytes));
      std::memcpy(static_cast<char*>(out) + (r + 1) * bytes, others_[r].data(),
                  static_cast<size_t>(bytes));
    }
  }
  void barrier() override { ADD_FAILURE(); }
  void set_timeout(std::chrono::milliseconds) override {}
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(1); }
  int gathers = 0;

 private:
  std::vector<std::vector<int64_t>> others_;
};

int64_t key(float v) {
  return order_key(v);
}

uint32_t bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

TEST(RangeSync, FoldsTheRanksRangesAndCountsInOneCollective) {
  const float inf = std::numeric_limits<float>::infinity();
  // Three channels. Rank 0: [-1, 2], [+0, +0], [5, 5]; rank 1: [-3, 1], [-0, -0], empty
  // (+inf, -inf); rank 2: [0.5, 7], [+0, 4], [-inf, 6].
  GatherOnly comm({{key(-3), key(-0.0f), key(inf), key(1), key(-0.0f), key(-inf), 4},
                   {key(0.5f), key(0.0f), key(-inf), key(7), key(4), key(6), 0}});
  float mn[3] = {-1, 0.0f, 5}, mx[3] = {2, 0.0f, 5};
  const int64_t count = all_reduce_ranges_and_count(comm, mn, mx, 3, 2);
  EXPECT_EQ(comm.gathers, 1);
  EXPECT_EQ(count, 6);
  EXPECT_EQ(mn[0], -3.0f);
  EXPECT_EQ(mx[0], 7.0f);
  EXPECT_EQ(bits(mn[1]), bits(-0.0f));  // -0 sorts below +0
  EXPECT_EQ(mx[1], 4.0f);
  EXPECT_EQ(mn[2], -inf);
  EXPECT_EQ(mx[2], 6.0f);
}

TEST(RangeSync, ZeroChannelsStillSumTheCount) {
  GatherOnly comm({{3}, {4}});
  EXPECT_EQ(all_reduce_ranges_and_count(comm, nullptr, nullptr, 0, 1), 8);
  EXPECT_EQ(comm.gathers, 1);
}

}  // namespace
}  // namespace qg
