// Seed 004's dispatch_with_permute on the receiving side of the `nvlink` dispatch (moe_build/runner/dispatch/
// nvlink.py): the rows mb_ep_nvlink_dispatch landed in this rank's recv slots (stages/ep_nvlink.cu), expanded to
// one row per (row, local expert) pair and grouped by local expert, in the layout the grouped GEMMs read through
// their expert offsets, so the experts run no routing prologue and no expansion of their own:
//   contiguous: expert e's rows start at expert_offsets[e], its count rounded up to pad_multiple (the rows past
//               the count are padding: the GEMMs compute them, nothing reads them back);
//   batched   : expert e's rows start at e * expert_capacity (seed 000's experts x max rows); pairs past an
//               expert's capacity are dropped, raise *overflow, and send their source a zero row (the token then
//               lacks that expert's part, no memory is corrupted).
// Each row of the layout records where its expert output goes back (combine_with_unpermute): row_src_rank (-1 for
// padding) and row_return, the pair's index token * K + k in the source's `returned`, which mb_ep_nvlink_return
// writes (up to the layout's end, expert_offsets[E], read on the device); the source then weights and sums every
// token's K rows with mb_finalize, in k order, as a single GPU's separate finalize does.
//   mb_ep_permute_layout: one block (waiting for the rows to land, flags[0], where given them): counts each
//                         local expert's pairs, lays out the groups (a block-wide scan), gives every pair its row
//                         (pair_row, one shared-memory atomic per pair: the order within a group follows the
//                         atomics, which no row's GEMM output depends on) and marks the padding rows.
//   mb_ep_permute_rows  : a warp per (received row, column chunk) copies the chunk to each of its pairs' rows.
// The received rows are the nvlink receive slots (source s's i-th row at s * cap + i), or with cap 0 dense, source
// after source, as the nccl dispatch's exact-size all-to-all lands them (its combine zeroes dropped pairs itself).
#include "common/common.cuh"
#include "stages/ep_combine.cuh"
#include "stages/ep_layout.cuh"
#include "stages/ep_signal.cuh"

