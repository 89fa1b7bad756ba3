// Expert parallelism's `nvlink` dispatch and combine (moe_build/runner/dispatch/nvlink.py): every rank's
// buffers are mapped into every other rank's address space (symmetric memory over NVLink, no multicast), so
// the rows are written straight into the peers' memory by these kernels, with no collective and no host
// round trip; a barrier (torch's symmetric-memory barrier, between these launches) orders the writes.
// Per rank, in its symmetric buffer: recv_rows [ep][cap][H] and recv_meta [ep][cap][2K] (slot [s][i]: the
// i-th row source s sent here: its hidden row, its K global expert ids and K weights' bits), recv_counts
// [ep][2] (source s's row count here, and where those rows start in s's send order), and returned [ep * cap][H]
// (the partial output of each row this rank sent, at its send-row index, for mb_ep_combine).
//   mb_ep_nvlink_dispatch: the send rows of mb_ep_layout written into the peers' recv slots, a warp per row;
//                          block 0 also writes each peer's recv_counts entry for this rank.
//   mb_ep_nvlink_gather  : (after the barrier) the received rows made one dense [capacity][H] block, sources in
//                          rank order, with local expert ids (-1: another rank's expert), weights, and where
//                          each row came from; rows past the received count get ids -1 (they add nothing), rows
//                          past the capacity are dropped and raise the overflow flag (nothing else is written).
//   mb_ep_nvlink_return  : each dense row's partial output written into its source's `returned` at its send row.
// Every kernel loops over its rows with a grid stride, so the grid is free: by default a block per kStageWarps rows,
// at most 8 blocks per SM; a caller's max_sms (> 0) caps it at that many blocks, i.e. SMs (a block runs on one SM),
// leaving the others to expert compute running beside the exchange (dual-batch overlap).
#include <algorithm>

#include "common/common.cuh"

