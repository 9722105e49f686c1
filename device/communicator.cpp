#include "device/communicator.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/float_order.h"

namespace qg {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::min:
      return "min";
    case ReduceOp::max:
      return "max";
    case ReduceOp::avg:
      return "avg";
  }
  return "?";
}

Communicator::~Communicator() = default;

int64_t all_reduce_count(Communicator& comm, int64_t count) {
  comm.all_reduce(&count, 1, DType::i64, ReduceOp::sum);
  return count;
}

int64_t all_reduce_range_keys_and_count(Communicator& comm, int32_t* lo, int32_t* hi, int64_t n,
                                        int64_t count) {
  const int world = comm.world_size();
  const size_t row = static_cast<size_t>(2 * n + 1);
  std::vector<int64_t> mine(row), all(row * static_cast<size_t>(world));
  for (int64_t q = 0; q < n; ++q) {
    mine[q] = lo[q];
    mine[n + q] = hi[q];
  }
  mine[2 * n] = count;
  comm.all_gather(mine.data(), all.data(), static_cast<int64_t>(row * sizeof(int64_t)));
  int64_t total = 0;
  for (int r = 0; r < world; ++r) {
    const int64_t* theirs = all.data() + r * row;
    for (int64_t q = 0; q < n; ++q) {
      lo[q] = std::min(lo[q], static_cast<int32_t>(theirs[q]));
      hi[q] = std::max(hi[q], static_cast<int32_t>(theirs[n + q]));
    }
    total += theirs[2 * n];
  }
  return total;
}

int64_t all_reduce_ranges_and_count(Communicator& comm, float* mn, float* mx, int64_t n,
                                    int64_t count) {
  std::vector<int32_t> lo(static_cast<size_t>(n)), hi(static_cast<size_t>(n));
  for (int64_t q = 0; q < n; ++q) {
    lo[q] = order_key(mn[q]);
    hi[q] = order_key(mx[q]);
  }
  count = all_reduce_range_keys_and_count(comm, lo.data(), hi.data(), n, count);
  for (int64_t q = 0; q < n; ++q) {
    mn[q] = key_float(lo[q]);
    mx[q] = key_float(hi[q]);
  }
  return count;
}

std::vector<std::vector<float>> all_gather_lists(Communicator& comm,
                                                 const std::vector<std::vector<float>>& lists) {
  const int world = comm.world_size();
  const size_t n = lists.size();
  // 1. Every rank's list lengths, 2. the values, padded to the longest rank's total.
  std::vector<int64_t> counts(n);
  int64_t total = 0;
  for (size_t q = 0; q < n; ++q) total += counts[q] = static_cast<int64_t>(lists[q].size());
  std::vector<int64_t> all_counts(n * world);
  comm.all_gather(counts.data(), all_counts.data(), static_cast<int64_t>(n * sizeof(int64_t)));
  int64_t longest = 0;
  for (int r = 0; r < world; ++r) {
    int64_t t = 0;
    for (size_t q = 0; q < n; ++q) t += all_counts[r * n + q];
    longest = std::max(longest, t);
  }
  std::vector<float> mine(static_cast<size_t>(longest), 0.0f);
  size_t k = 0;
  for (const auto& l : lists)
    for (float v : l) mine[k++] = v;
  std::vector<float> all(static_cast<size_t>(longest) * world);
  comm.all_gather(mine.data(), all.data(), longest * static_cast<int64_t>(sizeof(float)));
  // 3. Rank by rank into the lists.
  std::vector<std::vector<float>> out(n);
  for (int r = 0; r < world; ++r) {
    const float* p = all.data() + static_cast<size_t>(r) * longest;
    for (size_t q = 0; q < n; ++q) {
      const int64_t c = all_counts[r * n + q];
      out[q].insert(out[q].end(), p, p + c);
      p += c;
    }
  }
  return out;
}

}  // namespace qg
