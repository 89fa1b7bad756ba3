// Expert parallelism's `nvlink` dispatch and combine (moe_build/runner/dispatch/nvlink.py): every rank's
// buffers are mapped into every other rank's address space (symmetric memory over NVLink, no multicast), so
// the rows are written straight into the peers' memory by these kernels, with no collective and no host
// round trip.
// Per rank, in its symmetric buffer: recv_rows [ep][cap][H] and recv_meta [ep][cap][2K + 1] (slot [s][i]: the
// i-th row source s sent here: its hidden row, its K global expert ids, K weights' bits and its token index
// there), recv_counts
// [ep][2] (source s's row count here, and where those rows start in s's send order), returned [ep * cap][H]
// (the partial output of each row this rank sent, at its send-row index, for mb_ep_combine; with
// combine_with_unpermute, stages/ep_permute.cu, each (token, k) pair's expert output at token * K + k) and flags
// [2][ep]
// (flags[0][s]: source s's rows have all landed here; flags[1][s]: s has returned every partial row it owes
// here).
//   mb_ep_nvlink_dispatch: the layout (mb_ep_layout's) and its send rows written into the peers' recv slots; block
//                          0 also writes each peer's recv_counts entry for this rank; the last block to finish
//                          raises flags[0][rank] on every peer. Up to kLaidOutTokens tokens one kernel: every block
//                          lays the tokens out itself (a decode step's tokens, where a launch costs more than the
//                          layout); past that mb_ep_layout's kernels, then the rows.
//   mb_ep_nvlink_wait    : one block waits until every source's flag of one kind is raised here, then lowers
//                          them (for the next call): the blocking mode's wait before it reads the received count.
//   mb_ep_nvlink_gather  : (after the wait, or waiting itself where given the flags) the received rows made one
//                          dense [capacity][H] block, sources in rank order, with local expert ids (-1: another
//                          rank's expert), weights, and where each row came from; rows past the received count get
//                          ids -1 (they add nothing), rows past the capacity are dropped and raise the overflow
//                          flag (nothing else is written). In place (capacity = every slot): no row moves, the
//                          experts read the slots, and only the ids, weights and origins are written.
//   mb_ep_nvlink_return  : each dense row's partial output written into its source's `returned` at its send row
//                          (the rows before *rows_limit only, where given: a permuted layout's rows end on the
//                          device); the last block raises flags[1][rank] on every peer.
//   mb_ep_nvlink_combine : the return, then in the same kernel the wait for flags[1] (every partial owed here) and
//                          mb_ep_combine's per-token sum (a grid the SMs hold at once: each block waits).
// Signals (stages/ep_signal.cuh): the dispatch and return end by raising their flag on every peer (signal_peers);
// the kernels that read what a flag guards wait for it in every block, the last block lowering it (wait_peers): the
// non-blocking gather waits for the rows, mb_ep_nvlink_combine (after its return) for the partials.
// mb_ep_nvlink_wait (one block) serves the blocking mode, which reads the received count on the host before the
// gather. Only the flags' 0/1 store and load cross the GPUs besides the rows: no barrier, no collective.
// Order: the grid walks the destinations interleaved, a row for rank + 1, then one for rank + 2, ..., then one of
// its own (a local copy), and again: every link and the local copy move at once from the first row to the last,
// and no rank's NVLink ingress takes every sender's rows at once (in send-row order every rank would write to rank 0
// first, then to rank 1, ...). The return interleaves its rows' sources likewise (in place, source s's slots are
// the s-th of ep equal sections).
// Rows move in chunks of 32 lanes x kChunkUnroll vectors (stages/ep_combine.cuh), a warp per (row, chunk), every
// lane holding kChunkUnroll vectors in flight: a decode step's few rows still spread over many warps. Every kernel loops over its chunks with a grid
// stride, so the grid is free: by default a block per kStageWarps chunks, at most 8 blocks per SM; a caller's
// max_sms (> 0) caps it at that many blocks, i.e. SMs (a block runs on one SM), leaving the others to expert
// compute running beside the exchange (dual-batch overlap).
#include <algorithm>

