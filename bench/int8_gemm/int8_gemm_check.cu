// Standalone check and timing of qg::int8_gemm::launch (ops/int8_matmul/int8_gemm_cuda.cu),
// built directly with nvcc by bench/int8_gemm/run.sh.
//
// Correctness: every output is compared bit for bit (any NaN matches any NaN: NaN payloads
// are not part of the contract and differ between the CPU and the GPU) with a CPU
// implementation of the contract written out below, over ragged shapes, every group size,
// the three output types and int4 / int8 / extreme codes, plus sampled outputs of the M = 8192
// anchor shapes. Timing: median of 25 cudaEvent-timed launches of ours, cuBLAS bf16 and int8
// GEMMs of the same shape, and a device copy of the bytes a GEMM must move at least.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "ops/int8_matmul/int8_gemm_cuda.cuh"

namespace {

using qg::int8_gemm::OutType;

#define CK(call)                                                                                 \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(2);                                                                              \
    }                                                                                            \
  } while (0)

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {  // splitmix64
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int range(int lo, int hi) { return lo + int(next() % uint64_t(hi - lo + 1)); }
  double unit() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }
};

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Round to nearest even, written out on the bits (NaN -> a quiet NaN).
uint16_t to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

uint16_t to_f16(float f) {
  const uint32_t x = f32_bits(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) return sign | 0x7e00;
  if (mag == 0x7f800000u) return sign | 0x7c00;
  const int e = int(mag >> 23) - 127;
  const uint32_t m = mag & 0x7fffffu;
  if (e >= 16) return sign | 0x7c00;
  if (e >= -14) {
    uint32_t h = (uint32_t(e + 15) << 10) + (m >> 13);
    const uint32_t rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into inf: correct
    return uint16_t(sign | h);
  }
  if (e < -25) return sign;  // below half the smallest subnormal (f32 subnormals included)
  const uint32_t mant = m | 0x800000u;
  const int shift = -(e + 1);  // 14 .. 24: the value is mant * 2^-shift subnormal units
  uint32_t h = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1u))) ++h;
  return uint16_t(sign | h);
}

bool is_nan_bits(uint32_t bits, OutType t) {
  if (t == OutType::f32) return (bits & 0x7fffffffu) > 0x7f800000u;
  if (t == OutType::bf16) return (bits & 0x7fffu) > 0x7f80u;
  return (bits & 0x7fffu) > 0x7c00u;
}

const char* out_name(OutType t) {
  return t == OutType::f32 ? "f32" : t == OutType::bf16 ? "bf16" : "f16";
}
int out_size(OutType t) {
  return t == OutType::f32 ? 4 : 2;
}

struct Host {
  int64_t M, N, K, G;
  std::vector<int8_t> a, w;
  std::vector<float> as, ws;
  std::vector<int32_t> az;
};

// The contract, one output element, as f32 (before the rounding to the output type).
float reference(const Host& h, int64_t m, int64_t n) {
  const int64_t gpr = h.K / h.G;
  const int8_t* ar = &h.a[m * h.K];
  const int8_t* wr = &h.w[n * h.K];
  const int32_t z = h.az[m];
  float acc = 0.0f;
  for (int64_t g = 0; g < gpr; ++g) {
    int32_t p = 0;
    for (int64_t k = g * h.G; k < (g + 1) * h.G; ++k) p += (int32_t(ar[k]) - z) * int32_t(wr[k]);
    acc = std::fma(static_cast<float>(p), h.ws[n * gpr + g], acc);
  }
  return acc * h.as[m];
}

uint32_t out_bits(float r, OutType t) {
  if (t == OutType::f32) return f32_bits(r);
  return t == OutType::bf16 ? to_bf16(r) : to_f16(r);
}

template <typename F>
void parallel_for(int64_t count, F&& f) {
  const int nt = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (int t = 0; t < nt; ++t)
    pool.emplace_back([&, t] {
      for (int64_t i = t; i < count; i += nt) f(i);
    });
  for (auto& th : pool) th.join();
}

enum class Codes { int4, int8, extreme, max_p };
const char* codes_name(Codes c) {
  switch (c) {
    case Codes::int4:
      return "int4-w";
    case Codes::int8:
      return "int8-w";
    case Codes::extreme:
      return "extreme";
    case Codes::max_p:
      return "max-|p|";
  }
  return "?";
}

// Scales of magnitude 2^[lo, hi], random sign when `signs`.
float rand_scale(Rng& r, int lo, int hi, bool signs) {
  const float mag = float((0.5 + r.unit()) * std::ldexp(1.0, r.range(lo, hi)));
  return signs && (r.next() & 1) ? -mag : mag;
}