namespace {

constexpr int kMaxRanks = 32;
constexpr int kLayoutThreads = 1024;
constexpr int kMaxLocalExperts = kLayoutThreads;  // one expert per thread in the scan
constexpr int kPairDropped = -2;                   // pair_row: over its expert's batched capacity
using mbk::chunks_per_row;
using mbk::meta_ints;

// Source s and slot of the r-th received row, sources in rank order (start: their prefix sums): s * cap + i in the
// nvlink receive slots (cap 0: dense, the rows of each source right after the previous one's, as nccl's
// exact-size all-to-all lands them: slot r).
__device__ __forceinline__ int64_t slot_of(const int* start, int cap, int r, int& s) {
  s = 0;
  while (start[s + 1] <= r) ++s;
  return cap ? static_cast<int64_t>(s) * cap + (r - start[s]) : r;
}

__global__ void __launch_bounds__(kLayoutThreads)
permute_layout_kernel(const int32_t* __restrict__ recv_meta, const int32_t* __restrict__ recv_counts, int ep,
                      int cap, int top_k, int first_expert, int local_experts, int pad_multiple,
                      int expert_capacity, int64_t* __restrict__ expert_offsets, int32_t* __restrict__ expert_counts,
                      int32_t* __restrict__ pair_row, int32_t* __restrict__ row_src_rank,
                      int32_t* __restrict__ row_return, int32_t* __restrict__ overflow,
                      int32_t* __restrict__ wait_flags, int32_t* __restrict__ wait_seen) {
  __shared__ int start[kMaxRanks + 1];
  __shared__ int count[kMaxLocalExperts], fill[kMaxLocalExperts], base[kMaxLocalExperts + 1];
  __shared__ int warp_sum[kLayoutThreads / 32];
  __shared__ int dropped;
  if (wait_flags) mbk::wait_peers(wait_flags, ep, wait_seen);  // the rows, their meta and counts have landed
  const int tid = threadIdx.x, M = meta_ints(top_k);
  const bool batched = expert_capacity > 0;
  if (tid < local_experts) count[tid] = fill[tid] = 0;
  if (tid == 0) {
    start[0] = 0;
    for (int s = 0; s < ep; ++s) start[s + 1] = start[s] + recv_counts[2 * s];
    dropped = 0;
  }
  __syncthreads();
  const int pairs = start[ep] * top_k;
  for (int q = tid; q < pairs; q += kLayoutThreads) {
    int s;
    const int64_t slot = slot_of(start, cap, q / top_k, s);
    const int x = mbk::local_expert(recv_meta[slot * M + q % top_k], first_expert, local_experts);
    if (x >= 0) atomicAdd(&count[x], 1);
  }
  __syncthreads();
  // group sizes -> starts (exclusive scan: within each warp by shuffles, then over the warps' sums)
  const int size = tid < local_experts ? (batched ? expert_capacity : (count[tid] + pad_multiple - 1) /
                                                                          pad_multiple * pad_multiple)
                                       : 0;
  int incl = size;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const int y = __shfl_up_sync(0xffffffffu, incl, o);
    if (tid % 32 >= o) incl += y;
  }
  if (tid % 32 == 31) warp_sum[tid / 32] = incl;
  __syncthreads();
  if (tid < 32) {
    int w = warp_sum[tid], wi = w;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
      const int y = __shfl_up_sync(0xffffffffu, wi, o);
      if (tid >= o) wi += y;
    }
    warp_sum[tid] = wi - w;  // the warps before it
  }
  __syncthreads();
  if (tid < local_experts) {
    base[tid] = warp_sum[tid / 32] + incl - size;
    expert_offsets[tid] = base[tid];
    expert_counts[tid] = batched ? min(count[tid], expert_capacity) : count[tid];
    if (tid == local_experts - 1) {
      base[local_experts] = base[tid] + size;
      expert_offsets[local_experts] = base[local_experts];
    }
  }
  __syncthreads();
  for (int q = tid; q < pairs; q += kLayoutThreads) {
    int s;
    const int k = q % top_k;
    const int64_t slot = slot_of(start, cap, q / top_k, s);
    const int32_t* meta = recv_meta + slot * M;
    const int x = mbk::local_expert(meta[k], first_expert, local_experts);
    int row = -1;
    if (x >= 0) {
      const int f = atomicAdd(&fill[x], 1);
      if (batched && f >= expert_capacity) {
        row = kPairDropped;
        dropped = 1;
      } else {
        row = base[x] + f;
        row_src_rank[row] = s;
        row_return[row] = meta[2 * top_k] * top_k + k;
      }
    }
    pair_row[slot * top_k + k] = row;
  }
  __syncthreads();
  for (int e = 0; e < local_experts; ++e) {  // padding rows go back nowhere
    const int used = batched ? min(count[e], expert_capacity) : count[e];
    for (int row = base[e] + used + tid; row < base[e + 1]; row += kLayoutThreads) row_src_rank[row] = -1;
  }
  if (tid == 0) *overflow = dropped;
}

template <typename T, int VEC>
__global__ void __launch_bounds__(mb::kStageThreads)
permute_rows_kernel(const T* __restrict__ recv_rows, const int32_t* __restrict__ recv_meta,
                    const int32_t* __restrict__ recv_counts, int ep, int cap, int hidden_size, int top_k,
                    const int32_t* __restrict__ pair_row, T* __restrict__ rows, T* const* __restrict__ peer_returned) {
  __shared__ int start[kMaxRanks + 1];
  if (threadIdx.x == 0) {
    start[0] = 0;
    for (int s = 0; s < ep; ++s) start[s + 1] = start[s] + recv_counts[2 * s];
  }
  __syncthreads();
  const int lane = threadIdx.x % 32, chunks = chunks_per_row<VEC>(hidden_size);
  const int64_t items = static_cast<int64_t>(start[ep]) * chunks;
  for (int64_t it = blockIdx.x * static_cast<int64_t>(mb::kStageWarps) + threadIdx.x / 32; it < items;
       it += static_cast<int64_t>(gridDim.x) * mb::kStageWarps) {
    int s;
    const int c = static_cast<int>(it % chunks);
    const int64_t slot = slot_of(start, cap, static_cast<int>(it / chunks), s);
    const auto chunk = mbk::load_chunk<T, VEC>(recv_rows + slot * hidden_size, hidden_size, c, lane);
    for (int k = 0; k < top_k; ++k) {
      const int row = pair_row[slot * top_k + k];
      if (row >= 0) {
        mbk::store_chunk<T, VEC>(chunk, rows + static_cast<int64_t>(row) * hidden_size, hidden_size, c, lane);
      } else if (row == kPairDropped && peer_returned) {  // its source gets a zero row back for this pair
        const int64_t back = static_cast<int64_t>(recv_meta[slot * meta_ints(top_k) + 2 * top_k]) * top_k + k;
        mbk::zero_chunk<T, VEC>(peer_returned[s] + back * hidden_size, hidden_size, c, lane);
        __threadfence_system();  // seen by the source before this rank's return signal (a later kernel)
      }
    }
  }
}

}  // namespace

