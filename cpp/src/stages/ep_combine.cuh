// Expert parallelism's per-token sum of the partial rows that came back (mb_ep_combine after the nccl return
// all-to-all, mb_ep_nvlink_combine after the nvlink return's signals): out[t] = sum over ranks d ascending of the
// partial row returned by d, in fp32, rounded once, so the order never depends on timing.
// A warp per (token, column chunk of 32 lanes x kChunkUnroll vectors); each lane loads its kChunkUnroll vectors
// of a rank's row before adding them, so a decode step's one token still spreads over many warps with many loads
// in flight. The warps stride over the items, so any grid gives the same result (chunk_grid).
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/common.cuh"

namespace mbk {

// The chunks every expert-parallel copy and sum walks (here, stages/ep_nvlink.cu and stages/ep_permute.cu): 32
// lanes x kChunkUnroll vectors of a row, each lane holding kChunkUnroll vectors in flight.
constexpr int kChunkUnroll = 4;

template <int VEC>
__host__ __device__ constexpr int chunks_per_row(int hidden) {
  return (hidden / VEC + 32 * kChunkUnroll - 1) / (32 * kChunkUnroll);
}

// int32s per received row's meta (recv_meta): its K global expert ids, its K weights' bits, and its token index in
// the source's call (where combine_with_unpermute's rows go back: the source's returned[token * K + k]).
__host__ __device__ constexpr int meta_ints(int top_k) { return 2 * top_k + 1; }

// Chunk `c` of a row, loaded: every lane's kChunkUnroll vectors (those inside the row).
template <typename T, int VEC>
struct Chunk {
  mb::Vec<T, VEC> v[kChunkUnroll];
};

template <typename T, int VEC>
__device__ __forceinline__ Chunk<T, VEC> load_chunk(const T* __restrict__ src, int hidden, int c, int lane) {
  const mb::Vec<T, VEC>* s = reinterpret_cast<const mb::Vec<T, VEC>*>(src);
  const int n = hidden / VEC, v0 = c * 32 * kChunkUnroll + lane;
  Chunk<T, VEC> buf;
#pragma unroll
  for (int u = 0; u < kChunkUnroll; ++u)
    if (v0 + 32 * u < n) buf.v[u] = s[v0 + 32 * u];
  return buf;
}

template <typename T, int VEC>
__device__ __forceinline__ void store_chunk(const Chunk<T, VEC>& buf, T* __restrict__ dst, int hidden, int c,
                                            int lane) {
  mb::Vec<T, VEC>* d = reinterpret_cast<mb::Vec<T, VEC>*>(dst);
  const int n = hidden / VEC, v0 = c * 32 * kChunkUnroll + lane;
#pragma unroll
  for (int u = 0; u < kChunkUnroll; ++u)
    if (v0 + 32 * u < n) d[v0 + 32 * u] = buf.v[u];
}

// Chunk `c` of a row, src -> dst: every lane loads its kChunkUnroll vectors first, then stores them.
template <typename T, int VEC>
__device__ __forceinline__ void copy_chunk(const T* __restrict__ src, T* __restrict__ dst, int hidden, int c,
                                           int lane) {
  store_chunk<T, VEC>(load_chunk<T, VEC>(src, hidden, c, lane), dst, hidden, c, lane);
}

// Chunk `c` of a row set to zero.
template <typename T, int VEC>
__device__ __forceinline__ void zero_chunk(T* __restrict__ dst, int hidden, int c, int lane) {
  Chunk<T, VEC> z;
#pragma unroll
  for (int u = 0; u < kChunkUnroll; ++u)
#pragma unroll
    for (int k = 0; k < VEC; ++k) z.v[u].v[k] = mb::from_f32<T>(0.0f);
  store_chunk<T, VEC>(z, dst, hidden, c, lane);
}

template <typename T, int VEC>
__device__ __forceinline__ void combine_tokens(const T* __restrict__ returned, const int32_t* __restrict__ token_slots,
                                               int num_tokens, int hidden, int ep, T* __restrict__ out) {
  using R = mb::Raw<T, VEC>;
  const int lane = threadIdx.x % 32, chunks = chunks_per_row<VEC>(hidden);
  const int nvec = hidden / VEC;
  const int64_t items = static_cast<int64_t>(num_tokens) * chunks;
  for (int64_t it = blockIdx.x * static_cast<int64_t>(mb::kStageWarps) + threadIdx.x / 32; it < items;
       it += static_cast<int64_t>(gridDim.x) * mb::kStageWarps) {
    const int64_t t = it / chunks;
    const int v0 = static_cast<int>(it % chunks) * 32 * kChunkUnroll + lane;
    const int32_t* slots = token_slots + t * ep;
    float acc[kChunkUnroll][VEC];
#pragma unroll
    for (int u = 0; u < kChunkUnroll; ++u)
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[u][k] = 0.0f;
    for (int d = 0; d < ep; ++d) {
      const int slot = slots[d];
      if (slot < 0) continue;
      const R* row = reinterpret_cast<const R*>(returned + static_cast<int64_t>(slot) * hidden);
      R x[kChunkUnroll];
#pragma unroll
      for (int u = 0; u < kChunkUnroll; ++u)
        if (v0 + 32 * u < nvec) x[u] = row[v0 + 32 * u];
#pragma unroll
      for (int u = 0; u < kChunkUnroll; ++u)
        if (v0 + 32 * u < nvec) {
#pragma unroll
          for (int k = 0; k < VEC; ++k) acc[u][k] += mb::raw_f32<T>(x[u], k);
        }
    }
#pragma unroll
    for (int u = 0; u < kChunkUnroll; ++u)
      if (v0 + 32 * u < nvec) mb::store_f32<T, VEC>(out + t * hidden + (v0 + 32 * u) * VEC, acc[u]);
  }
}

// The grid of a warp-per-item loop: a block per kStageWarps items, at most 8 per SM, at most max_sms where given
// (> 0); at least one block (a kernel that signals or waits runs with nothing to move too).
inline int chunk_grid(int64_t items, int max_sms) {
  const int64_t sms = mb::device_attribute(cudaDevAttrMultiProcessorCount);
  int64_t grid = std::min<int64_t>((items + mb::kStageWarps - 1) / mb::kStageWarps, sms * 8);
  if (max_sms > 0) grid = std::min<int64_t>(grid, max_sms);
  return static_cast<int>(std::max<int64_t>(1, grid));
}

}  // namespace mbk
