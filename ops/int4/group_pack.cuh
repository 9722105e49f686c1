// One-pass group quantize + pack for the 4-bit formats (INT4, NF4) on CUDA, used when the
// groups are contiguous and whole: groups along the last axis, axis_len % group_size == 0,
// group_size a multiple of 8, x 16-byte and the packed buffer 4-byte aligned. A team of
// `tpg` lanes (a power of two <= 32) owns one group: each lane loads up to V packs of 8
// elements into registers (V <= 8), the team reduces the group's statistics with shuffles
// (min, max and absmax are exact, so the order does not matter), every lane derives the
// group's parameters with the shared math, encodes its packs from the registers and writes
// 4 bytes (8 codes) per pack. Lane 0 writes the group's parameters. The input is read once.
//
// A Codec<M> supplies: setup() (run once per block by every thread), Stats, init(), add(Stats, M),
// reduce(Stats, team) (team_reduce of each field), Params params(const Stats&, int64_t group, bool
// write), encode(M, const Params&) (the code, in [0, 15]), kMaxPacksPerLane (more packs per lane
// keep more loads in flight; fewer leave registers and warps for a costly encode),
// kMaxPacksPerLane16 (the same for 16-bit types, whose packs take half the registers) and
// kMinBlocksPerSm / kMinBlocksPerSm16 (the register bound of the launch, per type). With
// kPairStats it also supplies Stats2, init2<T>(), add2<T>(Stats2, word) and fold2<T>(Stats2)
// -> Stats: the statistics of a 16-bit type two elements per instruction (cuda_rows.cuh).
// With kFiniteFastPath it also supplies add_any(Stats, M) / add2_any<T>(Stats2, word) (the
// statistics without the finite filter: NaN skipped, +/-Inf kept), saw_inf(Stats) (true when
// those statistics took a +/-Inf) and, for groups without +/-Inf, encode_finite(M, Params)
// (uint32_t) and finite_bias(Params): see process().
#pragma once

#include <type_traits>

#include "ops/common/cuda_rows.cuh"
#include "ops/common/cuda_vec.cuh"
#include "ops/int4/int4_math.h"

namespace qg::cuda {

// A pack of 8 elements in registers; a 16-bit type's as 4 words of two elements, each
// widened to f32 by one instruction.
template <typename T>
struct RegPack {
  Pack8<T> p;
  __device__ __forceinline__ math_of<T> get(int e) const { return to_math(p.v[e]); }
};
template <typename T>
struct RegWords {
  uint32_t w[4];
  __device__ __forceinline__ float get(int e) const {
    return e % 2 == 0 ? low_as_float<T>(w[e / 2]) : high_as_float<T>(w[e / 2]);
  }
};
template <typename T>
using RegPackOf = std::conditional_t<sizeof(T) == 2, RegWords<T>, RegPack<T>>;

template <typename T>
__device__ __forceinline__ RegPackOf<T> load_regs(const T* __restrict__ p, int64_t b) {
  RegPackOf<T> r;
  if constexpr (sizeof(T) == 2) {
    const uint4 u = reinterpret_cast<const uint4*>(p)[b];
    r.w[0] = u.x;
    r.w[1] = u.y;
    r.w[2] = u.z;
    r.w[3] = u.w;
  } else {
    r.p = reinterpret_cast<const Pack8<T>*>(p)[b];
  }
  return r;
}

// One step of a lane's statistics: add / add2 (the finite filter) or, kAny, add_any /
// add2_any (see kFiniteFastPath).
template <bool kAny, typename Codec, typename S, typename M>
__device__ __forceinline__ S add_value(const Codec& codec, S s, M v) {
  if constexpr (kAny)
    return codec.add_any(s, v);
  else
    return codec.add(s, v);
}
template <bool kAny, typename T, typename Codec, typename S2>
__device__ __forceinline__ S2 add_word(const Codec& codec, S2 s, uint32_t w) {
  if constexpr (kAny)
    return codec.template add2_any<T>(s, w);
  else
    return codec.template add2<T>(s, w);
}

// The 8 codes of a pack, code e in nibble e (low_first: the even element in the low nibble
// of its byte): word = sum of code_e * 16^e, one shift-add (LEA) per code. encode gives the
// codes in [0, 15]; kFinite: encode_finite gives c_e - b_e (possibly negative) with the
// nibbles b_e of finite_bias (a code's constant part, e.g. the symmetric zero point): the
// sum is linear modulo 2^32, so adding the bias once gives the same word. That sum runs
// from the last code down (word * 16 + c), so no code is shifted itself (the compiler masks
// a shifted 16-bit cvt result to 16 bits first).
template <bool kFinite, typename Codec, typename Regs, typename Params>
__device__ __forceinline__ uint32_t pack_codes(const Codec& codec, const Regs& r, const Params& p) {
  uint32_t word = 0;
  if constexpr (kFinite) {
#pragma unroll
    for (int e = 7; e >= 0; --e) word = (word << 4) + codec.encode_finite(r.get(e), p);
    word += codec.finite_bias(p);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) word += static_cast<uint32_t>(codec.encode(r.get(e), p)) << (4 * e);
  }
  return word;
}

