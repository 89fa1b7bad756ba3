// Expert parallelism's token-side stages around the all-to-alls (moe_build/runner/dispatch/nccl.py):
//   mb_ep_layout : phase one of the two-phase dispatch. From the top-k ids, which ranks each token goes to
//                  (rank d holds experts [d * experts_per_rank, (d + 1) * experts_per_rank)); a token goes
//                  once to every rank holding at least one of its experts. The send rows are grouped by
//                  rank, tokens ascending within a rank; the layout is kept (send_tokens, token_slots), so
//                  the payload gather and the combine never sort again.
//   mb_ep_pack_send: after the counts are known, the layout's send rows packed for the payload exchange: each
//                  row's hidden row, and its top-k ids made local to the rank it goes to (-1: another rank's
//                  expert) with its weights, so the receiving rank's experts read what arrives as it lands.
//   mb_ep_combine: the reduction after the return all-to-all (stages/ep_combine.cuh: per token, the ranks'
//                  partial rows in rank order, fp32, one rounding); a caller's max_sms (> 0) may cap the grid at
//                  that many blocks (SMs) with the same result.
// The layout runs in one block. Up to 1024 tokens (a decode step's, where it sits on every call's critical path) it
// is one pass of a block as wide as the tokens: each thread keeps its token's rank mask, a warp ballot per rank gives
// a lane's place in its warp, and lane d of warp 0 prefixes rank d's rows over the warps, then the ranks' totals
// over its lanes (their segment starts). Past that, a block of 1024 threads walks the tokens in chunks of 1024
// twice: first the totals per rank (so every rank's segment start is known), then each chunk's rows in token order,
// one thread per rank prefixing the warps' counts. One block is enough: it is a scan of T * ep_size bits (8K tokens:
// 8 chunks).
#include <algorithm>
#include <type_traits>

#include "common/common.cuh"
#include "stages/ep_combine.cuh"

namespace {

constexpr int kLayoutThreads = 1024;
constexpr int kLayoutWarps = kLayoutThreads / 32;
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

// Both layout kernels, per warp. Lane 0: how many of the warp's tokens go to each rank (mask bit d) into rows[d].
__device__ __forceinline__ void count_warp_rows(uint32_t m, int ep, int* rows) {
  for (int d = 0; d < ep; ++d) {
    const unsigned b = __ballot_sync(0xffffffffu, (m >> d) & 1u);
    if (threadIdx.x % 32 == 0) rows[d] = __popc(b);
  }
}

// Token t's send row for each rank d: the warp's first slot for d (first[d]) plus the lane's place among the warp's
// tokens going there, or -1. Every lane calls it (the ballots); tokens past num_tokens write nothing.
__device__ __forceinline__ void write_slots(uint32_t m, int t, int num_tokens, int ep, const int* first,
                                            int32_t* __restrict__ send_tokens, int32_t* __restrict__ token_slots) {
  const unsigned below = (1u << (threadIdx.x % 32)) - 1u;
  for (int d = 0; d < ep; ++d) {
    const unsigned b = __ballot_sync(0xffffffffu, (m >> d) & 1u);
    if (t < num_tokens) {
      int slot = -1;
      if ((m >> d) & 1u) {
        slot = first[d] + __popc(b & below);
        send_tokens[slot] = t;
      }
      token_slots[static_cast<int64_t>(t) * ep + d] = slot;
    }
  }
}

// Up to kLayoutThreads tokens, a thread each (blockDim.x: the tokens rounded up to whole warps, at least one).
__global__ void __launch_bounds__(kLayoutThreads)
ep_layout_one_pass_kernel(const int32_t* __restrict__ ids, int num_tokens, int top_k, int ep, int per_rank,
                          int32_t* __restrict__ send_counts, int32_t* __restrict__ send_tokens,
                          int32_t* __restrict__ token_slots) {
  __shared__ int warp_rows[kLayoutWarps][kMaxRanks];  // rows per (warp, rank), then their first slot
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32, t = threadIdx.x;
  const uint32_t m = t < num_tokens ? rank_mask(ids, t, top_k, ep, per_rank) : 0;
  count_warp_rows(m, ep, warp_rows[warp]);
  __syncthreads();
  if (warp == 0) {  // lane d: rank d's rows over the warps, then its segment start among the ranks
    int total = 0;
    if (lane < ep)
      for (int w = 0; w < warps; ++w) total += warp_rows[w][lane];
    int incl = total;
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
      const int v = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += v;
    }
    if (lane < ep) {
      send_counts[lane] = total;
      int at = incl - total;
      for (int w = 0; w < warps; ++w) {
        const int n = warp_rows[w][lane];
        warp_rows[w][lane] = at;
        at += n;
      }
    }
  }
  __syncthreads();
  write_slots(m, t, num_tokens, ep, warp_rows[warp], send_tokens, token_slots);
}