#include "common/common.cuh"
#include "stages/ep_combine.cuh"
#include "stages/ep_layout.cuh"
#include "stages/ep_signal.cuh"

namespace {

using mbk::kMaxRanks;
// Up to this many tokens the dispatch lays them out itself (one kernel, a thread per token); past it mb_ep_layout's
// kernels run first.
constexpr int kLaidOutTokens = mb::kStageThreads;
using mbk::chunks_per_row;  // chunks of 32 lanes x kChunkUnroll vectors (stages/ep_combine.cuh)
using mbk::copy_chunk;
using mbk::meta_ints;
using mbk::zero_chunk;

// The send rows (rank d's segment [start[d], start[d + 1]) of send_tokens) into the peers' recv slots, a warp per
// (row, column chunk), the destinations interleaved (Order above); block 0 also writes each peer's recv_counts entry
// for this rank; then the peers' flags[0][rank] raised (signal_peers).
template <typename T, int VEC>
__device__ __forceinline__ void send_rows(const T* __restrict__ hidden, const int32_t* __restrict__ ids,
                                          const float* __restrict__ weights, int hidden_size, int top_k, int rank,
                                          int ep, int cap, const int* start, const int32_t* send_tokens,
                                          T* const* __restrict__ peer_rows, int32_t* const* __restrict__ peer_meta,
                                          int32_t* const* __restrict__ peer_counts,
                                          int32_t* const* __restrict__ peer_flags, int32_t* __restrict__ done) {
  if (blockIdx.x == 0 && threadIdx.x < ep) {
    const int d = threadIdx.x;
    peer_counts[d][2 * rank] = start[d + 1] - start[d];
    peer_counts[d][2 * rank + 1] = start[d];
  }
  const int lane = threadIdx.x % 32, chunks = chunks_per_row<VEC>(hidden_size);
  int longest = 0;  // the most rows any destination gets
  for (int d = 0; d < ep; ++d) longest = max(longest, start[d + 1] - start[d]);
  const int64_t items = static_cast<int64_t>(longest) * ep * chunks;
  for (int64_t it = blockIdx.x * static_cast<int64_t>(mb::kStageWarps) + threadIdx.x / 32; it < items;
       it += static_cast<int64_t>(gridDim.x) * mb::kStageWarps) {
    // the destinations interleaved: row q / ep of destination rank + 1 + q % ep
    const int64_t q = it / chunks;
    const int c = static_cast<int>(it % chunks), d = (rank + 1 + static_cast<int>(q % ep)) % ep;
    const int r = static_cast<int>(q / ep);
    if (r >= start[d + 1] - start[d]) continue;
    const int64_t slot = static_cast<int64_t>(rank) * cap + r;
    const int t = send_tokens[start[d] + r];
    copy_chunk<T, VEC>(hidden + static_cast<int64_t>(t) * hidden_size, peer_rows[d] + slot * hidden_size,
                       hidden_size, c, lane);
    if (c == 0) {
      int32_t* meta = peer_meta[d] + slot * meta_ints(top_k);
      for (int j = lane; j < top_k; j += 32) {
        meta[j] = ids[static_cast<int64_t>(t) * top_k + j];
        meta[top_k + j] = __float_as_int(weights[static_cast<int64_t>(t) * top_k + j]);
      }
      if (lane == 0) meta[2 * top_k] = t;
    }
  }
  mbk::signal_peers(peer_flags, rank, ep, done);
}

// Past kLaidOutTokens tokens: the send rows of mb_ep_layout's kernels (send_counts, send_tokens).
template <typename T, int VEC>
__global__ void __launch_bounds__(mb::kStageThreads)
nvlink_dispatch_kernel(const T* __restrict__ hidden, const int32_t* __restrict__ ids, const float* __restrict__ weights,
                       int hidden_size, int top_k, int rank, int ep, int cap, const int32_t* __restrict__ send_counts,
                       const int32_t* __restrict__ send_tokens, T* const* __restrict__ peer_rows,
                       int32_t* const* __restrict__ peer_meta, int32_t* const* __restrict__ peer_counts,
                       int32_t* const* __restrict__ peer_flags, int32_t* __restrict__ done) {
  __shared__ int start[kMaxRanks + 1];
  if (threadIdx.x == 0) {
    start[0] = 0;
    for (int d = 0; d < ep; ++d) start[d + 1] = start[d] + send_counts[d];
  }
  __syncthreads();
  send_rows<T, VEC>(hidden, ids, weights, hidden_size, top_k, rank, ep, cap, start, send_tokens, peer_rows, peer_meta,
                    peer_counts, peer_flags, done);
}

// Up to kLaidOutTokens tokens (a thread each): every block lays the tokens out itself (stages/ep_layout.cuh, as
// mb_ep_layout's one block does), its send rows' tokens in shared memory, then sends its rows; block 0 also writes
// send_counts and token_slots, which the combine reads. One launch where the layout took one more.
template <typename T, int VEC>
__global__ void __launch_bounds__(mb::kStageThreads)
nvlink_layout_dispatch_kernel(const T* __restrict__ hidden, const int32_t* __restrict__ ids,
                              const float* __restrict__ weights, int num_tokens, int hidden_size, int top_k, int rank,
                              int ep, int per_rank, int cap, int32_t* __restrict__ send_counts,
                              int32_t* __restrict__ token_slots, T* const* __restrict__ peer_rows,
                              int32_t* const* __restrict__ peer_meta, int32_t* const* __restrict__ peer_counts,
                              int32_t* const* __restrict__ peer_flags, int32_t* __restrict__ done) {
  __shared__ int warp_rows[mb::kStageWarps][kMaxRanks];
  __shared__ int start[kMaxRanks + 1];
  __shared__ int32_t send_tokens[kLaidOutTokens * kMaxRanks];
  mbk::lay_out_tokens(ids, threadIdx.x, num_tokens, top_k, ep, per_rank, nullptr, warp_rows,
                      blockIdx.x == 0 ? send_counts : nullptr, start, send_tokens,
                      blockIdx.x == 0 ? token_slots : nullptr);
  __syncthreads();
  send_rows<T, VEC>(hidden, ids, weights, hidden_size, top_k, rank, ep, cap, start, send_tokens, peer_rows, peer_meta,
                    peer_counts, peer_flags, done);
}

// The blocking mode's wait: one block, as wait_peers without a counter.
__global__ void nvlink_wait_kernel(int32_t* __restrict__ flags, int ep) {
  if (threadIdx.x >= ep) return;
  while (mbk::load_acquire_sys(flags + threadIdx.x) == 0) __nanosleep(64);
  flags[threadIdx.x] = 0;
}

template <typename T, int VEC>
__global__ void __launch_bounds__(mb::kStageThreads)
nvlink_gather_kernel(const T* __restrict__ recv_rows, const int32_t* __restrict__ recv_meta,
                     const int32_t* __restrict__ recv_counts, int ep, int cap, int hidden_size, int top_k,
                     int first_expert, int local_experts, int capacity, T* __restrict__ out_hidden,
                     int32_t* __restrict__ out_ids, float* __restrict__ out_weights, int32_t* __restrict__ src_rank,
                     int32_t* __restrict__ src_row, int32_t* __restrict__ received, int32_t* __restrict__ overflow,
                     T* const* __restrict__ peer_returned, int32_t* __restrict__ wait_flags,
                     int32_t* __restrict__ wait_seen) {
  __shared__ int start[kMaxRanks + 1];
  if (wait_flags) mbk::wait_peers(wait_flags, ep, wait_seen);  // the rows and counts below have landed
  if (threadIdx.x == 0) {
    start[0] = 0;
    for (int s = 0; s < ep; ++s) start[s + 1] = start[s] + recv_counts[2 * s];
    if (blockIdx.x == 0) {
      *received = min(start[ep], capacity);
      *overflow = start[ep] > capacity ? 1 : 0;
    }
  }
  __syncthreads();
  const int lane = threadIdx.x % 32, chunks = chunks_per_row<VEC>(hidden_size);
  const int64_t items = static_cast<int64_t>(max(capacity, start[ep])) * chunks;
  for (int64_t it = blockIdx.x * static_cast<int64_t>(mb::kStageWarps) + threadIdx.x / 32; it < items;
       it += static_cast<int64_t>(gridDim.x) * mb::kStageWarps) {
    const int j = static_cast<int>(it / chunks), c = static_cast<int>(it % chunks);
    if (j >= capacity) {  // dropped: its source gets a zero row back (the token lacks this rank's part, no more)
      int s = 0;
      while (start[s + 1] <= j) ++s;
      zero_chunk<T, VEC>(peer_returned[s] + static_cast<int64_t>(recv_counts[2 * s + 1] + j - start[s]) * hidden_size,
                         hidden_size, c, lane);
      __threadfence_system();  // seen by the source before this rank's return signal (a later kernel) is
      continue;
    }
    if (j >= start[ep]) {  // no row here: it routes nowhere
      if (c == 0) {
        for (int k = lane; k < top_k; k += 32) {
          out_ids[static_cast<int64_t>(j) * top_k + k] = -1;
          out_weights[static_cast<int64_t>(j) * top_k + k] = 0.0f;
        }
        if (lane == 0) src_rank[j] = -1;
      }
      continue;
    }
    int s = 0;
    while (start[s + 1] <= j) ++s;
    const int i = j - start[s];
    const int64_t slot = static_cast<int64_t>(s) * cap + i;
    copy_chunk<T, VEC>(recv_rows + slot * hidden_size, out_hidden + static_cast<int64_t>(j) * hidden_size,
                       hidden_size, c, lane);
    if (c == 0) {
      const int32_t* meta = recv_meta + slot * meta_ints(top_k);
      for (int k = lane; k < top_k; k += 32) {
        out_ids[static_cast<int64_t>(j) * top_k + k] = mbk::local_expert(meta[k], first_expert, local_experts);
        out_weights[static_cast<int64_t>(j) * top_k + k] = __int_as_float(meta[top_k + k]);
      }
      if (lane == 0) {
        src_rank[j] = s;
        src_row[j] = recv_counts[2 * s + 1] + i;
      }
    }
  }
}

// The gather in place (capacity = ep * cap: room for every slot): the experts read the recv slots themselves, row
// j being slot j (source j / cap's (j % cap)-th row), so no row moves; only each slot's ids, weights and where its
// partial goes back are written, a thread per slot (a slot past its source's count routes nowhere).
__global__ void __launch_bounds__(mb::kStageThreads)
nvlink_slots_kernel(const int32_t* __restrict__ recv_meta, const int32_t* __restrict__ recv_counts, int ep, int cap,
                    int top_k, int first_expert, int local_experts, int32_t* __restrict__ out_ids,
                    float* __restrict__ out_weights, int32_t* __restrict__ src_rank, int32_t* __restrict__ src_row,
                    int32_t* __restrict__ received, int32_t* __restrict__ overflow, int32_t* __restrict__ wait_flags,
                    int32_t* __restrict__ wait_seen) {
  if (wait_flags) mbk::wait_peers(wait_flags, ep, wait_seen);  // the counts and meta below have landed
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    int rows = 0;
    for (int s = 0; s < ep; ++s) rows += recv_counts[2 * s];
    *received = rows;
    *overflow = 0;
  }
  const int64_t slots = static_cast<int64_t>(ep) * cap;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < slots;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int s = static_cast<int>(j / cap), i = static_cast<int>(j % cap);
    const bool here = i < recv_counts[2 * s];
    const int32_t* meta = recv_meta + j * meta_ints(top_k);
    for (int k = 0; k < top_k; ++k) {
      out_ids[j * top_k + k] = here ? mbk::local_expert(meta[k], first_expert, local_experts) : -1;
      out_weights[j * top_k + k] = here ? __int_as_float(meta[top_k + k]) : 0.0f;
    }
    src_rank[j] = here ? s : -1;
    if (here) src_row[j] = recv_counts[2 * s + 1] + i;
  }
}

