// Index maps for the CUDA kernels that broadcast (add/sub/mul, broadcast_to) or reduce over
// axes (sum, mean, sum_to). Shapes travel to the kernel by value in fixed arrays; the rank
// limit is checked on the host with a qg::Error.
#pragma once

#include <algorithm>
#include <vector>

#include "ops/common/cuda_common.cuh"

namespace qg::cuda {

inline constexpr int kMaxRank = 8;

inline void check_rank(const std::string& op, const Shape& s) {
  QG_CHECK(s.size() <= static_cast<size_t>(kMaxRank), op,
           "the CUDA backend supports rank <= ", kMaxRank, ", got shape ", shape_str(s));
}

// Strides (elements) that read `in` as if broadcast to `out`: 0 on broadcast dimensions.
inline std::vector<int64_t> broadcast_strides(const Shape& in, const Shape& out) {
  std::vector<int64_t> s(out.size(), 0);
  Shape cs = contiguous_strides(in);
  size_t off = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i) s[off + i] = in[i] == 1 ? 0 : cs[i];
  return s;
}

// out index -> offsets into a and b. Dimensions of size 1 are dropped and neighbours that
// both operands read the same way are merged on the host ([256, 64, 32, 32] against
// [1, 64, 1, 1] becomes [256, 64, 1024]), and `narrow` selects 32-bit index arithmetic when
// every index fits: the per-element divisions are what these kernels spend their time on.
struct BroadcastMap {
  int rank = 0;
  bool narrow = false;
  int64_t shape[kMaxRank] = {};
  int64_t sa[kMaxRank] = {};
  int64_t sb[kMaxRank] = {};
};

inline BroadcastMap broadcast_map(const std::string& op, const Shape& out, const Shape& a,
                                  const Shape& b) {
  check_rank(op, out);
  BroadcastMap m;
  std::vector<int64_t> sa = broadcast_strides(a, out), sb = broadcast_strides(b, out);
  for (size_t d = 0; d < out.size(); ++d) {
    if (out[d] == 1) continue;
    const int p = m.rank - 1;
    if (p >= 0 && m.sa[p] == sa[d] * out[d] && m.sb[p] == sb[d] * out[d]) {
      m.shape[p] *= out[d];
      m.sa[p] = sa[d];
      m.sb[p] = sb[d];
      continue;
    }
    m.shape[m.rank] = out[d];
    m.sa[m.rank] = sa[d];
    m.sb[m.rank] = sb[d];
    ++m.rank;
  }
  m.narrow = shape_numel(out) < (int64_t{1} << 31) && shape_numel(a) < (int64_t{1} << 31) &&
             shape_numel(b) < (int64_t{1} << 31);
  return m;
}

__device__ __forceinline__ void broadcast_offsets(const BroadcastMap& m, int64_t i, int64_t& ia,
                                                  int64_t& ib) {
  ia = 0;
  ib = 0;
  if (m.narrow) {
    uint32_t j = static_cast<uint32_t>(i), oa = 0, ob = 0;
    for (int d = m.rank - 1; d >= 0; --d) {
      uint32_t n = static_cast<uint32_t>(m.shape[d]), c = j % n;
      j /= n;
      oa += c * static_cast<uint32_t>(m.sa[d]);
      ob += c * static_cast<uint32_t>(m.sb[d]);
    }
    ia = oa;
    ib = ob;
    return;
  }
  for (int d = m.rank - 1; d >= 0; --d) {
    int64_t c = i % m.shape[d];
    i /= m.shape[d];
    ia += c * m.sa[d];
    ib += c * m.sb[d];
  }
}

// Reduction of x over the axes where `keep` (x's rank, 1 on reduced axes) is 1: outputs
// enumerate the kept axes in order, so output o is element o of the contiguous result.
struct ReducePlan {
  int kept_rank = 0, red_rank = 0;
  int64_t kept_shape[kMaxRank] = {}, kept_stride[kMaxRank] = {};
  int64_t red_shape[kMaxRank] = {}, red_stride[kMaxRank] = {};
  int64_t n_out = 1, n_red = 1;
  // Every reduced axis precedes every kept axis: x is [n_red, n_out] row-major (a bias
  // gradient, a column sum), and output o is the sum of column o.
  bool columns = true;
};

inline ReducePlan reduce_plan(const std::string& op, const Shape& x, const Shape& keep) {
  check_rank(op, x);
  ReducePlan p;
  Shape st = contiguous_strides(x);
  for (size_t d = 0; d < x.size(); ++d) {
    if (x[d] == 1) continue;
    if (keep[d] == 1 && p.kept_rank > 0) p.columns = false;
    if (keep[d] == 1) {
      p.red_shape[p.red_rank] = x[d];
      p.red_stride[p.red_rank++] = st[d];
      p.n_red *= x[d];
    } else {
      p.kept_shape[p.kept_rank] = x[d];
      p.kept_stride[p.kept_rank++] = st[d];
      p.n_out *= x[d];
    }
  }
  if (shape_numel(x) == 0) {
    p.n_out = shape_numel(keep);
    p.n_red = 0;
  }
  return p;
}

__device__ __forceinline__ int64_t decompose(int64_t i, int rank, const int64_t* shape,
                                             const int64_t* stride) {
  int64_t off = 0;
  for (int d = rank - 1; d >= 0; --d) {
    off += (i % shape[d]) * stride[d];
    i /= shape[d];
  }
  return off;
}