void fill(Host& h, Codes codes, uint64_t seed, bool wild_scales) {
  Rng r(seed);
  h.a.resize(h.M * h.K);
  h.w.resize(h.N * h.K);
  h.az.resize(h.M);
  h.as.resize(h.M);
  h.ws.resize(h.N * (h.K / h.G));
  for (auto& v : h.a) {
    if (codes == Codes::extreme)
      v = (r.next() & 1) ? 127 : -128;
    else if (codes == Codes::max_p)
      v = -128;
    else
      v = int8_t(r.range(-128, 127));
  }
  for (auto& v : h.w) {
    if (codes == Codes::int4)
      v = int8_t(r.range(-8, 7));
    else if (codes == Codes::extreme)
      v = (r.next() & 1) ? 127 : -128;
    else if (codes == Codes::max_p)
      v = -128;
    else
      v = int8_t(r.range(-128, 127));
  }
  for (int64_t m = 0; m < h.M; ++m) {
    if (codes == Codes::extreme || codes == Codes::max_p)
      h.az[m] = (m & 1) ? -128 : 127;
    else
      h.az[m] = r.range(-128, 127);
  }
  // Wild: 2^-75 .. 2^15 with signs (subnormal, f16-overflowing and negative outputs); tame:
  // the magnitudes of real QAT scales.
  for (auto& v : h.as)
    v = wild_scales ? rand_scale(r, -75, 15, true) : rand_scale(r, -10, -4, false);
  for (auto& v : h.ws)
    v = wild_scales ? rand_scale(r, -75, 15, true) : rand_scale(r, -10, -4, false);
  if (wild_scales) {
    const float nan = std::nanf("");
    h.as[h.M / 2] = nan;                                    // a NaN row
    h.ws[(h.N / 3) * (h.K / h.G) + (h.K / h.G) / 2] = nan;  // a NaN column (one group of it)
    if (h.N > 1) h.ws[(h.N - 1) * (h.K / h.G)] = INFINITY;  // an infinite one
  }
}

