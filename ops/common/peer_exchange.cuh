// The device side of the peer mailbox (device/peer_mailbox.h): kernels of the ranks on one
// host exchange a few 64-bit words each, in place of a collective between two kernels.
//
// One exchange, in the kernel that needs it:
//   e = peer_next_exchange(m)           every thread that takes part, before anyone advances it
//   peer_put(m, e, i, word)             each writing thread, its words
//   __threadfence_system(); barrier     the words are visible before the flag
//   peer_raise(m, e)                    one thread
//   ok = peer_wait(m, e, err, node)     one thread per block that reads; then a block barrier
//   peer_get(m, e, r, i)                rank r's word i
//   peer_finish_exchange(m, e)          one thread, after every reader has taken e
// The caller folds the ranks' words in rank order, so every rank computes the same result.
#pragma once

#include "device/cuda/device_error.h"
#include "device/peer_mailbox.h"

namespace qg::cuda {

__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ unsigned long long peer_next_exchange(const PeerMailbox& m) {
  return *reinterpret_cast<volatile const unsigned long long*>(m.exchanges) + 1;
}

__device__ __forceinline__ void peer_finish_exchange(const PeerMailbox& m, unsigned long long e) {
  *reinterpret_cast<volatile unsigned long long*>(m.exchanges) = e;
}

// Rank `from`'s slot for exchange e in rank `owner`'s inbox: the flag, then the data words.
__device__ __forceinline__ volatile unsigned long long* peer_slot(const PeerMailbox& m, int owner,
                                                                  unsigned long long e, int from) {
  return m.inbox[owner] + ((e & 1ull) * m.ranks + from) * (m.capacity + 1);
}

// This rank's word i into every inbox (its own included).
__device__ __forceinline__ void peer_put(const PeerMailbox& m, unsigned long long e, int64_t i,
                                         unsigned long long word) {
  for (int p = 0; p < m.ranks; ++p) peer_slot(m, p, e, m.rank)[1 + i] = word;
}

// One thread, after every writer's words are fenced: this rank's flag for e, everywhere.
__device__ __forceinline__ void peer_raise(const PeerMailbox& m, unsigned long long e) {
  __threadfence_system();
  for (int p = 0; p < m.ranks; ++p) peer_slot(m, p, e, m.rank)[0] = e;
}

// One thread: waits until every rank raised its flag for e in this rank's inbox. A rank that
// has not within the mailbox's timeout is recorded (kPeerTimeout, naming it) and false is
// returned; the caller then folds its own words only, and the host raises the record.
__device__ inline bool peer_wait(const PeerMailbox& m, unsigned long long e, DeviceErrorRecord* err,
                                 int32_t node) {
  const double timeout_s = static_cast<double>(m.timeout_ns) * 1e-9;
  volatile unsigned long long* broken = m.broken;
  if (*broken != 0) {  // an earlier wait timed out (value -1: no rank to name)
    report_device_error(err, kPeerTimeout, node, static_cast<int64_t>(e), -1, 0, timeout_s);
    return false;
  }
  const unsigned long long start = global_timer_ns();
  for (int r = 0; r < m.ranks; ++r) {
    volatile unsigned long long* flag = peer_slot(m, m.rank, e, r);
    while (*flag != e) {
      if (global_timer_ns() - start > m.timeout_ns) {
        *broken = 1;
        report_device_error(err, kPeerTimeout, node, static_cast<int64_t>(e), r, 0, timeout_s);
        return false;
      }
      __nanosleep(64);
    }
  }
  __threadfence();  // the data words are read after the flags
  return true;
}

__device__ __forceinline__ unsigned long long peer_get(const PeerMailbox& m, unsigned long long e,
                                                       int from, int64_t i) {
  return peer_slot(m, m.rank, e, from)[1 + i];
}

// The order of obsmath::ordered_min / ordered_max as integers (-0 below +0; infinities
// included), and back.
__device__ __forceinline__ int32_t order_key(float v) {
  int32_t b = __float_as_int(v);
  return b ^ ((b >> 31) & 0x7fffffff);
}
__device__ __forceinline__ float key_float(int32_t k) {
  return __int_as_float(k ^ ((k >> 31) & 0x7fffffff));
}

// A range [mn, mx] (zero signs settled) as one mailbox word: mn's key high, mx's key low.
// Every kernel that syncs a range sends it this way (a per-tensor observer's word 0, its
// non-finite count in word 1), so a fused and an unfused node agree on the format.
__device__ __forceinline__ unsigned long long range_word(float mn, float mx) {
  return (static_cast<unsigned long long>(static_cast<uint32_t>(order_key(mn))) << 32) |
         static_cast<uint32_t>(order_key(mx));
}

// The ranks' range words folded: the least min and the greatest max (exact, order-free).
struct RangeFold {
  int32_t lo = INT32_MAX, hi = INT32_MIN;
  __device__ __forceinline__ void add(unsigned long long w) {
    lo = min(lo, static_cast<int32_t>(static_cast<uint32_t>(w >> 32)));
    hi = max(hi, static_cast<int32_t>(static_cast<uint32_t>(w)));
  }
  __device__ __forceinline__ float mn() const { return key_float(lo); }
  __device__ __forceinline__ float mx() const { return key_float(hi); }
};

}  // namespace qg::cuda
