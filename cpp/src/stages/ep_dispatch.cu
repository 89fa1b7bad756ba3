// Expert parallelism's token-side stages around the all-to-alls (moe_build/runner/dispatch/nccl.py):
//   mb_ep_layout : phase one of the two-phase dispatch. From the top-k ids, which ranks each token goes to
//                  (rank d holds experts [d * experts_per_rank, (d + 1) * experts_per_rank)); a token goes
//                  once to every rank holding at least one of its experts. The send rows are grouped by
//                  rank, tokens ascending within a rank; the layout is kept (send_tokens, token_slots), so
//                  the payload gather and the combine never sort again.
//   mb_ep_pack_send: after the counts are known, the layout's send rows packed for the payload exchange: each
//                  row's hidden row, and its top-k ids made local to the rank it goes to (-1: another rank's
//                  expert) with its weights, so the receiving rank's experts read what arrives as it lands.
//   mb_ep_local_ids: the all-gather form's ids, every rank's tokens' global top-k ids made local to this rank in
//                  place (-1: another rank's expert), so its experts read them as the two-phase form's packed ids.
//   mb_ep_combine: the reduction after the return all-to-all (stages/ep_combine.cuh: per token, the ranks'
//                  partial rows in rank order, fp32, one rounding); a caller's max_sms (> 0) may cap the grid at
//                  that many blocks (SMs) with the same result.
// The layout (stages/ep_layout.cuh's steps) runs a thread per token in blocks of up to 1024. Up to 1024 tokens (a
// decode step's, where it sits on every call's critical path) it is one pass of one block as wide as the tokens.
// Past that, blocks of 1024 tokens in two launches: the first counts each block's rows per rank into
// block_counts, the second sums them (every rank's total: its segment start; the earlier blocks': this block's
// place in it) and writes its tokens' slots as the one block does.
#include <algorithm>
#include <type_traits>

#include "common/common.cuh"
#include "stages/ep_combine.cuh"
#include "stages/ep_layout.cuh"

namespace {

constexpr int kLayoutThreads = 1024;
constexpr int kLayoutWarps = kLayoutThreads / 32;
using mbk::kMaxRanks;

// Block b's tokens [b * blockDim.x, ..): each rank's rows among them into block_counts[b][d].
__global__ void __launch_bounds__(kLayoutThreads)
ep_layout_count_kernel(const int32_t* __restrict__ ids, int num_tokens, int top_k, int ep, int per_rank,
                       int32_t* __restrict__ block_counts) {
  __shared__ int warp_rows[kLayoutWarps][kMaxRanks];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = blockIdx.x * blockDim.x + threadIdx.x;
  mbk::count_warp_rows(t < num_tokens ? mbk::rank_mask(ids, t, top_k, ep, per_rank) : 0u, ep, warp_rows[warp]);
  __syncthreads();
  const int rows = mbk::block_rows(warp_rows, blockDim.x / 32, ep);
  if (warp == 0 && lane < ep) block_counts[static_cast<int64_t>(blockIdx.x) * ep + lane] = rows;
}

// A thread per token (blockDim.x: whole warps). One block (block_counts NULL): its tokens are all of them; else
// block b's are [b * blockDim.x, ..) and block_counts the count kernel's.
__global__ void __launch_bounds__(kLayoutThreads)
ep_layout_kernel(const int32_t* __restrict__ ids, int num_tokens, int top_k, int ep, int per_rank,
                 const int32_t* __restrict__ block_counts, int32_t* __restrict__ send_counts,
                 int32_t* __restrict__ send_tokens, int32_t* __restrict__ token_slots) {
  __shared__ int warp_rows[kLayoutWarps][kMaxRanks];  // rows per (warp, rank), then their first slot
  mbk::lay_out_tokens(ids, blockIdx.x * blockDim.x + threadIdx.x, num_tokens, top_k, ep, per_rank, block_counts,
                      warp_rows, blockIdx.x == 0 ? send_counts : nullptr, nullptr, send_tokens, token_slots);
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
        const int id = ids[static_cast<int64_t>(t) * top_k + j];
        out_ids[static_cast<int64_t>(i) * top_k + j] = mbk::local_expert(id, first, per_rank);
        out_weights[static_cast<int64_t>(i) * top_k + j] = weights[static_cast<int64_t>(t) * top_k + j];
      }
    }
  }
}