struct Dev {
  int8_t *a = nullptr, *w = nullptr;
  float *as = nullptr, *ws = nullptr;
  int32_t* az = nullptr;
  void* y = nullptr;
  size_t y_bytes = 0;
  void upload(const Host& h) {
    CK(cudaMalloc(&a, h.a.size()));
    CK(cudaMalloc(&w, h.w.size()));
    CK(cudaMalloc(&as, h.as.size() * 4));
    CK(cudaMalloc(&ws, h.ws.size() * 4));
    CK(cudaMalloc(&az, h.az.size() * 4));
    y_bytes = size_t(h.M * h.N * 4);
    CK(cudaMalloc(&y, y_bytes));
    CK(cudaMemcpy(a, h.a.data(), h.a.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(w, h.w.data(), h.w.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(as, h.as.data(), h.as.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ws, h.ws.data(), h.ws.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(az, h.az.data(), h.az.size() * 4, cudaMemcpyHostToDevice));
  }
  void release() {
    CK(cudaFree(a));
    CK(cudaFree(w));
    CK(cudaFree(as));
    CK(cudaFree(ws));
    CK(cudaFree(az));
    CK(cudaFree(y));
  }
};

qg::int8_gemm::Problem problem(const Host& h, const Dev& d, OutType t) {
  qg::int8_gemm::Problem p;
  p.m = h.M;
  p.n = h.N;
  p.k = h.K;
  p.group = h.G;
  p.a = d.a;
  p.a_scale = d.as;
  p.a_zero = d.az;
  p.w = d.w;
  p.w_scale = d.ws;
  p.y = d.y;
  p.out = t;
  return p;
}

// Runs ours for output type t and compares the listed elements (all when `idx` is empty)
// against `want` (f32 contract values in the same order). Prints one PASS/FAIL line.
bool compare(const std::string& name, const Host& h, Dev& d, OutType t,
             const std::vector<int64_t>& idx, const std::vector<float>& want) {
  CK(cudaMemset(d.y, 0xff, d.y_bytes));  // stale bits would not pass for fresh ones
  qg::int8_gemm::launch(problem(h, d, t), 0, "int8_gemm_check");
  CK(cudaDeviceSynchronize());
  const int es = out_size(t);
  std::vector<uint8_t> got(size_t(h.M * h.N) * es);
  CK(cudaMemcpy(got.data(), d.y, got.size(), cudaMemcpyDeviceToHost));
  const int64_t count = idx.empty() ? h.M * h.N : int64_t(idx.size());
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t e = idx.empty() ? i : idx[i];
    uint32_t g = 0;
    std::memcpy(&g, &got[size_t(e) * es], es);
    const uint32_t wb = out_bits(want[i], t);
    const bool ok = g == wb || (is_nan_bits(g, t) && is_nan_bits(wb, t));
    if (!ok) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  if (bad == 0) {
    std::printf("PASS %-44s %-4s (%lld outputs)\n", name.c_str(), out_name(t), (long long)count);
    return true;
  }
  const int64_t e = idx.empty() ? first : idx[first];
  uint32_t g = 0;
  std::memcpy(&g, &got[size_t(e) * es], es);
  std::printf(
      "FAIL %-44s %-4s %lld/%lld wrong; first m=%lld n=%lld got 0x%08x want 0x%08x "
      "(f32 want %.9g)\n",
      name.c_str(), out_name(t), (long long)bad, (long long)count, (long long)(e / h.N),
      (long long)(e % h.N), g, out_bits(want[first], t), want[first]);
  return false;
}

std::string case_name(const Host& h, const char* tag) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "M=%lld N=%lld K=%lld G=%lld %s", (long long)h.M, (long long)h.N,
                (long long)h.K, (long long)h.G, tag);
  return buf;
}

int g_fail = 0, g_pass = 0;
void tally(bool ok) {
  ok ? ++g_pass : ++g_fail;
}

void full_case(int64_t M, int64_t N, int64_t K, int64_t G, Codes codes, uint64_t seed) {
  Host h{M, N, K, G, {}, {}, {}, {}, {}};
  fill(h, codes, seed, /*wild_scales=*/codes != Codes::max_p);
  std::vector<float> want(size_t(M * N));
  parallel_for(M, [&](int64_t m) {
    for (int64_t n = 0; n < N; ++n) want[m * N + n] = reference(h, m, n);
  });
  Dev d;
  d.upload(h);
  for (OutType t : {OutType::f32, OutType::bf16, OutType::f16})
    tally(compare(case_name(h, codes_name(codes)), h, d, t, {}, want));
  d.release();
}

// Elements checked on the big shapes: rows 0, M/2 + 1 and M - 1, columns 0 and N - 1, and
// random ones.
std::vector<int64_t> sample_indices(int64_t M, int64_t N, uint64_t seed) {
  std::vector<int64_t> idx;
  for (int64_t m : {int64_t(0), M / 2 + 1, M - 1})
    for (int64_t n = 0; n < N; ++n) idx.push_back(m * N + n);
  for (int64_t n : {int64_t(0), N - 1})
    for (int64_t m = 0; m < M; ++m) idx.push_back(m * N + n);
  Rng r(seed);
  for (int i = 0; i < 8192; ++i) idx.push_back(int64_t(r.next() % uint64_t(M * N)));
  return idx;
}

template <typename F>
double median_us(F&& f, cudaStream_t s, int reps = 25) {
  for (int i = 0; i < 3; ++i) f();
  std::vector<cudaEvent_t> ev(2 * reps);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(ev[2 * i], s));
    f();
    CK(cudaEventRecord(ev[2 * i + 1], s));
  }
  CK(cudaStreamSynchronize(s));
  std::vector<double> t(reps);
  for (int i = 0; i < reps; ++i) {
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    t[i] = ms * 1000.0;
  }
  for (auto& e : ev) CK(cudaEventDestroy(e));
  std::sort(t.begin(), t.end());
  return t[reps / 2];
}