__global__ void __launch_bounds__(kLayoutThreads)
ep_layout_kernel(const int32_t* __restrict__ ids, int num_tokens, int top_k, int ep, int per_rank,
                 int32_t* __restrict__ send_counts, int32_t* __restrict__ send_tokens,
                 int32_t* __restrict__ token_slots) {
  __shared__ int total[kMaxRanks];                  // rows per rank (pass 1), then its segment start
  __shared__ int warp_rows[kLayoutWarps][kMaxRanks];  // this chunk: rows per (warp, rank), then their first slot
  __shared__ int placed[kMaxRanks];                 // rows of each rank placed by earlier chunks
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (threadIdx.x < kMaxRanks) total[threadIdx.x] = placed[threadIdx.x] = 0;
  __syncthreads();
  for (int t0 = 0; t0 < num_tokens; t0 += kLayoutThreads) {
    const int t = t0 + threadIdx.x;
    const uint32_t m = t < num_tokens ? rank_mask(ids, t, top_k, ep, per_rank) : 0;
    for (int d = 0; d < ep; ++d) {
      const unsigned b = __ballot_sync(0xffffffffu, (m >> d) & 1u);
      if (lane == 0 && b) atomicAdd(&total[d], __popc(b));
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int start = 0;
    for (int d = 0; d < ep; ++d) {
      send_counts[d] = total[d];
      const int n = total[d];
      total[d] = start;
      start += n;
    }
  }
  __syncthreads();
  for (int t0 = 0; t0 < num_tokens; t0 += kLayoutThreads) {
    const int t = t0 + threadIdx.x;
    const uint32_t m = t < num_tokens ? rank_mask(ids, t, top_k, ep, per_rank) : 0;
    count_warp_rows(m, ep, warp_rows[warp]);
    __syncthreads();
    if (threadIdx.x < ep) {  // one thread per rank: the warps' first slots, in warp order
      const int d = threadIdx.x;
      int at = total[d] + placed[d];
      for (int w = 0; w < kLayoutWarps; ++w) {
        const int n = warp_rows[w][d];
        warp_rows[w][d] = at;
        at += n;
      }
      placed[d] = at - total[d];
    }
    __syncthreads();
    write_slots(m, t, num_tokens, ep, warp_rows[warp], send_tokens, token_slots);
    __syncthreads();  // the next chunk rewrites warp_rows
  }
}

// A warp per (send row, column chunk) as the nvlink dispatch's rows (stages/ep_combine.cuh); chunk 0's warp also
// writes the row's ids, local to its destination rank d (the segment of send_counts holding row i), and weights.
template <typename T, int VEC>
__global__ void __launch_bounds__(mb::kStageThreads)
ep_pack_send_kernel(const T* __restrict__ hidden, const int32_t* __restrict__ ids, const float* __restrict__ weights,
                    int hidden_size, int top_k, int ep, int per_rank, const int32_t* __restrict__ send_counts,
                    const int32_t* __restrict__ send_tokens, int rows, T* __restrict__ out_rows,
                    int32_t* __restrict__ out_ids, float* __restrict__ out_weights) {
  __shared__ int start[kMaxRanks + 1];
  if (threadIdx.x == 0) {
    start[0] = 0;
    for (int d = 0; d < ep; ++d) start[d + 1] = start[d] + send_counts[d];
  }
  __syncthreads();
  const int lane = threadIdx.x % 32, chunks = mbk::chunks_per_row<VEC>(hidden_size);
  const int64_t items = static_cast<int64_t>(rows) * chunks;
  for (int64_t it = blockIdx.x * static_cast<int64_t>(mb::kStageWarps) + threadIdx.x / 32; it < items;
       it += static_cast<int64_t>(gridDim.x) * mb::kStageWarps) {
    const int i = static_cast<int>(it / chunks), c = static_cast<int>(it % chunks);
    const int t = send_tokens[i];
    mbk::copy_chunk<T, VEC>(hidden + static_cast<int64_t>(t) * hidden_size,
                            out_rows + static_cast<int64_t>(i) * hidden_size, hidden_size, c, lane);
    if (c == 0) {
      int d = 0;  // rows past the counts' sum (the dispatch sends none) stay with the last rank
      while (d + 1 < ep && start[d + 1] <= i) ++d;
      const int first = d * per_rank;
      for (int j = lane; j < top_k; j += 32) {
        const int x = ids[static_cast<int64_t>(t) * top_k + j] - first;
        out_ids[static_cast<int64_t>(i) * top_k + j] = x >= 0 && x < per_rank ? x : -1;
        out_weights[static_cast<int64_t>(i) * top_k + j] = weights[static_cast<int64_t>(t) * top_k + j];
      }
    }
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(mb::kStageThreads)
ep_combine_kernel(const T* __restrict__ returned, const int32_t* __restrict__ token_slots, int num_tokens,
                  int hidden, int ep, T* __restrict__ out) {
  mbk::combine_tokens<T, VEC>(returned, token_slots, num_tokens, hidden, ep, out);
}

}  // namespace

extern "C" mb_status mb_ep_layout(const int32_t* topk_ids, int num_tokens, int top_k, int ep_size,
                                  int experts_per_rank, int32_t* send_counts, int32_t* send_tokens,
                                  int32_t* token_slots, cudaStream_t stream) {
  const char* who = "mb_ep_layout";
  MB_REQUIRE(num_tokens >= 0, "%s: num_tokens must be >= 0, got %d", who, num_tokens);
  MB_REQUIRE(top_k >= 1, "%s: top_k must be >= 1, got %d", who, top_k);
  MB_REQUIRE(ep_size >= 1 && ep_size <= kMaxRanks, "%s: ep_size must be in 1..%d, got %d", who, kMaxRanks, ep_size);
  MB_REQUIRE(experts_per_rank >= 1, "%s: experts_per_rank must be >= 1, got %d", who, experts_per_rank);
  MB_REQUIRE(send_counts && (num_tokens == 0 || (topk_ids && send_tokens && token_slots)),
             "%s: topk_ids, send_counts, send_tokens and token_slots must be non-NULL", who);
  if (num_tokens <= kLayoutThreads) {
    const int threads = std::max(32, (num_tokens + 31) / 32 * 32);
    ep_layout_one_pass_kernel<<<1, threads, 0, stream>>>(topk_ids, num_tokens, top_k, ep_size, experts_per_rank,
                                                         send_counts, send_tokens, token_slots);
    return mb::check_launch("ep_layout_one_pass_kernel");
  }
  ep_layout_kernel<<<1, kLayoutThreads, 0, stream>>>(topk_ids, num_tokens, top_k, ep_size, experts_per_rank,
                                                     send_counts, send_tokens, token_slots);
  return mb::check_launch("ep_layout_kernel");
}

extern "C" mb_status mb_ep_pack_send(const void* hidden, int dtype, const int32_t* topk_ids,
                                     const float* topk_weights, int hidden_size, int top_k, int ep_size,
                                     int experts_per_rank, const int32_t* send_counts, const int32_t* send_tokens,
                                     int send_rows, void* out_rows, int32_t* out_ids, float* out_weights,
                                     cudaStream_t stream) {
  const char* who = "mb_ep_pack_send";
  MB_REQUIRE(send_rows >= 0, "%s: send_rows must be >= 0, got %d", who, send_rows);
  MB_REQUIRE(hidden_size >= 1, "%s: hidden_size must be >= 1, got %d", who, hidden_size);
  MB_REQUIRE(top_k >= 1, "%s: top_k must be >= 1, got %d", who, top_k);
  MB_REQUIRE(ep_size >= 1 && ep_size <= kMaxRanks, "%s: ep_size must be in 1..%d, got %d", who, kMaxRanks, ep_size);
  MB_REQUIRE(experts_per_rank >= 1, "%s: experts_per_rank must be >= 1, got %d", who, experts_per_rank);
  if (send_rows == 0) return mb::dispatch_dtype(dtype, who, [](auto) { return MB_OK; });
  MB_REQUIRE(hidden && topk_ids && topk_weights && send_counts && send_tokens && out_rows && out_ids && out_weights,
             "%s: every pointer must be non-NULL", who);
  return mb::dispatch_dtype(dtype, who, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kWide = 16 / sizeof(T);
    const auto launch = [&](auto vec) {
      constexpr int V = decltype(vec)::value;
      ep_pack_send_kernel<T, V><<<mbk::chunk_grid(int64_t{send_rows} * mbk::chunks_per_row<V>(hidden_size), 0),
                                  mb::kStageThreads, 0, stream>>>(
          static_cast<const T*>(hidden), topk_ids, topk_weights, hidden_size, top_k, ep_size, experts_per_rank,
          send_counts, send_tokens, send_rows, static_cast<T*>(out_rows), out_ids, out_weights);
      return mb::check_launch("ep_pack_send_kernel");
    };
    if (mb::vec_width<T>(hidden_size, {hidden, out_rows}) == kWide) return launch(std::integral_constant<int, kWide>{});
    return launch(std::integral_constant<int, 1>{});
  });
}

extern "C" mb_status mb_ep_combine(const void* returned, int dtype, const int32_t* token_slots, int num_tokens,
                                   int hidden, int ep_size, void* out, int max_sms, cudaStream_t stream) {
  const char* who = "mb_ep_combine";
  MB_REQUIRE(num_tokens >= 0, "%s: num_tokens must be >= 0, got %d", who, num_tokens);
  MB_REQUIRE(max_sms >= 0, "%s: max_sms must be >= 0 (0: the default grid), got %d", who, max_sms);
  MB_REQUIRE(hidden >= 1, "%s: hidden must be >= 1, got %d", who, hidden);
  MB_REQUIRE(ep_size >= 1 && ep_size <= kMaxRanks, "%s: ep_size must be in 1..%d, got %d", who, kMaxRanks, ep_size);
  if (num_tokens == 0) return mb::dispatch_dtype(dtype, who, [](auto) { return MB_OK; });
  MB_REQUIRE(token_slots && out, "%s: token_slots and out must be non-NULL", who);
  return mb::dispatch_dtype(dtype, who, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kWide = 16 / sizeof(T);
    if (mb::vec_width<T>(hidden, {returned, out}) == kWide) {
      ep_combine_kernel<T, kWide><<<mbk::chunk_grid(int64_t{num_tokens} * mbk::chunks_per_row<kWide>(hidden), max_sms),
                                    mb::kStageThreads, 0, stream>>>(static_cast<const T*>(returned), token_slots,
                                                                    num_tokens, hidden, ep_size, static_cast<T*>(out));
    } else {
      ep_combine_kernel<T, 1><<<mbk::chunk_grid(int64_t{num_tokens} * mbk::chunks_per_row<1>(hidden), max_sms),
                                mb::kStageThreads, 0, stream>>>(static_cast<const T*>(returned), token_slots,
                                                                num_tokens, hidden, ep_size, static_cast<T*>(out));
    }
    return mb::check_launch("ep_combine_kernel");
  });
}