// Each row's partial output into its source's `returned` at its send row (src_rank -1: nowhere), a warp per (row,
// column chunk), the sources interleaved (Order above); then the peers' flags[1][rank] raised.
template <typename T, int VEC>
__device__ __forceinline__ void return_rows(const T* __restrict__ partial, const int32_t* __restrict__ src_rank,
                                            const int32_t* __restrict__ src_row, int rows, int hidden_size,
                                            T* const* __restrict__ peer_returned, int rank, int ep,
                                            int32_t* const* __restrict__ peer_flags, int32_t* __restrict__ done) {
  const int lane = threadIdx.x % 32, chunks = chunks_per_row<VEC>(hidden_size);
  // the rows as ep sections (in place: source s's slots; gathered densely: about one source's rows each)
  const int section = (rows + ep - 1) / ep;
  const int64_t items = static_cast<int64_t>(section) * ep * chunks;
  for (int64_t it = blockIdx.x * static_cast<int64_t>(mb::kStageWarps) + threadIdx.x / 32; it < items;
       it += static_cast<int64_t>(gridDim.x) * mb::kStageWarps) {
    // the sections interleaved: row q / ep of section rank + 1 + q % ep
    const int64_t q = it / chunks;
    const int c = static_cast<int>(it % chunks);
    const int j = (rank + 1 + static_cast<int>(q % ep)) % ep * section + static_cast<int>(q / ep);
    if (j >= rows) continue;
    const int s = src_rank[j];
    if (s < 0) continue;
    copy_chunk<T, VEC>(partial + static_cast<int64_t>(j) * hidden_size,
                       peer_returned[s] + static_cast<int64_t>(src_row[j]) * hidden_size, hidden_size, c, lane);
  }
  mbk::signal_peers(peer_flags, ep + rank, ep, done);
}