// A thread per id, grid-strided.
__global__ void __launch_bounds__(mb::kStageThreads)
ep_local_ids_kernel(int32_t* __restrict__ ids, int64_t count, int first, int per_rank) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    ids[i] = mbk::local_expert(ids[i], first, per_rank);
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
                                  int32_t* token_slots, int32_t* block_counts, cudaStream_t stream) {
  const char* who = "mb_ep_layout";
  MB_REQUIRE(num_tokens >= 0, "%s: num_tokens must be >= 0, got %d", who, num_tokens);
  MB_REQUIRE(top_k >= 1, "%s: top_k must be >= 1, got %d", who, top_k);
  MB_REQUIRE(ep_size >= 1 && ep_size <= kMaxRanks, "%s: ep_size must be in 1..%d, got %d", who, kMaxRanks, ep_size);
  MB_REQUIRE(experts_per_rank >= 1, "%s: experts_per_rank must be >= 1, got %d", who, experts_per_rank);
  MB_REQUIRE(send_counts && (num_tokens == 0 || (topk_ids && send_tokens && token_slots)),
             "%s: topk_ids, send_counts, send_tokens and token_slots must be non-NULL", who);
  if (num_tokens <= kLayoutThreads) {
    const int threads = std::max(32, (num_tokens + 31) / 32 * 32);
    ep_layout_kernel<<<1, threads, 0, stream>>>(topk_ids, num_tokens, top_k, ep_size, experts_per_rank, nullptr,
                                                send_counts, send_tokens, token_slots);
    return mb::check_launch("ep_layout_kernel");
  }
  MB_REQUIRE(block_counts, "%s: past %d tokens block_counts (ceil(num_tokens / %d) * ep_size int32) must be non-NULL",
             who, kLayoutThreads, kLayoutThreads);
  const int blocks = (num_tokens + kLayoutThreads - 1) / kLayoutThreads;
  ep_layout_count_kernel<<<blocks, kLayoutThreads, 0, stream>>>(topk_ids, num_tokens, top_k, ep_size,
                                                                experts_per_rank, block_counts);
  MB_TRY(mb::check_launch("ep_layout_count_kernel"));
  ep_layout_kernel<<<blocks, kLayoutThreads, 0, stream>>>(topk_ids, num_tokens, top_k, ep_size, experts_per_rank,
                                                          block_counts, send_counts, send_tokens, token_slots);
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

extern "C" mb_status mb_ep_local_ids(int32_t* topk_ids, int64_t count, int first_expert, int experts_per_rank,
                                     cudaStream_t stream) {
  const char* who = "mb_ep_local_ids";
  MB_REQUIRE(count >= 0, "%s: count must be >= 0, got %lld", who, static_cast<long long>(count));
  MB_REQUIRE(first_expert >= 0, "%s: first_expert must be >= 0, got %d", who, first_expert);
  MB_REQUIRE(experts_per_rank >= 1, "%s: experts_per_rank must be >= 1, got %d", who, experts_per_rank);
  if (count == 0) return MB_OK;
  MB_REQUIRE(topk_ids, "%s: topk_ids must be non-NULL", who);
  const int64_t blocks = std::min<int64_t>((count + mb::kStageThreads - 1) / mb::kStageThreads, 1024);
  ep_local_ids_kernel<<<static_cast<int>(blocks), mb::kStageThreads, 0, stream>>>(topk_ids, count, first_expert,
                                                                                 experts_per_rank);
  return mb::check_launch("ep_local_ids_kernel");
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