// kFull: every lane holds exactly V packs (ppt == V), so no pack needs a bound check (the
// checked loops spend an ISETP and a BSSY/BRA/BSYNC per pack in each pass).
//
// Each lane handles only V * 8 elements per round (32 for the INT4 g128 teams), so the
// per-thread work around the packs (group index, addresses, reduction, parameters) weighs
// as much as the per-element work; it is written for few instructions: the group index is
// 64-bit once per round (block_groups = rounds * groups per block, from the host), each
// pack's address is one 32-bit step from the previous one, and a team past the last group
// loads the last group instead of branching around every pack (its results are dropped
// after the team reduction, which every lane of the warp must join). Executed
// instructions per warp on the INT4 g128 path (4 lanes x 4 packs = 32 elements per lane;
// SASS, sm_90; symmetric / asymmetric): bf16 and f16 396 / 419 -> 355 / 376 with these
// changes, -> 282 / 333 with kFiniteFastPath (383 / 403 for a warp holding a +/-Inf); f32
// 390 / 450 -> 262 / 348.
template <typename T, int V, bool kFull, typename Codec>
__global__ void __launch_bounds__(256, sizeof(T) == 2 ? Codec::kMinBlocksPerSm16
                                                      : Codec::kMinBlocksPerSm)
    group_pack_kernel(const T* __restrict__ x, uint8_t* __restrict__ packed, int64_t ngroups,
                      int group_size, int tpg_log2, int rounds, int64_t block_groups,
                      bool high_first, Codec codec) {
  constexpr bool kPairs = sizeof(T) == 2 && Codec::kPairStats;
  using Regs = RegPackOf<T>;
  codec.setup();  // block-wide (may fill shared tables and sync)
  // tpg = 2^tpg_log2: shifts, where divisions by a runtime tpg cost ~50 instructions per
  // thread (about one per element of a lane).
  const int tpg = 1 << tpg_log2, groups_per_block = static_cast<int>(blockDim.x >> tpg_log2);
  const int team = static_cast<int>(threadIdx.x >> tpg_log2);
  const int lane = static_cast<int>(threadIdx.x & static_cast<unsigned>(tpg - 1));
  const int ppt = (group_size / 8) >> tpg_log2;
  auto load = [&](int64_t q, Regs(&v)[V]) {
    // Pack lane + j * tpg of the group: one pointer step (IMAD.WIDE) per pack.
    const T* gx = x + (q < ngroups ? q : ngroups - 1) * group_size + lane * 8;
#pragma unroll
    for (int j = 0; j < V; ++j, gx += 8 * tpg)
      if (kFull || j < ppt) v[j] = load_regs<T>(gx, 0);
  };
  // The lane's statistics; kAny: those of add_any / add2_any (no finite filter).
  auto lane_stats = [&](auto any_tag, const Regs(&v)[V]) {
    constexpr bool kAny = decltype(any_tag)::value && Codec::kFiniteFastPath;
    typename Codec::Stats st = codec.init();
    if constexpr (kPairs) {
      auto st2 = codec.template init2<T>();
#pragma unroll
      for (int j = 0; j < V; ++j)
        if (kFull || j < ppt) {
#pragma unroll
          for (int k = 0; k < 4; ++k) st2 = add_word<kAny, T>(codec, st2, v[j].w[k]);
        }
      st = codec.template fold2<T>(st2);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j)
        if (kFull || j < ppt) {
#pragma unroll
          for (int e = 0; e < 8; ++e) st = add_value<kAny>(codec, st, v[j].get(e));
        }
    }
    return st;
  };
  auto process = [&](int64_t q, const Regs(&v)[V]) {
    // kFiniteFastPath: when no lane of the warp saw +/-Inf, the unfiltered statistics are
    // the filtered ones (the only other non-finite value, NaN, is skipped by both) and the
    // codes take encode_finite; otherwise (a uniform branch) the statistics are taken
    // again with the filter and the codes with encode.
    typename Codec::Stats st;
    bool finite = false;
    if constexpr (Codec::kFiniteFastPath) {
      st = lane_stats(std::true_type{}, v);
      finite = !__any_sync(0xffffffffu, codec.saw_inf(st));  // every lane of the warp
    }
    if (!finite) st = lane_stats(std::false_type{}, v);
    st = codec.reduce(st, tpg);  // every lane of the warp takes part
    if (q >= ngroups) return;
    const auto p = codec.params(st, q, lane == 0);
    auto encode_packs = [&](auto finite_tag) {
      constexpr bool kFinite = decltype(finite_tag)::value && Codec::kFiniteFastPath;
      uint32_t* out = reinterpret_cast<uint32_t*>(packed + q * (group_size / 2)) + lane;
#pragma unroll
      for (int j = 0; j < V; ++j)
        if (kFull || j < ppt) {
          uint32_t word = pack_codes<kFinite>(codec, v[j], p);
          // high_first: swap the two nibbles of every byte (one branch per 8 codes,
          // uniform).
          if (high_first) word = ((word & 0x0f0f0f0fu) << 4) | ((word >> 4) & 0x0f0f0f0fu);
          *out = word;
          out += tpg;
        }
    };
    if constexpr (Codec::kFiniteFastPath) {
      if (finite) {
        encode_packs(std::true_type{});
        return;
      }
    }
    encode_packs(std::false_type{});
  };
  // Block b handles `rounds` consecutive rounds of groups_per_block groups (block_groups
  // groups in all). Pipelined codecs load the next round while the current one is reduced
  // and encoded (two register buffers, alternating); the trip count is the same for every
  // thread of the block. Others run exactly one round per block (the launcher's rounds is
  // 1), with no loop around it.
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * block_groups + team;
  if constexpr (Codec::kPipelined) {
    auto round_start = [&](int r) { return q0 + int64_t{r} * groups_per_block; };
    Regs v0[V], v1[V];
    load(round_start(0), v0);
    for (int r = 0; r < rounds; r += 2) {
      if (r + 1 < rounds) load(round_start(r + 1), v1);
      process(round_start(r), v0);
      if (r + 1 < rounds) {
        if (r + 2 < rounds) load(round_start(r + 2), v0);
        process(round_start(r + 1), v1);
      }
    }
  } else {
    Regs v[V];
    load(q0, v);
    process(q0, v);
  }
}