template <typename T, int VEC>
__global__ void __launch_bounds__(mb::kStageThreads)
nvlink_return_kernel(const T* __restrict__ partial, const int32_t* __restrict__ src_rank,
                     const int32_t* __restrict__ src_row, int rows, const int64_t* __restrict__ rows_limit,
                     int hidden_size, T* const* __restrict__ peer_returned,
                     int rank, int ep, int32_t* const* __restrict__ peer_flags, int32_t* __restrict__ done) {
  if (rows_limit) rows = static_cast<int>(min(static_cast<int64_t>(rows), *rows_limit));
  return_rows<T, VEC>(partial, src_rank, src_row, rows, hidden_size, peer_returned, rank, ep, peer_flags, done);
}

// The return, then (once every block's rows are out) the wait for every partial owed here and the per-token sum:
// one launch where the sum took a second one. Every block waits for the peers' flags, and this rank's own flag is
// raised by the last block to finish its rows, so every block of the grid must be resident at once: the launch
// caps the grid at what the SMs hold (resident_blocks).
template <typename T, int VEC>
__global__ void __launch_bounds__(mb::kStageThreads)
nvlink_combine_kernel(const T* __restrict__ partial, const int32_t* __restrict__ src_rank,
                      const int32_t* __restrict__ src_row, int rows, int hidden_size,
                      T* const* __restrict__ peer_returned, int rank, int ep, int32_t* const* __restrict__ peer_flags,
                      int32_t* __restrict__ done, const T* __restrict__ returned,
                      const int32_t* __restrict__ token_slots, int num_tokens, T* __restrict__ out,
                      int32_t* __restrict__ flags, int32_t* __restrict__ seen) {
  return_rows<T, VEC>(partial, src_rank, src_row, rows, hidden_size, peer_returned, rank, ep, peer_flags, done);
  mbk::wait_peers(flags, ep, seen);  // every partial row owed here is back
  mbk::combine_tokens<T, VEC>(returned, token_slots, num_tokens, hidden_size, ep, out);
}