// Block (o, s) sums reduced elements [s * chunk, (s + 1) * chunk) of output o in f64 into
// partial[o * splits + s]. Fixed assignment and tree order: deterministic.
template <typename T>
__global__ void reduce_partial_kernel(const T* x, ReducePlan p, int64_t splits, int64_t chunk,
                                      double* partial) {
  for (int64_t b = blockIdx.x; b < p.n_out * splits; b += gridDim.x) {
    int64_t o = b / splits, s = b % splits;
    int64_t base = decompose(o, p.kept_rank, p.kept_shape, p.kept_stride);
    int64_t lo = s * chunk, hi = lo + chunk < p.n_red ? lo + chunk : p.n_red;
    double acc = 0;
    for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x)
      acc += static_cast<double>(
          to_math(x[base + decompose(r, p.red_rank, p.red_shape, p.red_stride)]));
    double total = block_reduce(acc, SumOp{});
    if (threadIdx.x == 0) partial[b] = total;
  }
}

// Column sums of x viewed as [n_red, n_out]: thread column o of block (column tile, split s)
// sums rows [s * chunk, (s + 1) * chunk) in f64 into partial[o * splits + s]. Threads of a
// warp read neighbouring columns (coalesced; the general kernel's block per output read one
// column with a row stride per thread), four rows per iteration for loads in flight. Fixed
// assignment and order: deterministic.
template <typename T>
__global__ void column_partial_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                      int64_t splits, int64_t chunk, double* __restrict__ partial) {
  const int64_t o = int64_t{blockIdx.x} * blockDim.x + threadIdx.x, s = blockIdx.y;
  if (o >= cols) return;
  const int64_t lo = s * chunk, hi = lo + chunk < rows ? lo + chunk : rows;
  double acc = 0;
  int64_t r = lo;
  for (; r + 3 < hi; r += 4) {
    const T* p = x + r * cols + o;
    const double a = static_cast<double>(to_math(p[0])), b = static_cast<double>(to_math(p[cols]));
    const double c = static_cast<double>(to_math(p[2 * cols])),
                 e = static_cast<double>(to_math(p[3 * cols]));
    acc += (a + b) + (c + e);
  }
  for (; r < hi; ++r) acc += static_cast<double>(to_math(x[r * cols + o]));
  partial[o * splits + s] = acc;
}

// y[o] = sum of the partials of o in split order (divided by `count` for a mean, as the CPU
// divides), rounded once to T.
template <typename T>
__global__ void reduce_finish_kernel(const double* partial, int64_t n_out, int64_t splits,
                                     bool mean, double count, T* y) {
  for (int64_t o = global_thread(); o < n_out; o += global_stride()) {
    double acc = 0;
    for (int64_t s = 0; s < splits; ++s) acc += partial[o * splits + s];
    if (mean) acc = acc / count;
    y[o] = from_math<T>(static_cast<math_of<T>>(acc));
  }
}

// Sums x (device type T) over the axes where keep is 1 into y (contiguous, n_out elements).
template <typename T>
void launch_reduce(const std::string& op, const Tensor& x, const Shape& keep, bool mean,
                   double count, Tensor& y, cudaStream_t stream) {
  ReducePlan p = reduce_plan(op, x.shape(), keep);
  if (p.n_out == 0) return;
  const int threads = 256;
  int64_t sms = multiprocessor_count();
  int64_t splits = 1;
  if (p.columns && p.kept_rank > 0 && p.n_out >= 32 && p.n_red > 0) {
    // Enough (column tile, row stretch) blocks to fill the SMs, at least 32 rows each.
    const int64_t tiles = (p.n_out + threads - 1) / threads;
    const int64_t by_occupancy = (8 * sms + tiles - 1) / tiles;
    const int64_t by_size = (p.n_red + 31) / 32;
    splits = std::max<int64_t>(1, std::min({by_occupancy, by_size, int64_t{65535}}));
    const int64_t chunk = (p.n_red + splits - 1) / splits;
    splits = (p.n_red + chunk - 1) / chunk;
    Tensor partial = Tensor::empty({p.n_out * splits}, DType::f64, y.device());
    column_partial_kernel<T>
        <<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(splits)), threads, 0, stream>>>(
            in_ptr<T>(x), p.n_red, p.n_out, splits, chunk, out_ptr<double>(partial));
    QG_CUDA_CHECK_LAUNCH(op);
    auto shape = elementwise_launch(p.n_out);
    reduce_finish_kernel<T><<<shape.blocks, shape.threads, 0, stream>>>(
        in_ptr<double>(partial), p.n_out, splits, mean, count, out_ptr<T>(y));
    QG_CUDA_CHECK_LAUNCH(op);
    return;
  }
  if (p.n_out < 2 * sms && p.n_red > threads * 16) {
    int64_t by_size = (p.n_red + threads * 16 - 1) / (threads * 16);
    int64_t by_occupancy = (4 * sms + p.n_out - 1) / p.n_out;
    splits = by_size < by_occupancy ? by_size : by_occupancy;
  }
  int64_t chunk = p.n_red == 0 ? 1 : (p.n_red + splits - 1) / splits;
  Tensor partial = Tensor::empty({p.n_out * splits}, DType::f64, y.device());
  int64_t blocks = p.n_out * splits;
  unsigned grid = static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
  reduce_partial_kernel<T>
      <<<grid, threads, 0, stream>>>(in_ptr<T>(x), p, splits, chunk, out_ptr<double>(partial));
  QG_CUDA_CHECK_LAUNCH(op);
  auto shape = elementwise_launch(p.n_out);
  reduce_finish_kernel<T><<<shape.blocks, shape.threads, 0, stream>>>(
      in_ptr<double>(partial), p.n_out, splits, mean, count, out_ptr<T>(y));
  QG_CUDA_CHECK_LAUNCH(op);
}

}  // namespace qg::cuda