// The instruction ceiling the kernel works under: back-to-back independent
// mma.sync.m16n8k32 s8 on registers, 16 warps per SM, no memory traffic.
__global__ void mma_ceiling_kernel(int iters, int* sink) {
  uint32_t a[4], b[2];
  for (int i = 0; i < 4; ++i) a[i] = threadIdx.x * 0x01030507u + i;
  for (int i = 0; i < 2; ++i) b[i] = threadIdx.x * 0x07050301u + i;
  int acc[8][4] = {};
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      asm volatile(
          "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
          "{%8,%9}, {%0,%1,%2,%3};\n"
          : "+r"(acc[q][0]), "+r"(acc[q][1]), "+r"(acc[q][2]), "+r"(acc[q][3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
  }
  int t = 0;
  for (int q = 0; q < 8; ++q) t += acc[q][0] + acc[q][1] + acc[q][2] + acc[q][3];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = t;
}

void mma_ceiling(int sms) {
  const int threads = 512, iters = 4096;
  int* sink;
  CK(cudaMalloc(&sink, size_t(sms) * threads * 4));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  const double us = median_us(
      [&] {
        mma_ceiling_kernel<<<sms, threads, 0, s>>>(iters, sink);
        CK(cudaGetLastError());
      },
      s, 5);
  const double ops = double(sms) * (threads / 32) * iters * 8 * (16.0 * 8 * 32 * 2);
  std::printf("\nmma.sync m16n8k32 s8 ceiling (registers only, 16 warps/SM): %.0f TOPS\n",
              ops / (us * 1e-6) / 1e12);
  CK(cudaFree(sink));
  CK(cudaStreamDestroy(s));
}

void anchors() {
  const int64_t M = 8192;
  const int64_t shapes[][2] = {
      {1024, 1024}, {512, 1024}, {2816, 1024}, {1024, 2816}, {32000, 1024}};
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cublasHandle_t cb;
  if (cublasCreate(&cb) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasCreate failed\n");
    std::exit(2);
  }
  cublasSetStream(cb, s);
  std::vector<std::string> table;
  for (const auto& sh : shapes) {
    const int64_t N = sh[0], K = sh[1];
    // cuBLAS buffers: bf16 A [M,K], W [N,K], C [M,N]; int8 C as int32; the copy's bytes.
    void *a16, *w16, *c16, *c32, *src, *dst;
    const size_t copy_bytes = size_t(M * K + N * K + 2 * M * N);
    CK(cudaMalloc(&a16, M * K * 2));
    CK(cudaMalloc(&w16, N * K * 2));
    CK(cudaMalloc(&c16, M * N * 2));
    CK(cudaMalloc(&c32, M * N * 4));
    CK(cudaMalloc(&src, copy_bytes));
    CK(cudaMalloc(&dst, copy_bytes));
    CK(cudaMemset(a16, 0x3c, M * K * 2));  // bf16 0x3c3c ~ 0.0115
    CK(cudaMemset(w16, 0x3c, N * K * 2));
    CK(cudaMemset(src, 1, copy_bytes));
    const float one = 1.0f, zero = 0.0f;
    const int32_t ione = 1, izero = 0;
    auto bf16_gemm = [&] {
      return cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &one, w16,
                          CUDA_R_16BF, int(K), a16, CUDA_R_16BF, int(K), &zero, c16, CUDA_R_16BF,
                          int(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    // Same transpose trick on the int8 codes of ours (set below), int32 out.
    int8_t *a8 = nullptr, *w8 = nullptr;
    auto int8_gemm = [&] {
      return cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &ione, w8,
                          CUDA_R_8I, int(K), a8, CUDA_R_8I, int(K), &izero, c32, CUDA_R_32I, int(N),
                          CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT);
    };
    const bool bf16_ok = bf16_gemm() == CUBLAS_STATUS_SUCCESS;
    const double t_bf16 = bf16_ok ? median_us([&] { bf16_gemm(); }, s) : -1;
    const double t_copy = median_us(
        [&] { CK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, s)); }, s);

    Host h{M, N, K, K, {}, {}, {}, {}, {}};
    bool int8_tried = false;
    double t_int8 = -1;
    cublasStatus_t int8_status = CUBLAS_STATUS_SUCCESS;
    for (int64_t G : {int64_t(32), int64_t(128), K}) {
      h.G = G;
      fill(h, Codes::int8, uint64_t(N * 131 + K * 7 + G), /*wild_scales=*/false);
      Dev d;
      d.upload(h);
      if (!int8_tried) {
        a8 = d.a;
        w8 = d.w;
        int8_status = int8_gemm();
        if (int8_status == CUBLAS_STATUS_SUCCESS) t_int8 = median_us([&] { int8_gemm(); }, s);
        CK(cudaStreamSynchronize(s));
        int8_tried = true;
      }
      const auto idx = sample_indices(M, N, uint64_t(G));
      std::vector<float> want(idx.size());
      parallel_for(int64_t(idx.size()),
                   [&](int64_t i) { want[i] = reference(h, idx[i] / N, idx[i] % N); });
      tally(compare(case_name(h, "anchor, sampled"), h, d, OutType::bf16, idx, want));
      const auto prob = problem(h, d, OutType::bf16);
      const double t_ours =
          median_us([&] { qg::int8_gemm::launch(prob, s, "int8_gemm_check"); }, s);
      char buf[256];
      const double ops = 2.0 * double(M) * double(N) * double(K);
      char i8[32];
      if (int8_status == CUBLAS_STATUS_SUCCESS)
        std::snprintf(i8, sizeof i8, "%9.1f", t_int8);
      else
        std::snprintf(i8, sizeof i8, "refused(%d)", int(int8_status));
      std::snprintf(buf, sizeof buf, "%5lldx%5lldx%5lld %5lld %9.1f %9.1f %11s %9.1f %8.1f %7.2f",
                    (long long)M, (long long)N, (long long)K, (long long)G, t_ours, t_bf16, i8,
                    t_copy, ops / (t_ours * 1e-6) / 1e12, t_ours / t_bf16);
      table.push_back(buf);
      d.release();
    }
    CK(cudaFree(a16));
    CK(cudaFree(w16));
    CK(cudaFree(c16));
    CK(cudaFree(c32));
    CK(cudaFree(src));
    CK(cudaFree(dst));
  }
  std::printf(
      "\nshape (MxNxK)          G   ours_us  cublas_bf16_us cublas_int8_us copy_us "
      "TOPS_ours ours/bf16\n");
  std::printf("%-19s %5s %9s %9s %11s %9s %8s %7s\n", "MxNxK", "G", "ours", "cuBLASbf16",
              "cuBLASi8", "copy", "TOPS", "ratio");
  for (const auto& l : table) std::printf("%s\n", l.c_str());
  cublasDestroy(cb);
  CK(cudaStreamDestroy(s));
}

// For a profiler (run.sh --ncu): one bf16 launch of each of a few anchor shapes, no checks.
void profile_launches() {
  const int64_t M = 8192;
  const int64_t shapes[][3] = {
      {1024, 1024, 32}, {1024, 2816, 128}, {1024, 1024, 1024}, {32000, 1024, 1024}};
  for (const auto& sh : shapes) {
    Host h{M, sh[0], sh[1], sh[2], {}, {}, {}, {}, {}};
    fill(h, Codes::int8, uint64_t(sh[0] + sh[1] + sh[2]), /*wild_scales=*/false);
    Dev d;
    d.upload(h);
    qg::int8_gemm::launch(problem(h, d, OutType::bf16), 0, "int8_gemm_check");
    CK(cudaDeviceSynchronize());
    std::printf("profiled M=%lld N=%lld K=%lld G=%lld\n", (long long)h.M, (long long)h.N,
                (long long)h.K, (long long)h.G);
    d.release();
  }
}

}  // namespace

