// Three-step routing prologue for any token count; deterministic (no atomics decide an order).
//   1. histogram: each tile of kTile expanded rows counts its rows per expert into
//      counts[tile][E+1] (shared-memory atomics only count, so the result is order-free);
//   2. scan (one block): for every expert x and tile b, the first permuted row of tile b's
//      x-rows = rows of all experts < x + x-rows of tiles < b; also writes the int64 offsets;
//   3. scatter: one warp per tile loads the tile's keys, walks its rows in order, 32 at a time,
//      ranks equal experts within the 32 with __match_any_sync, and writes both maps. Walking in order keeps the
//      sort stable in the expanded row, as the fused kernel's is.
// Ids outside [0, E) use the sentinel key E, sort last and are left out of the offsets.
#include "common.cuh"

namespace {

constexpr int kTile = 1024;          // expanded rows per tile
constexpr int kHistThreads = 256;
constexpr int kScanThreads = 1024;
constexpr int kMaxExperts = 8192;    // per-tile counters live in shared memory

__device__ __forceinline__ int expert_key(int32_t x, int E) { return x >= 0 && x < E ? x : E; }

__global__ void __launch_bounds__(kHistThreads)
histogram_kernel(const int32_t* __restrict__ ids, int64_t n, int E, int32_t* __restrict__ counts) {
  extern __shared__ int hist[];  // [E+1]
  for (int x = threadIdx.x; x <= E; x += blockDim.x) hist[x] = 0;
  __syncthreads();
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t end = begin + kTile < n ? begin + kTile : n;
  for (int64_t e = begin + threadIdx.x; e < end; e += blockDim.x) atomicAdd(&hist[expert_key(ids[e], E)], 1);
  __syncthreads();
  int32_t* out = counts + static_cast<int64_t>(blockIdx.x) * (E + 1);
  for (int x = threadIdx.x; x <= E; x += blockDim.x) out[x] = hist[x];
}

// Loads of one expert's column are issued kBatch at a time so that a thread's walk over the tiles
// waits for memory once per batch instead of once per tile.
constexpr int kBatch = 8;

// counts[b][x] (tile b's x-rows) becomes the first permuted row of those rows.
__global__ void __launch_bounds__(kScanThreads)
scan_kernel(int32_t* __restrict__ counts, int num_tiles, int E, int64_t* __restrict__ offsets) {
  extern __shared__ int start[];  // [E+1]: rows of expert x over all tiles, then its first row
  __shared__ int warp_sums[kScanThreads / 32];
  __shared__ int carry;
  const int64_t stride = E + 1;
  // Column sums: one thread per expert (threads read consecutive x: coalesced).
  for (int x = threadIdx.x; x <= E; x += blockDim.x) {
    int sum = 0;
    for (int b0 = 0; b0 < num_tiles; b0 += kBatch) {
      int v[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) v[i] = b0 + i < num_tiles ? counts[(b0 + i) * stride + x] : 0;
#pragma unroll
      for (int i = 0; i < kBatch; ++i) sum += v[i];
    }
    start[x] = sum;
  }
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  // Exclusive scan of start[0..E] in chunks of kScanThreads.
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int base = 0; base <= E; base += kScanThreads) {
    const int x = base + threadIdx.x;
    const int v = x <= E ? start[x] : 0;
    const int incl = mb::warp_inclusive_scan(v);
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    if (warp == 0) warp_sums[lane] = mb::warp_inclusive_scan(warp_sums[lane]);
    __syncthreads();
    const int excl = carry + (warp == 0 ? 0 : warp_sums[warp - 1]) + incl - v;
    __syncthreads();  // everyone has read carry and warp_sums
    if (x <= E) {
      start[x] = excl;
      offsets[x] = excl;
    }
    if (threadIdx.x == kScanThreads - 1) carry = excl + v;
    __syncthreads();
  }
  // Column prefix over tiles, starting at the expert's first row.
  for (int x = threadIdx.x; x <= E; x += blockDim.x) {
    int run = start[x];
    for (int b0 = 0; b0 < num_tiles; b0 += kBatch) {
      int v[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) v[i] = b0 + i < num_tiles ? counts[(b0 + i) * stride + x] : 0;
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        if (b0 + i < num_tiles) counts[(b0 + i) * stride + x] = run;
        run += v[i];
      }
    }
  }
}

