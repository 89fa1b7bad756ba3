// Expert parallelism's layout (which ranks each token goes to, its send rows grouped by rank, tokens ascending within a
// rank), as device functions of a block of whole warps, a thread per token: mb_ep_layout's kernels
// (stages/ep_dispatch.cu) and the nvlink dispatch that lays its tokens out itself (stages/ep_nvlink.cu) share them.
// A block's steps (lay_out_tokens): each thread's rank mask (rank_mask), a warp ballot per rank for the warp's rows
// (count_warp_rows), lane d of warp 0 turning rank d's rows per warp into each warp's first send row (first_rows),
// then every lane its slots (write_slots).
#pragma once

#include <cstdint>

#include "common/common.cuh"

namespace mbk {

constexpr int kMaxRanks = 32;  // a token's ranks are one 32-bit mask

// The ranks token t goes to, as a bit mask (ids outside [0, ep * per_rank) go nowhere).
__device__ __forceinline__ uint32_t rank_mask(const int32_t* ids, int t, int top_k, int ep, int per_rank) {
  uint32_t m = 0;
  for (int j = 0; j < top_k; ++j) {
    const int x = ids[static_cast<int64_t>(t) * top_k + j];
    if (x >= 0 && x < ep * per_rank) m |= 1u << (x / per_rank);
  }
  return m;
}

// A global top-k id made local to the rank holding experts [first, first + per_rank): -1 for another rank's expert
// (what every dispatch writes for the experts of the rank a row lands on).
__device__ __forceinline__ int local_expert(int id, int first, int per_rank) {
  const int x = id - first;
  return x >= 0 && x < per_rank ? x : -1;
}

// Lane 0 of each warp: how many of the warp's tokens go to each rank (mask bit d) into rows[d].
__device__ __forceinline__ void count_warp_rows(uint32_t m, int ep, int* rows) {
  for (int d = 0; d < ep; ++d) {
    const unsigned b = __ballot_sync(0xffffffffu, (m >> d) & 1u);
    if (threadIdx.x % 32 == 0) rows[d] = __popc(b);
  }
}

// Warp 0 (every lane; lane d < ep holds rank d's `total` rows over every token and the `before` of them in earlier
// blocks): warp_rows[w][d], the block's rows per (warp, rank), become each warp's first send row: the ranks' totals
// prefixed over the lanes (rank d's segment start) + before + the rows of the warps before w. Where given,
// send_counts[d] = total and segment_start[d] = rank d's segment start (segment_start[ep]: the rows in all).
__device__ __forceinline__ void first_rows(int (*warp_rows)[kMaxRanks], int warps, int ep, int total, int before,
                                           int32_t* __restrict__ send_counts, int* segment_start) {
  const int lane = threadIdx.x % 32;
  const int incl = mb::warp_inclusive_scan(lane < ep ? total : 0);
  if (lane >= ep) return;
  if (send_counts) send_counts[lane] = total;
  if (segment_start) {
    segment_start[lane] = incl - total;
    if (lane == ep - 1) segment_start[ep] = incl;
  }
  int at = incl - total + before;
  for (int w = 0; w < warps; ++w) {
    const int n = warp_rows[w][lane];
    warp_rows[w][lane] = at;
    at += n;
  }
}

// Token t's send row for each rank d: the warp's first slot for d (first[d]) plus the lane's place among the warp's
// tokens going there (send_tokens[slot] = t), or -1, into token_slots where given. Every lane calls it (the ballots);
// tokens past num_tokens write nothing.
__device__ __forceinline__ void write_slots(uint32_t m, int t, int num_tokens, int ep, const int* first,
                                            int32_t* send_tokens, int32_t* __restrict__ token_slots) {
  const unsigned below = (1u << (threadIdx.x % 32)) - 1u;
  for (int d = 0; d < ep; ++d) {
    const unsigned b = __ballot_sync(0xffffffffu, (m >> d) & 1u);
    if (t < num_tokens) {
      int slot = -1;
      if ((m >> d) & 1u) {
        slot = first[d] + __popc(b & below);
        send_tokens[slot] = t;
      }
      if (token_slots) token_slots[static_cast<int64_t>(t) * ep + d] = slot;
    }
  }
}

// Lane d < ep (of any warp): rank d's rows over the block's `warps` warps (warp_rows[w][d], count_warp_rows'); 0 on
// the other lanes.
__device__ __forceinline__ int block_rows(const int (*warp_rows)[kMaxRanks], int warps, int ep) {
  const int lane = threadIdx.x % 32;
  int rows = 0;
  if (lane < ep)
    for (int w = 0; w < warps; ++w) rows += warp_rows[w][lane];
  return rows;
}

// The steps above for a block's tokens, thread t's token t (every thread calls it; blockDim.x whole warps; warp_rows
// the block's shared [warps][kMaxRanks]). block_counts NULL: the block's tokens are all of them; else the count
// kernel's rows per (block, rank), which place block blockIdx.x after the earlier blocks of the grid. send_counts,
// segment_start (first_rows') and token_slots are written where given.
__device__ __forceinline__ void lay_out_tokens(const int32_t* __restrict__ ids, int t, int num_tokens, int top_k,
                                               int ep, int per_rank, const int32_t* __restrict__ block_counts,
                                               int (*warp_rows)[kMaxRanks], int32_t* __restrict__ send_counts,
                                               int* segment_start, int32_t* send_tokens,
                                               int32_t* __restrict__ token_slots) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const uint32_t m = t < num_tokens ? rank_mask(ids, t, top_k, ep, per_rank) : 0u;
  count_warp_rows(m, ep, warp_rows[warp]);
  __syncthreads();
  if (warp == 0) {
    int total = 0, before = 0;
    if (!block_counts) {
      total = block_rows(warp_rows, warps, ep);
    } else if (lane < ep) {
      for (int b = 0; b < static_cast<int>(gridDim.x); ++b) {
        const int n = block_counts[static_cast<int64_t>(b) * ep + lane];
        total += n;
        if (b < static_cast<int>(blockIdx.x)) before += n;
      }
    }
    first_rows(warp_rows, warps, ep, total, before, send_counts, segment_start);
  }
  __syncthreads();
  write_slots(m, t, num_tokens, ep, warp_rows[warp], send_tokens, token_slots);
}

}  // namespace mbk