// The grid of a chunk loop over `rows` rows (stages/ep_combine.cuh's chunk_grid).
int grid_for(int64_t rows, int chunks, int max_sms) { return mbk::chunk_grid(rows * chunks, max_sms); }

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
                                           const float* topk_weights, int num_tokens, int hidden_size, int top_k,
                                           int rank, int ep_size, int experts_per_rank, int cap, int32_t* send_counts,
                                           int32_t* send_tokens, int32_t* token_slots, int32_t* block_counts,
                                           void* const* peer_rows, int32_t* const* peer_meta,
                                           int32_t* const* peer_counts, int32_t* const* peer_flags, int32_t* done,
                                           int max_sms, cudaStream_t stream) {
  const char* who = "mb_ep_nvlink_dispatch";
  MB_REQUIRE(ep_size >= 1 && ep_size <= kMaxRanks, "%s: ep_size must be in 1..%d, got %d", who, kMaxRanks, ep_size);
  MB_REQUIRE(rank >= 0 && rank < ep_size, "%s: rank %d is not in 0..%d", who, rank, ep_size - 1);
  MB_REQUIRE(num_tokens >= 0 && num_tokens <= cap, "%s: num_tokens must be in 0..cap (%d), got %d", who, cap,
             num_tokens);
  MB_REQUIRE(hidden_size >= 1 && top_k >= 1 && experts_per_rank >= 1,
             "%s: hidden_size, top_k and experts_per_rank must be >= 1", who);
  MB_REQUIRE(send_counts && peer_rows && peer_meta && peer_counts && peer_flags && done &&
                 (num_tokens == 0 || (hidden && topk_ids && topk_weights && send_tokens && token_slots)),
             "%s: a pointer argument is NULL", who);
  MB_REQUIRE(max_sms >= 0, "%s: max_sms must be >= 0 (0: the default grid), got %d", who, max_sms);
  if (num_tokens > kLaidOutTokens)
    MB_TRY(mb_ep_layout(topk_ids, num_tokens, top_k, ep_size, experts_per_rank, send_counts, send_tokens, token_slots,
                        block_counts, stream));
  return by_width(dtype, hidden_size, {hidden}, who, [&](auto tag, auto vec) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = decltype(vec)::value;
    const int grid = grid_for(int64_t{num_tokens} * ep_size, chunks_per_row<kVec>(hidden_size), max_sms);
    const auto* x = static_cast<const T*>(hidden);
    auto* const* rows = reinterpret_cast<T* const*>(peer_rows);
    if (num_tokens <= kLaidOutTokens) {
      nvlink_layout_dispatch_kernel<T, kVec><<<grid, mb::kStageThreads, 0, stream>>>(
          x, topk_ids, topk_weights, num_tokens, hidden_size, top_k, rank, ep_size, experts_per_rank, cap, send_counts,
          token_slots, rows, peer_meta, peer_counts, peer_flags, done);
      return mb::check_launch("nvlink_layout_dispatch_kernel");
    }
    nvlink_dispatch_kernel<T, kVec><<<grid, mb::kStageThreads, 0, stream>>>(
        x, topk_ids, topk_weights, hidden_size, top_k, rank, ep_size, cap, send_counts, send_tokens, rows, peer_meta,
        peer_counts, peer_flags, done);
    return mb::check_launch("nvlink_dispatch_kernel");
  });
}

