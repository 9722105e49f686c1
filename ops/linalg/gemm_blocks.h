// GEMM on the thread pool with results that do not depend on the thread count. Eigen's own
// threading picks its blocking from the number of threads, so the sums of a product would
// change with it; here the output is cut into blocks of kGemmRowBlock rows fixed by the shape
// and each block is one single-threaded Eigen product. The last block takes the remainder
// rows instead of standing alone: a block of one row would send Eigen down its GEMV path,
// which adds in another order. With every block at least kGemmRowBlock rows, a row's sums
// are those of the whole product, bit for bit (tests/ops_linalg checks it), so the blocked
// product also equals the single product the kernels computed before.
#pragma once

#include <Eigen/Core>
#include <algorithm>

#include "core/thread_pool.h"

namespace qg::gemm {

template <typename M>
using RowMat = Eigen::Matrix<M, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

constexpr int64_t kGemmRowBlock = 64;

// A product's work in element-equivalents (min_parallel_work): 16 multiply-adds each.
inline int64_t product_work(int64_t m, int64_t n, int64_t k) {
  return m * n * k / 16;
}

// Row blocks of an m-row output.
inline int64_t row_blocks(int64_t m) {
  return std::max<int64_t>(1, m / kGemmRowBlock);
}
struct Rows {
  int64_t begin, count;
};
inline Rows row_block(int64_t m, int64_t block) {
  const int64_t r0 = block * kGemmRowBlock;
  return {r0, block + 1 == row_blocks(m) ? m - r0 : kGemmRowBlock};
}

// Rows [r.begin, r.begin + r.count) of y [m, n] = op(a) @ op(b); a is [ar, ac] and b
// [br, bc], all row-major, op = transpose when ta / tb.
template <typename M>
void product_rows(const M* a, int64_t ar, int64_t ac, const M* b, int64_t br, int64_t bc, M* y,
                  int64_t n, bool ta, bool tb, Rows r) {
  Eigen::Map<const RowMat<M>> ma(a, ar, ac), mb(b, br, bc);
  Eigen::Map<RowMat<M>> my(y + r.begin * n, r.count, n);
  if (!ta && !tb) my.noalias() = ma.middleRows(r.begin, r.count) * mb;
  if (!ta && tb) my.noalias() = ma.middleRows(r.begin, r.count) * mb.transpose();
  if (ta && !tb) my.noalias() = ma.middleCols(r.begin, r.count).transpose() * mb;
  if (ta && tb) my.noalias() = ma.middleCols(r.begin, r.count).transpose() * mb.transpose();
}

// y [m, n] = op(a) @ op(b), its row blocks on the thread pool.
template <typename M>
void product(const M* a, int64_t ar, int64_t ac, const M* b, int64_t br, int64_t bc, M* y,
             int64_t m, int64_t n, bool ta, bool tb) {
  if (m * n == 0) return;
  parallel_chunks(
      row_blocks(m),
      [&](int64_t blk) { product_rows(a, ar, ac, b, br, bc, y, n, ta, tb, row_block(m, blk)); },
      product_work(m, n, ta ? ar : ac));
}

}  // namespace qg::gemm