extern "C" mb_status mb_ep_permute_layout(const int32_t* recv_meta, const int32_t* recv_counts, int ep_size, int cap,
                                          int top_k, int first_expert, int local_experts, int pad_multiple,
                                          int expert_capacity, int64_t* expert_offsets, int32_t* expert_counts,
                                          int32_t* pair_row, int32_t* row_src_rank, int32_t* row_return,
                                          int32_t* overflow, int32_t* wait_flags, int32_t* wait_seen,
                                          cudaStream_t stream) {
  const char* who = "mb_ep_permute_layout";
  MB_REQUIRE(ep_size >= 1 && ep_size <= kMaxRanks, "%s: ep_size must be in 1..%d, got %d", who, kMaxRanks, ep_size);
  MB_REQUIRE(local_experts >= 1 && local_experts <= kMaxLocalExperts, "%s: local_experts must be in 1..%d, got %d",
             who, kMaxLocalExperts, local_experts);
  MB_REQUIRE(cap >= 0 && top_k >= 1 && pad_multiple >= 1 && expert_capacity >= 0,
             "%s: cap (0: dense rows), expert_capacity must be >= 0 and top_k, pad_multiple >= 1", who);
  MB_REQUIRE(expert_capacity == 0 || pad_multiple == 1,
             "%s: the batched layout (expert_capacity > 0) has no pad_multiple (give 1), got %d", who, pad_multiple);
  MB_REQUIRE(recv_meta && recv_counts && expert_offsets && expert_counts && pair_row && row_src_rank && row_return &&
                 overflow,
             "%s: a pointer argument is NULL", who);
  MB_REQUIRE(!wait_flags || wait_seen, "%s: waiting on wait_flags needs its wait_seen counter", who);
  permute_layout_kernel<<<1, kLayoutThreads, 0, stream>>>(recv_meta, recv_counts, ep_size, cap, top_k, first_expert,
                                                          local_experts, pad_multiple, expert_capacity, expert_offsets,
                                                          expert_counts, pair_row, row_src_rank, row_return, overflow,
                                                          wait_flags, wait_seen);
  return mb::check_launch("permute_layout_kernel");
}

extern "C" mb_status mb_ep_permute_rows(const void* recv_rows, int dtype, const int32_t* recv_meta,
                                        const int32_t* recv_counts, int ep_size, int cap, int max_rows,
                                        int hidden_size, int top_k, const int32_t* pair_row, void* rows,
                                        void* const* peer_returned, int max_sms, cudaStream_t stream) {
  const char* who = "mb_ep_permute_rows";
  MB_REQUIRE(ep_size >= 1 && ep_size <= kMaxRanks, "%s: ep_size must be in 1..%d, got %d", who, kMaxRanks, ep_size);
  MB_REQUIRE(cap >= 0 && hidden_size >= 1 && top_k >= 1, "%s: sizes out of range", who);
  MB_REQUIRE(max_sms >= 0, "%s: max_sms must be >= 0 (0: the default grid), got %d", who, max_sms);
  MB_REQUIRE(cap > 0 || max_rows >= 0, "%s: dense rows (cap 0) need max_rows >= 0, got %d", who, max_rows);
  MB_REQUIRE(recv_rows && recv_meta && recv_counts && pair_row && rows,
             "%s: a pointer argument is NULL", who);
  return mb::dispatch_dtype(dtype, who, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kWide = 16 / sizeof(T);
    auto launch = [&](auto vec) {
      constexpr int kVec = decltype(vec)::value;
      const int64_t items = static_cast<int64_t>(cap ? ep_size * cap : max_rows) * chunks_per_row<kVec>(hidden_size);
      permute_rows_kernel<T, kVec><<<mbk::chunk_grid(items, max_sms), mb::kStageThreads, 0, stream>>>(
          static_cast<const T*>(recv_rows), recv_meta, recv_counts, ep_size, cap, hidden_size, top_k, pair_row,
          static_cast<T*>(rows), reinterpret_cast<T* const*>(peer_returned));
      return mb::check_launch("permute_rows_kernel");
    };
    return mb::vec_width<T>(hidden_size, {recv_rows, rows}) == kWide ? launch(std::integral_constant<int, kWide>{})
                                                                      : launch(std::integral_constant<int, 1>{});
  });
}