extern "C" mb_status mb_ep_nvlink_wait(int32_t* flags, int ep_size, cudaStream_t stream) {
  const char* who = "mb_ep_nvlink_wait";
  MB_REQUIRE(ep_size >= 1 && ep_size <= kMaxRanks, "%s: ep_size must be in 1..%d, got %d", who, kMaxRanks, ep_size);
  MB_REQUIRE(flags, "%s: flags is NULL", who);
  nvlink_wait_kernel<<<1, 32, 0, stream>>>(flags, ep_size);
  return mb::check_launch("nvlink_wait_kernel");
}

extern "C" mb_status mb_ep_nvlink_gather(const void* recv_rows, int dtype, const int32_t* recv_meta,
                                         const int32_t* recv_counts, int ep_size, int cap, int hidden_size, int top_k,
                                         int first_expert, int local_experts, int capacity, int in_place,
                                         void* out_hidden,
                                         int32_t* out_ids, float* out_weights, int32_t* src_rank, int32_t* src_row,
                                         int32_t* received, int32_t* overflow, void* const* peer_returned,
                                         int32_t* wait_flags, int32_t* wait_seen, int max_sms, cudaStream_t stream) {
  const char* who = "mb_ep_nvlink_gather";
  MB_REQUIRE(ep_size >= 1 && ep_size <= kMaxRanks, "%s: ep_size must be in 1..%d, got %d", who, kMaxRanks, ep_size);
  MB_REQUIRE(hidden_size >= 1 && top_k >= 1 && cap >= 0 && capacity >= 0 && local_experts >= 1,
             "%s: sizes out of range", who);
  MB_REQUIRE(recv_counts && received && overflow && peer_returned,
             "%s: recv_counts, received, overflow and peer_returned must be non-NULL", who);
  MB_REQUIRE(!wait_flags || wait_seen, "%s: waiting on wait_flags needs its wait_seen counter", who);
  MB_REQUIRE(max_sms >= 0, "%s: max_sms must be >= 0 (0: the default grid), got %d", who, max_sms);
  if (in_place) {
    MB_REQUIRE(static_cast<int64_t>(capacity) == static_cast<int64_t>(ep_size) * cap,
               "%s: in place the capacity is every slot, ep_size * cap = %lld, got %d", who,
               static_cast<long long>(ep_size) * cap, capacity);
    const int slots_per_block = mb::kStageThreads;
    nvlink_slots_kernel<<<mbk::chunk_grid((static_cast<int64_t>(capacity) + slots_per_block - 1) / slots_per_block *
                                              mb::kStageWarps, max_sms),
                          mb::kStageThreads, 0, stream>>>(recv_meta, recv_counts, ep_size, cap, top_k, first_expert,
                                                          local_experts, out_ids, out_weights, src_rank, src_row,
                                                          received, overflow, wait_flags, wait_seen);
    return mb::check_launch("nvlink_slots_kernel");
  }
  return by_width(dtype, hidden_size, {recv_rows, out_hidden}, who, [&](auto tag, auto vec) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = decltype(vec)::value;
    nvlink_gather_kernel<T, kVec><<<grid_for(capacity, chunks_per_row<kVec>(hidden_size), max_sms),
                                    mb::kStageThreads, 0, stream>>>(
        static_cast<const T*>(recv_rows), recv_meta, recv_counts, ep_size, cap, hidden_size, top_k, first_expert,
        local_experts, capacity, static_cast<T*>(out_hidden), out_ids, out_weights, src_rank, src_row, received,
        overflow, reinterpret_cast<T* const*>(peer_returned), wait_flags, wait_seen);
    return mb::check_launch("nvlink_gather_kernel");
  });
}