int main(int argc, char** argv) {
  // --no-timing: correctness only; --timing-only: the anchors (sampled check + table) only;
  // --ncu: one launch of each profiled shape.
  const bool timing = !(argc > 1 && std::strcmp(argv[1], "--no-timing") == 0);
  const bool checks = !(argc > 1 && std::strcmp(argv[1], "--timing-only") == 0);
  try {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor,
                prop.multiProcessorCount);
    if (argc > 1 && std::strcmp(argv[1], "--ncu") == 0) {
      profile_launches();
      return 0;
    }
    uint64_t seed = 1;
    const int64_t ragged[][3] = {{1, 1, 32},       {7, 129, 64},   {129, 7, 96},  {300, 257, 1024},
                                 {129, 300, 2816}, {1, 300, 1024}, {300, 1, 256}, {257, 130, 512}};
    for (const auto& sh : ragged) {
      if (!checks) break;
      const int64_t M = sh[0], N = sh[1], K = sh[2];
      std::vector<int64_t> groups;
      for (int64_t G : {int64_t(32), int64_t(64), int64_t(128), int64_t(256), K})
        if (K % G == 0 && std::find(groups.begin(), groups.end(), G) == groups.end())
          groups.push_back(G);
      for (int64_t G : groups) {
        full_case(M, N, K, G, Codes::int4, seed++);
        full_case(M, N, K, G, Codes::int8, seed++);
      }
    }
    // Code extremes: |S| and |p| at their bounds (S = 2^22 at G = 256), and G > 256 with
    // groups that are neither 32 nor K.
    for (int64_t G : {int64_t(32), int64_t(256), int64_t(512)}) {
      if (!checks) break;
      full_case(131, 70, 1024, G, Codes::extreme, seed++);
      full_case(131, 70, 1024, G, Codes::max_p, seed++);
    }
    if (checks) {
      full_case(200, 200, 2816, 1408, Codes::int8, seed++);
      full_case(64, 64, 65536, 65536, Codes::max_p, seed++);
    }
    if (timing) {
      mma_ceiling(prop.multiProcessorCount);
      anchors();
    }
  } catch (const qg::Error& e) {
    std::printf("qg::Error: %s\n", e.what());
    return 1;
  }
  std::printf("\nsummary: %d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}
