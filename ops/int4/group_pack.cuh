// One-pass group quantize + pack for the 4-bit formats (INT4, NF4) on CUDA, used when the
// groups are contiguous and whole: groups along the last axis, axis_len % group_size == 0,
// group_size a multiple of 8, x 16-byte and the packed buffer 4-byte aligned. A team of
// `tpg` lanes (a power of two <= 32) owns one group: each lane loads up to V packs of 8
// elements into registers, the team reduces the group's statistics with shuffles (min, max
// and absmax are exact, so the order does not matter), every lane derives the group's
// parameters with the shared math, encodes its packs from the registers and writes 4 bytes
// (8 codes) per pack. Lane 0 writes the group's parameters. The input is read once.
//
// A Codec<M> supplies: setup() (run once per block by every thread), Stats, init(), add(Stats, M),
// reduce(Stats, team) (team_reduce of each field), Params params(const Stats&, int64_t group, bool
// write), uint8_t encode(M, const Params&) and kMaxPacksPerLane (more packs per lane keep more
// loads in flight; fewer leave registers and warps for a costly encode).
#pragma once

#include "ops/common/cuda_vec.cuh"
#include "ops/int4/int4_math.h"

namespace qg::cuda {

template <typename T, int V, typename Codec>
__global__ void __launch_bounds__(256, Codec::kMinBlocksPerSm)
    group_pack_kernel(const T* __restrict__ x, uint8_t* __restrict__ packed, int64_t ngroups,
                      int group_size, int tpg, int rounds, bool high_first, Codec codec) {
  using M = math_of<T>;
  codec.setup();  // block-wide (may fill shared tables and sync)
  const int groups_per_block = blockDim.x / tpg, team = threadIdx.x / tpg;
  const int lane = threadIdx.x % tpg, ppt = group_size / 8 / tpg;
  // Nibble offset of code e of a pack in its 32-bit word: byte e / 2, low or high nibble by
  // e's parity (a pack starts on an even element) and the nibble order.
  const int even_shift = high_first ? 4 : 0, odd_shift = 4 - even_shift;
  auto load = [&](int64_t g0, Pack8<T>(&v)[V]) {
    const int64_t q = g0 + team;
    if (q >= ngroups) return;
    const Pack8<T>* gx = reinterpret_cast<const Pack8<T>*>(x + q * group_size);
#pragma unroll
    for (int j = 0; j < V; ++j)
      if (j < ppt) v[j] = gx[lane + j * tpg];
  };
  auto process = [&](int64_t g0, const Pack8<T>(&v)[V]) {
    const int64_t q = g0 + team;
    const bool valid = q < ngroups;
    typename Codec::Stats st = codec.init();
#pragma unroll
    for (int j = 0; j < V; ++j)
      if (valid && j < ppt) {
#pragma unroll
        for (int e = 0; e < 8; ++e) st = codec.add(st, to_math(v[j].v[e]));
      }
    st = codec.reduce(st, tpg);  // every lane of the warp takes part
    if (!valid) return;
    const auto p = codec.params(st, q, lane == 0);
    uint32_t* out = reinterpret_cast<uint32_t*>(packed + q * (group_size / 2));
#pragma unroll
    for (int j = 0; j < V; ++j)
      if (j < ppt) {
        uint32_t word = 0;
#pragma unroll
        for (int e = 0; e < 8; ++e)
          word |= static_cast<uint32_t>(codec.encode(to_math(v[j].v[e]), p))
                  << (8 * (e / 2) + (e % 2 == 0 ? even_shift : odd_shift));
        out[lane + j * tpg] = word;
      }
  };
  // Block b handles `rounds` consecutive rounds of groups_per_block groups. Pipelined
  // codecs load the next round while the current one is reduced and encoded (two register
  // buffers, alternating); the trip count is the same for every thread of the block.
  const int64_t first = int64_t{blockIdx.x} * rounds * groups_per_block;
  auto round_start = [&](int r) { return first + int64_t{r} * groups_per_block; };
  if constexpr (Codec::kPipelined) {
    Pack8<T> v0[V], v1[V];
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
    for (int r = 0; r < rounds; ++r) {
      Pack8<T> v[V];
      load(round_start(r), v);
      process(round_start(r), v);
    }
  }
}

// Team shape of a group of `packs` packs of 8: the fewest lanes (a power of two dividing
// `packs`, <= 32) that leave at most `max_per_lane` (<= 4) packs per lane; lanes = 0 when
// none does.
struct GroupTeam {
  int lanes, packs_per_lane;
};
inline GroupTeam group_team(int64_t packs, int max_per_lane) {
  for (int lanes = 1; lanes <= 32; lanes *= 2)
    if (packs % lanes == 0 && packs / lanes <= max_per_lane)
      return {lanes, static_cast<int>(packs / lanes)};
  return {0, 0};
}

// Launches the one-pass kernel when `l` and the pointers allow it; false otherwise.
template <typename T, typename Codec>
bool launch_group_pack(const ScopeLayout& l, const T* x, uint8_t* packed, bool high_first,
                       const Codec& codec, cudaStream_t s) {
  if (l.inner != 1 || l.group_size % 8 != 0 || l.axis_len % l.group_size != 0 ||
      l.group_size > (int64_t{1} << 20) || l.num_qparams == 0 || !aligned16(x) ||
      (reinterpret_cast<uintptr_t>(packed) & 3u) != 0)
    return false;
  const GroupTeam t = group_team(l.group_size / 8, Codec::kMaxPacksPerLane);
  if (t.lanes == 0) return false;
  const int gs = static_cast<int>(l.group_size);
  auto go = [&](auto kernel) {
    // Pipelined codecs: one wave of resident blocks, each streaming an equal share of the
    // rounds (a block's first load is the only one not hidden). Others: one round each.
    const int64_t groups_per_block = 256 / t.lanes;
    const int64_t total_rounds = (l.num_qparams + groups_per_block - 1) / groups_per_block;
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
        x, packed, l.num_qparams, gs, t.lanes, static_cast<int>(rounds), high_first, codec);
  };
  if (t.packs_per_lane == 1)
    go(group_pack_kernel<T, 1, Codec>);
  else if (t.packs_per_lane == 2)
    go(group_pack_kernel<T, 2, Codec>);
  else
    go(group_pack_kernel<T, 4, Codec>);
  return true;
}

}  // namespace qg::cuda