// Team shape of a group of `packs` packs of 8: the fewest lanes (a power of two dividing
// `packs`, <= 32) that leave at most `max_per_lane` (<= 8) packs per lane; lanes = 0 when
// none does.
struct GroupTeam {
  int lanes, packs_per_lane, lanes_log2;
};
inline GroupTeam group_team(int64_t packs, int max_per_lane) {
  for (int log2 = 0; log2 <= 5; ++log2) {
    const int lanes = 1 << log2;
    if (packs % lanes == 0 && packs / lanes <= max_per_lane)
      return {lanes, static_cast<int>(packs / lanes), log2};
  }
  return {0, 0, 0};
}

// Launches the one-pass kernel when `l` and the pointers allow it; false otherwise.
template <typename T, typename Codec>
bool launch_group_pack(const ScopeLayout& l, const T* x, uint8_t* packed, bool high_first,
                       const Codec& codec, cudaStream_t s) {
  if (l.inner != 1 || l.group_size % 8 != 0 || l.axis_len % l.group_size != 0 ||
      l.group_size > (int64_t{1} << 20) || l.num_qparams == 0 || !aligned16(x) ||
      (reinterpret_cast<uintptr_t>(packed) & 3u) != 0)
    return false;
  constexpr int kMaxPerLane = sizeof(T) == 2 ? Codec::kMaxPacksPerLane16 : Codec::kMaxPacksPerLane;
  static_assert(kMaxPerLane <= 8, "group_pack_kernel instances go up to 8 packs per lane");
  const GroupTeam t = group_team(l.group_size / 8, kMaxPerLane);
  if (t.lanes == 0) return false;
  const int gs = static_cast<int>(l.group_size);
  const int64_t groups_per_block = 256 / t.lanes;
  const int64_t total_rounds = (l.num_qparams + groups_per_block - 1) / groups_per_block;
  // One round per block (not pipelined) must fit the grid's x dimension.
  if (!Codec::kPipelined && total_rounds > int64_t{INT32_MAX}) return false;
  auto go = [&](auto kernel) {
    // Pipelined codecs: one wave of resident blocks, each streaming an equal share of the
    // rounds (a block's first load is the only one not hidden). Others: one round each.
    int64_t blocks = total_rounds;
    if (Codec::kPipelined) {
      int per_sm = 0;
      QG_CUDA_CHECK("group_pack",
                    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 256, 0));
      const int64_t resident = int64_t{per_sm > 0 ? per_sm : 1} * multiprocessor_count();
      blocks = total_rounds < resident ? total_rounds : resident;
    }
    const int64_t rounds = (total_rounds + blocks - 1) / blocks;
    blocks = (total_rounds + rounds - 1) / rounds;
    kernel<<<static_cast<unsigned>(blocks), 256, 0, s>>>(
        x, packed, l.num_qparams, gs, t.lanes_log2, static_cast<int>(rounds),
        rounds * groups_per_block, high_first, codec);
  };
  // 1 and 2 packs per lane are always full; 3 runs the checked 4-pack kernel, 5..7 the
  // checked 8-pack one.
  const int ppl = t.packs_per_lane;
  if (ppl == 1)
    go(group_pack_kernel<T, 1, true, Codec>);
  else if (ppl == 2)
    go(group_pack_kernel<T, 2, true, Codec>);
  else if (ppl <= 4)
    go(ppl == 4 ? group_pack_kernel<T, 4, true, Codec> : group_pack_kernel<T, 4, false, Codec>);
  else if constexpr (kMaxPerLane > 4)
    go(ppl == 8 ? group_pack_kernel<T, 8, true, Codec> : group_pack_kernel<T, 8, false, Codec>);
  return true;
}

}  // namespace qg::cuda