__global__ void __launch_bounds__(32)
scatter_kernel(const int32_t* __restrict__ ids, int64_t n, int E, const int32_t* __restrict__ counts,
               int32_t* __restrict__ permuted_to_unpermuted, int32_t* __restrict__ unpermuted_to_permuted) {
  extern __shared__ int next_row[];  // [E+1]: next free permuted row per expert for this tile
  const int lane = threadIdx.x;
  const int32_t* first = counts + static_cast<int64_t>(blockIdx.x) * (E + 1);
  for (int x = lane; x <= E; x += 32) next_row[x] = first[x];
  __syncwarp();
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kTile;
  const unsigned lanes_below = (1u << lane) - 1u;
  // The whole tile's keys are loaded up front (all loads in flight at once); the in-order walk
  // below then touches only registers and shared memory.
  constexpr int kRounds = kTile / 32;
  int keys[kRounds];
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const int64_t e = begin + r * 32 + lane;
    keys[r] = e < n ? expert_key(ids[e], E) : -1;  // -1: a key no real row has
  }
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const int64_t e = begin + r * 32 + lane;
    const int key = keys[r];
    const unsigned same = __match_any_sync(0xffffffffu, key);
    const int rank = __popc(same & lanes_below);
    if (key >= 0) {
      const int p = next_row[key] + rank;
      permuted_to_unpermuted[p] = static_cast<int32_t>(e);
      unpermuted_to_permuted[e] = p;
    }
    __syncwarp();
    // The highest lane of each group advances that expert's counter past the group.
    if (key >= 0 && (same >> lane) == 1u) next_row[key] += __popc(same);
    __syncwarp();
  }
}

size_t workspace_bytes_for(int64_t num_tiles, int num_experts) {
  return static_cast<size_t>(num_tiles) * (num_experts + 1) * sizeof(int32_t);
}

}  // namespace

extern "C" size_t mb_build_maps_three_step_workspace(int num_tokens, int top_k, int num_experts) {
  if (num_tokens < 0 || top_k < 1 || num_experts < 1) return 0;
  const int64_t n = static_cast<int64_t>(num_tokens) * top_k;
  return workspace_bytes_for((n + kTile - 1) / kTile, num_experts);
}

extern "C" mb_status mb_build_maps_three_step(const int32_t* topk_ids, int num_tokens, int top_k, int num_experts,
                                              int32_t* permuted_to_unpermuted, int32_t* unpermuted_to_permuted,
                                              int64_t* expert_first_token_offset, void* workspace,
                                              size_t workspace_bytes, cudaStream_t stream) {
  const char* who = "mb_build_maps_three_step";
  MB_REQUIRE(num_tokens >= 0, "%s: num_tokens must be >= 0, got %d", who, num_tokens);
  MB_REQUIRE(top_k >= 1, "%s: top_k must be >= 1, got %d", who, top_k);
  MB_REQUIRE(num_experts >= 1, "%s: num_experts must be >= 1, got %d", who, num_experts);
  const int64_t n = static_cast<int64_t>(num_tokens) * top_k;
  MB_REQUIRE(n <= INT32_MAX, "%s: num_tokens*top_k=%lld exceeds the int32 row maps", who, static_cast<long long>(n));
  if (num_experts > kMaxExperts) {
    return mb::fail(MB_ERR_UNSUPPORTED, "%s: num_experts=%d exceeds this kernel's %d", who, num_experts, kMaxExperts);
  }
  const int64_t num_tiles = (n + kTile - 1) / kTile;
  const size_t need = workspace_bytes_for(num_tiles, num_experts);
  MB_REQUIRE(workspace_bytes >= need, "%s: workspace_bytes=%zu, need %zu", who, workspace_bytes, need);
  MB_REQUIRE(expert_first_token_offset, "%s: expert_first_token_offset must be non-NULL", who);
  MB_REQUIRE(n == 0 || (topk_ids && permuted_to_unpermuted && unpermuted_to_permuted && workspace),
             "%s: topk_ids, both maps and workspace must be non-NULL", who);

  int32_t* counts = static_cast<int32_t*>(workspace);
  const size_t smem = (static_cast<size_t>(num_experts) + 1) * sizeof(int);
  if (num_tiles > 0) {
    histogram_kernel<<<static_cast<unsigned>(num_tiles), kHistThreads, smem, stream>>>(topk_ids, n, num_experts, counts);
    MB_TRY(mb::check_launch("histogram_kernel"));
  }
  scan_kernel<<<1, kScanThreads, smem, stream>>>(counts, static_cast<int>(num_tiles), num_experts,
                                                 expert_first_token_offset);
  MB_TRY(mb::check_launch("scan_kernel"));
  if (num_tiles > 0) {
    scatter_kernel<<<static_cast<unsigned>(num_tiles), 32, smem, stream>>>(topk_ids, n, num_experts, counts,
                                                                          permuted_to_unpermuted,
                                                                          unpermuted_to_permuted);
    MB_TRY(mb::check_launch("scatter_kernel"));
  }
  return MB_OK;
}