namespace {

constexpr int kMaxRanks = 32;

template <typename T, int VEC>
__device__ __forceinline__ void copy_row(const T* __restrict__ src, T* __restrict__ dst, int hidden, int lane) {
  using V = mb::Vec<T, VEC>;
  const V* s = reinterpret_cast<const V*>(src);
  V* d = reinterpret_cast<V*>(dst);
  for (int v = lane; v < hidden / VEC; v += 32) d[v] = s[v];
}

template <typename T, int VEC>
__global__ void __launch_bounds__(mb::kStageThreads)
nvlink_dispatch_kernel(const T* __restrict__ hidden, const int32_t* __restrict__ ids, const float* __restrict__ weights,
                       int hidden_size, int top_k, int rank, int ep, int cap, const int32_t* __restrict__ send_counts,
                       const int32_t* __restrict__ send_tokens, T* const* __restrict__ peer_rows,
                       int32_t* const* __restrict__ peer_meta, int32_t* const* __restrict__ peer_counts) {
  __shared__ int start[kMaxRanks + 1];
  if (threadIdx.x == 0) {
    start[0] = 0;
    for (int d = 0; d < ep; ++d) start[d + 1] = start[d] + send_counts[d];
  }
  __syncthreads();
  if (blockIdx.x == 0 && threadIdx.x < ep) {
    const int d = threadIdx.x;
    peer_counts[d][2 * rank] = send_counts[d];
    peer_counts[d][2 * rank + 1] = start[d];
  }
  const int lane = threadIdx.x % 32;
  const int n = start[ep];
  for (int i = blockIdx.x * mb::kStageWarps + threadIdx.x / 32; i < n; i += gridDim.x * mb::kStageWarps) {
    int d = 0;
    while (start[d + 1] <= i) ++d;
    const int64_t slot = static_cast<int64_t>(rank) * cap + (i - start[d]);
    const int t = send_tokens[i];
    copy_row<T, VEC>(hidden + static_cast<int64_t>(t) * hidden_size, peer_rows[d] + slot * hidden_size,
                     hidden_size, lane);
    int32_t* meta = peer_meta[d] + slot * 2 * top_k;
    for (int j = lane; j < top_k; j += 32) {
      meta[j] = ids[static_cast<int64_t>(t) * top_k + j];
      meta[top_k + j] = __float_as_int(weights[static_cast<int64_t>(t) * top_k + j]);
    }
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(mb::kStageThreads)
nvlink_gather_kernel(const T* __restrict__ recv_rows, const int32_t* __restrict__ recv_meta,
                     const int32_t* __restrict__ recv_counts, int ep, int cap, int hidden_size, int top_k,
                     int first_expert, int local_experts, int capacity, T* __restrict__ out_hidden,
                     int32_t* __restrict__ out_ids, float* __restrict__ out_weights, int32_t* __restrict__ src_rank,
                     int32_t* __restrict__ src_row, int32_t* __restrict__ received, int32_t* __restrict__ overflow,
                     T* const* __restrict__ peer_returned) {
  __shared__ int start[kMaxRanks + 1];
  if (threadIdx.x == 0) {
    start[0] = 0;
    for (int s = 0; s < ep; ++s) start[s + 1] = start[s] + recv_counts[2 * s];
    if (blockIdx.x == 0) {
      *received = min(start[ep], capacity);
      *overflow = start[ep] > capacity ? 1 : 0;
    }
  }
  __syncthreads();
  const int lane = threadIdx.x % 32;
  const int rows = max(capacity, start[ep]);
  for (int j = blockIdx.x * mb::kStageWarps + threadIdx.x / 32; j < rows; j += gridDim.x * mb::kStageWarps) {
    if (j >= capacity) {  // dropped: its source gets a zero row back (the token lacks this rank's part, no more)
      int s = 0;
      while (start[s + 1] <= j) ++s;
      T* back = peer_returned[s] + static_cast<int64_t>(recv_counts[2 * s + 1] + j - start[s]) * hidden_size;
      for (int v = lane; v < hidden_size; v += 32) back[v] = mb::from_f32<T>(0.0f);
      continue;
    }
    if (j >= start[ep]) {  // no row here: it routes nowhere
      for (int k = lane; k < top_k; k += 32) {
        out_ids[static_cast<int64_t>(j) * top_k + k] = -1;
        out_weights[static_cast<int64_t>(j) * top_k + k] = 0.0f;
      }
      if (lane == 0) src_rank[j] = -1;
      continue;
    }
    int s = 0;
    while (start[s + 1] <= j) ++s;
    const int i = j - start[s];
    const int64_t slot = static_cast<int64_t>(s) * cap + i;
    copy_row<T, VEC>(recv_rows + slot * hidden_size, out_hidden + static_cast<int64_t>(j) * hidden_size, hidden_size,
                     lane);
    const int32_t* meta = recv_meta + slot * 2 * top_k;
    for (int k = lane; k < top_k; k += 32) {
      const int x = meta[k] - first_expert;
      out_ids[static_cast<int64_t>(j) * top_k + k] = x >= 0 && x < local_experts ? x : -1;
      out_weights[static_cast<int64_t>(j) * top_k + k] = __int_as_float(meta[top_k + k]);
    }
    if (lane == 0) {
      src_rank[j] = s;
      src_row[j] = recv_counts[2 * s + 1] + i;
    }
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(mb::kStageThreads)
nvlink_return_kernel(const T* __restrict__ partial, const int32_t* __restrict__ src_rank,
                     const int32_t* __restrict__ src_row, int rows, int hidden_size, T* const* __restrict__ peer_returned) {
  const int lane = threadIdx.x % 32;
  for (int j = blockIdx.x * mb::kStageWarps + threadIdx.x / 32; j < rows; j += gridDim.x * mb::kStageWarps) {
    const int s = src_rank[j];
    if (s < 0) continue;
    copy_row<T, VEC>(partial + static_cast<int64_t>(j) * hidden_size,
                     peer_returned[s] + static_cast<int64_t>(src_row[j]) * hidden_size, hidden_size, lane);
  }
}

// The grid of a row loop: a block per kStageWarps rows, at most 8 per SM, at most max_sms where given (> 0).
int grid_for(int64_t rows, int max_sms) {
  const int64_t sms = mb::device_attribute(cudaDevAttrMultiProcessorCount);
  int64_t grid = std::min<int64_t>((rows + mb::kStageWarps - 1) / mb::kStageWarps, sms * 8);
  if (max_sms > 0) grid = std::min<int64_t>(grid, max_sms);
  return static_cast<int>(std::max<int64_t>(1, grid));
}

// Calls f(TypeTag<T>, VEC) with 16-byte vectors where every row start allows them (the symmetric buffers are
// 16-byte aligned; `local` are this call's own row arrays), else single elements.
template <typename F>
mb_status by_width(int dtype, int hidden, std::initializer_list<const void*> local, const char* who, F&& f) {
  return mb::dispatch_dtype(dtype, who, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kWide = 16 / sizeof(T);
    return mb::vec_width<T>(hidden, local) == kWide ? f(tag, std::integral_constant<int, kWide>{})
                                                    : f(tag, std::integral_constant<int, 1>{});
  });
}

}  // namespace

extern "C" mb_status mb_ep_nvlink_dispatch(const void* hidden, int dtype, const int32_t* topk_ids,
                                           const float* topk_weights, int hidden_size, int top_k, int rank,
                                           int ep_size, int cap, const int32_t* send_counts,
                                           const int32_t* send_tokens, int max_send_rows, void* const* peer_rows,
                                           int32_t* const* peer_meta, int32_t* const* peer_counts, int max_sms,
                                           cudaStream_t stream) {
  const char* who = "mb_ep_nvlink_dispatch";
  MB_REQUIRE(ep_size >= 1 && ep_size <= kMaxRanks, "%s: ep_size must be in 1..%d, got %d", who, kMaxRanks, ep_size);
  MB_REQUIRE(rank >= 0 && rank < ep_size, "%s: rank %d is not in 0..%d", who, rank, ep_size - 1);
  MB_REQUIRE(hidden_size >= 1 && top_k >= 1 && cap >= 0 && max_send_rows >= 0,
             "%s: hidden_size, top_k must be >= 1 and cap, max_send_rows >= 0", who);
  MB_REQUIRE(send_counts && peer_rows && peer_meta && peer_counts, "%s: a pointer argument is NULL", who);
  MB_REQUIRE(max_sms >= 0, "%s: max_sms must be >= 0 (0: the default grid), got %d", who, max_sms);
  return by_width(dtype, hidden_size, {hidden}, who, [&](auto tag, auto vec) {
    using T = typename decltype(tag)::type;
    nvlink_dispatch_kernel<T, decltype(vec)::value><<<grid_for(max_send_rows, max_sms), mb::kStageThreads, 0, stream>>>(
        static_cast<const T*>(hidden), topk_ids, topk_weights, hidden_size, top_k, rank, ep_size, cap, send_counts,
        send_tokens, reinterpret_cast<T* const*>(peer_rows), peer_meta, peer_counts);
    return mb::check_launch("nvlink_dispatch_kernel");
  });
}

extern "C" mb_status mb_ep_nvlink_gather(const void* recv_rows, int dtype, const int32_t* recv_meta,
                                         const int32_t* recv_counts, int ep_size, int cap, int hidden_size, int top_k,
                                         int first_expert, int local_experts, int capacity, void* out_hidden,
                                         int32_t* out_ids, float* out_weights, int32_t* src_rank, int32_t* src_row,
                                         int32_t* received, int32_t* overflow, void* const* peer_returned,
                                         int max_sms, cudaStream_t stream) {
  const char* who = "mb_ep_nvlink_gather";
  MB_REQUIRE(ep_size >= 1 && ep_size <= kMaxRanks, "%s: ep_size must be in 1..%d, got %d", who, kMaxRanks, ep_size);
  MB_REQUIRE(hidden_size >= 1 && top_k >= 1 && cap >= 0 && capacity >= 0 && local_experts >= 1,
             "%s: sizes out of range", who);
  MB_REQUIRE(recv_counts && received && overflow && peer_returned,
             "%s: recv_counts, received, overflow and peer_returned must be non-NULL", who);
  MB_REQUIRE(max_sms >= 0, "%s: max_sms must be >= 0 (0: the default grid), got %d", who, max_sms);
  return by_width(dtype, hidden_size, {recv_rows, out_hidden}, who, [&](auto tag, auto vec) {
    using T = typename decltype(tag)::type;
    nvlink_gather_kernel<T, decltype(vec)::value><<<grid_for(capacity, max_sms), mb::kStageThreads, 0, stream>>>(
        static_cast<const T*>(recv_rows), recv_meta, recv_counts, ep_size, cap, hidden_size, top_k, first_expert,
        local_experts, capacity, static_cast<T*>(out_hidden), out_ids, out_weights, src_rank, src_row, received,
        overflow, reinterpret_cast<T* const*>(peer_returned));
    return mb::check_launch("nvlink_gather_kernel");
  });
}

extern "C" mb_status mb_ep_nvlink_return(const void* partial, int dtype, const int32_t* src_rank,
                                         const int32_t* src_row, int rows, int hidden_size,
                                         void* const* peer_returned, int max_sms, cudaStream_t stream) {
  const char* who = "mb_ep_nvlink_return";
  MB_REQUIRE(rows >= 0 && hidden_size >= 1, "%s: rows must be >= 0 and hidden_size >= 1", who);
  MB_REQUIRE(max_sms >= 0, "%s: max_sms must be >= 0 (0: the default grid), got %d", who, max_sms);
  if (rows == 0) return mb::dispatch_dtype(dtype, who, [](auto) { return MB_OK; });
  MB_REQUIRE(partial && src_rank && src_row && peer_returned, "%s: a pointer argument is NULL", who);
  return by_width(dtype, hidden_size, {partial}, who, [&](auto tag, auto vec) {
    using T = typename decltype(tag)::type;
    nvlink_return_kernel<T, decltype(vec)::value><<<grid_for(rows, max_sms), mb::kStageThreads, 0, stream>>>(
        static_cast<const T*>(partial), src_rank, src_row, rows, hidden_size,
        reinterpret_cast<T* const*>(peer_returned));
    return mb::check_launch("nvlink_return_kernel");
  });
}