extern "C" mb_status mb_ep_nvlink_return(const void* partial, int dtype, const int32_t* src_rank,
                                         const int32_t* src_row, int rows, const int64_t* rows_limit,
                                         int hidden_size, void* const* peer_returned, int rank, int ep_size,
                                         int32_t* const* peer_flags, int32_t* done, int max_sms,
                                         cudaStream_t stream) {
  const char* who = "mb_ep_nvlink_return";
  MB_REQUIRE(rows >= 0 && hidden_size >= 1, "%s: rows must be >= 0 and hidden_size >= 1", who);
  MB_REQUIRE(ep_size >= 1 && ep_size <= kMaxRanks, "%s: ep_size must be in 1..%d, got %d", who, kMaxRanks, ep_size);
  MB_REQUIRE(rank >= 0 && rank < ep_size, "%s: rank %d is not in 0..%d", who, rank, ep_size - 1);
  MB_REQUIRE(max_sms >= 0, "%s: max_sms must be >= 0 (0: the default grid), got %d", who, max_sms);
  MB_REQUIRE(peer_returned && peer_flags && done && (rows == 0 || (partial && src_rank && src_row)),
             "%s: a pointer argument is NULL", who);
  // launched with no rows too: the peers wait for its signal
  return by_width(dtype, hidden_size, {partial}, who, [&](auto tag, auto vec) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = decltype(vec)::value;
    nvlink_return_kernel<T, kVec><<<grid_for(rows, chunks_per_row<kVec>(hidden_size), max_sms), mb::kStageThreads,
                                    0, stream>>>(
        static_cast<const T*>(partial), src_rank, src_row, rows, rows_limit, hidden_size,
        reinterpret_cast<T* const*>(peer_returned), rank, ep_size, peer_flags, done);
    return mb::check_launch("nvlink_return_kernel");
  });
}

extern "C" mb_status mb_ep_nvlink_combine(const void* partial, int dtype, const int32_t* src_rank,
                                          const int32_t* src_row, int rows, int hidden_size,
                                          void* const* peer_returned, int rank, int ep_size,
                                          int32_t* const* peer_flags, int32_t* done, const void* returned,
                                          const int32_t* token_slots, int num_tokens, void* out, int32_t* flags,
                                          int32_t* seen, int max_sms, cudaStream_t stream) {
  const char* who = "mb_ep_nvlink_combine";
  MB_REQUIRE(rows >= 0 && num_tokens >= 0 && hidden_size >= 1,
             "%s: rows and num_tokens must be >= 0 and hidden_size >= 1", who);
  MB_REQUIRE(ep_size >= 1 && ep_size <= kMaxRanks, "%s: ep_size must be in 1..%d, got %d", who, kMaxRanks, ep_size);
  MB_REQUIRE(rank >= 0 && rank < ep_size, "%s: rank %d is not in 0..%d", who, rank, ep_size - 1);
  MB_REQUIRE(max_sms >= 0, "%s: max_sms must be >= 0 (0: the default grid), got %d", who, max_sms);
  MB_REQUIRE(peer_returned && peer_flags && done && flags && seen && (rows == 0 || (partial && src_rank && src_row)) &&
                 (num_tokens == 0 || (returned && token_slots && out)),
             "%s: a pointer argument is NULL", who);
  // launched with no rows and no tokens too: the peers wait for its signal, and its wait lowers the flags
  return by_width(dtype, hidden_size, {partial, returned, out}, who, [&](auto tag, auto vec) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = decltype(vec)::value;
    const auto kernel = nvlink_combine_kernel<T, kVec>;
    const int chunks = chunks_per_row<kVec>(hidden_size);
    int per_sm = 0;
    const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, mb::kStageThreads, 0);
    if (err != cudaSuccess || per_sm < 1)
      return mb::fail(MB_ERR_CUDA, "%s: its blocks per SM: %s", who, cudaGetErrorString(err));
    const int resident_blocks = per_sm * mb::device_attribute(cudaDevAttrMultiProcessorCount);
    const int grid = std::min(std::max(grid_for(rows, chunks, max_sms), grid_for(num_tokens, chunks, max_sms)),
                              resident_blocks);
    kernel<<<grid, mb::kStageThreads, 0, stream>>>(
        static_cast<const T*>(partial), src_rank, src_row, rows, hidden_size,
        reinterpret_cast<T* const*>(peer_returned), rank, ep_size, peer_flags, done, static_cast<const T*>(returned),
        token_slots, num_tokens, static_cast<T*>(out), flags, seen);
    return mb::check_launch("nvlink_combine_kernel");
  });
}
