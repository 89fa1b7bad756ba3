// Three-step routing prologue for any token count; deterministic (no atomics decide an order). The
// sort, offsets and inverse run in two launches:
//   1. histogram: each tile of expanded rows counts its rows per expert into counts[tile][E+1]
//      (shared-memory atomics only count, so the result is order-free);
//   2. scan + scatter, one block per tile. The block sums every tile's counts (each expert's total,
//      and its rows in the tiles before this one) and scans the totals over the experts (block 0
//      writes the int64 offsets): the tile's x-rows start at the rows of all experts < x plus the
//      x-rows of earlier tiles. The block's W warps each own a contiguous run of `rounds` rounds of 32
//      rows; each counts its rows per expert, the counts are prefixed over the warps, and each warp then
//      walks its rounds in order, placing each with mb::place_round (as the fused kernel does), which
//      writes both maps. Walking in order keeps the sort stable in the expanded row.
// Every block repeats the scan (no launch of its own between the two), over at most kMaxTiles x (E+1)
// counts: the tile grows past 1024 rows when the rows outnumber kMaxTiles tiles.
// Ids outside [0, E) use the sentinel key E, sort last and are left out of the offsets.
// zero_out (the [T, H] output that GEMM2's finalize epilogue accumulates into) is zeroed by extra blocks
// of the scan + scatter launch, which otherwise fills only a fraction of the SMs with latency-bound
// scans, rather than by the bandwidth-bound expansion.
// The form that routes (mb_routing_prologue_three_step_routing, the plan's routing=prologue): its first launch is
// one block that routes the tokens a warp each (stages/route_token.cuh, mb_routing's code), keeps their ids in shared
// memory and counts them as the histogram's one tile; the scan + scatter launch follows as above. One launch and one
// wait on the chain fewer than the routing kernel, then the histogram; one tile (T*K <= kMinTile rows) only.
#include <algorithm>

#include "stages/route_token.cuh"

namespace {

constexpr int64_t kMinTile = 1024;  // expanded rows per tile, doubled until there are <= kMaxTiles
constexpr int64_t kMaxTiles = 64;
constexpr int kHistThreads = 256;
constexpr int kMaxWarps = 32;
constexpr int64_t kWarpCountBytes = 32 * 1024;  // shared memory for the warps' per-expert counters
constexpr int kMaxExperts = 8192;
constexpr int64_t kMaxZeroBlocks = 1024;
// Loads each thread issues before its first dependent shared-memory atomic (the histogram's ids, the
// scan's per-tile counts): one load then one atomic per iteration would make each a chain of global
// round trips.
constexpr int kLoadBatch = 8;

__device__ __forceinline__ int expert_key(int32_t x, int E) { return x >= 0 && x < E ? x : E; }

__global__ void __launch_bounds__(kHistThreads)
histogram_kernel(const int32_t* __restrict__ ids, int64_t n, int64_t tile, int E, int32_t* __restrict__ counts) {
  extern __shared__ int hist[];  // [E+1]
  mb::chain_start();
  for (int x = threadIdx.x; x <= E; x += blockDim.x) hist[x] = 0;
  __syncthreads();
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * tile;
  const int64_t end = begin + tile < n ? begin + tile : n;
  for (int64_t base = begin + threadIdx.x; base < end; base += kLoadBatch * blockDim.x) {
    int key[kLoadBatch];  // a batch of loads in flight before the first atomic waits for one
#pragma unroll
    for (int b = 0; b < kLoadBatch; ++b) {
      const int64_t e = base + static_cast<int64_t>(b) * blockDim.x;
      key[b] = e < end ? expert_key(ids[e], E) : -1;
    }
#pragma unroll
    for (int b = 0; b < kLoadBatch; ++b)
      if (key[b] >= 0) atomicAdd(&hist[key[b]], 1);
  }
  __syncthreads();
  int32_t* out = counts + static_cast<int64_t>(blockIdx.x) * (E + 1);
  for (int x = threadIdx.x; x <= E; x += blockDim.x) out[x] = hist[x];
}

// Routes the T tokens (warp w: tokens w, w + routing_warps, ...; kGrouped: each warp's scratch first in shared
// memory), then counts the ids it kept into counts[0][E+1], the histogram of the call's one tile.
template <typename T, int SLOTS, bool kGrouped>
__global__ void __launch_bounds__(kHistThreads)
routed_histogram_kernel(const T* __restrict__ logits, const float* __restrict__ bias, int num_tokens, int E, int K,
                        int method, int renormalize, int num_groups, int topk_groups, float scale, int routing_warps,
                        int32_t* __restrict__ topk_ids, float* __restrict__ topk_weights,
                        int32_t* __restrict__ counts) {
  extern __shared__ __align__(16) unsigned char smem_bytes[];  // [scratch per routing warp] [kept ids, T*K] [E+1]
  const int warp = threadIdx.x / 32, n = num_tokens * K;
  const int scratch_bytes = kGrouped ? mb::routing_group_scratch_bytes(E, num_groups) : 0;
  int32_t* kept = reinterpret_cast<int32_t*>(smem_bytes + routing_warps * scratch_bytes);
  int* hist = kept + n;
  for (int x = threadIdx.x; x <= E; x += blockDim.x) hist[x] = 0;
  mb::chain_start();
  if (warp < routing_warps) {
    for (int t = warp; t < num_tokens; t += routing_warps) {
      mb::route_token<T, SLOTS, kGrouped, true>(logits + static_cast<int64_t>(t) * E, bias, E, K, method,
                                                renormalize, num_groups, topk_groups, scale, topk_ids + t * K,
                                                topk_weights + t * K, smem_bytes + warp * scratch_bytes, kept + t * K);
    }
  }
  __syncthreads();  // every id kept, the counters zeroed
  for (int i = threadIdx.x; i < n; i += blockDim.x) atomicAdd(&hist[expert_key(kept[i], E)], 1);
  __syncthreads();
  for (int x = threadIdx.x; x <= E; x += blockDim.x) counts[x] = hist[x];
}

// Zero block z of `zero_blocks` sets its share of [zero_out, zero_out + zero_bytes) to zero: 16-byte
// stores over the aligned middle, single bytes for the unaligned ends (block 0).
__device__ void zero_share(unsigned char* zero_out, int64_t zero_bytes, int64_t z, int64_t zero_blocks) {
  const uintptr_t start = reinterpret_cast<uintptr_t>(zero_out);
  const int64_t head = std::min<int64_t>(static_cast<int64_t>((16 - start % 16) % 16), zero_bytes);
  const int64_t vecs = (zero_bytes - head) / 16;
  uint4* body = reinterpret_cast<uint4*>(zero_out + head);
  for (int64_t i = z * blockDim.x + threadIdx.x; i < vecs; i += zero_blocks * blockDim.x) body[i] = make_uint4(0, 0, 0, 0);
  if (z == 0) {
    const int64_t tail = head + vecs * 16;
    for (int64_t i = threadIdx.x; i < head; i += blockDim.x) zero_out[i] = 0;
    for (int64_t i = tail + threadIdx.x; i < zero_bytes; i += blockDim.x) zero_out[i] = 0;
  }
}

// Blocks [0, num_tiles) scan and scatter; blocks past them zero zero_out.
// Shared memory: first[E+1] (an expert's total rows, then its first permuted row), before[E+1] (its
// rows in earlier tiles), next[W][E+1] (warp w's rows per expert, then its next free permuted row).
__global__ void __launch_bounds__(kMaxWarps * 32)
scan_scatter_kernel(const int32_t* __restrict__ ids, int64_t n, int64_t tile, int rounds, int num_tiles, int E,
                    const int32_t* __restrict__ counts, int64_t* __restrict__ offsets,
                    int32_t* __restrict__ permuted_to_unpermuted, int32_t* __restrict__ unpermuted_to_permuted,
                    unsigned char* __restrict__ zero_out, int64_t zero_bytes) {
  extern __shared__ int smem[];
  __shared__ int warp_sums[32];
  __shared__ int carry;
  const int stride = E + 1, W = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int* first = smem;
  int* before = smem + stride;
  int* next = smem + (2 + warp) * stride;  // this warp's row of next[W][E+1]
  mb::chain_start();
  const int scan_blocks = num_tiles > 0 ? num_tiles : 1;
  if (static_cast<int>(blockIdx.x) >= scan_blocks) {
    zero_share(zero_out, zero_bytes, blockIdx.x - scan_blocks, gridDim.x - scan_blocks);
    return;
  }
  for (int i = threadIdx.x; i < (2 + W) * stride; i += blockDim.x) smem[i] = 0;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  // Every tile's counts, one load per (tile, expert) cell, a batch of them in flight at once.
  const int64_t cells = static_cast<int64_t>(num_tiles) * stride;
  for (int64_t base = threadIdx.x; base < cells; base += kLoadBatch * blockDim.x) {
    int v[kLoadBatch];
#pragma unroll
    for (int b = 0; b < kLoadBatch; ++b) {
      const int64_t i = base + static_cast<int64_t>(b) * blockDim.x;
      v[b] = i < cells ? counts[i] : 0;
    }
#pragma unroll
    for (int b = 0; b < kLoadBatch; ++b) {
      if (v[b] == 0) continue;
      const int64_t i = base + static_cast<int64_t>(b) * blockDim.x;
      const int x = static_cast<int>(i % stride);
      atomicAdd(&first[x], v[b]);
      if (i / stride < blockIdx.x) atomicAdd(&before[x], v[b]);
    }
  }
  // This warp's rows per expert: the highest lane of each equal-key group adds the group's size.
  const int64_t warp_begin = static_cast<int64_t>(blockIdx.x) * tile + static_cast<int64_t>(warp) * rounds * 32;
  for (int r = 0; r < rounds; ++r) {
    const int64_t e = warp_begin + static_cast<int64_t>(r) * 32 + lane;
    const int key = e < n ? expert_key(ids[e], E) : -1;  // -1: a key no real row has
    const unsigned same = __match_any_sync(0xffffffffu, key);
    if (key >= 0 && (same >> lane) == 1u) next[key] += __popc(same);
    __syncwarp();
  }
  __syncthreads();
  // Exclusive scan of first[0..E] in chunks of blockDim.x (block 0 also writes the offsets).
  for (int base = 0; base < stride; base += blockDim.x) {
    const int x = base + threadIdx.x;
    const int v = x < stride ? first[x] : 0;
    const int incl = mb::warp_inclusive_scan(v);
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    if (warp == 0) warp_sums[lane] = mb::warp_inclusive_scan(lane < W ? warp_sums[lane] : 0);
    __syncthreads();
    const int excl = carry + (warp == 0 ? 0 : warp_sums[warp - 1]) + incl - v;
    __syncthreads();  // everyone has read carry and warp_sums
    if (x < stride) {
      first[x] = excl;
      if (blockIdx.x == 0) offsets[x] = excl;
    }
    if (threadIdx.x == blockDim.x - 1) carry = excl + v;
    __syncthreads();
  }
  // Warp w's first x-row: the tile's first x-row plus the x-rows of warps < w.
  for (int x = threadIdx.x; x < stride; x += blockDim.x) {
    int run = first[x] + before[x];
    for (int w = 0; w < W; ++w) {
      int* slot = smem + (2 + w) * stride + x;
      const int c = *slot;
      *slot = run;
      run += c;
    }
  }
  __syncthreads();
  for (int r = 0; r < rounds; ++r) {
    const int64_t e = warp_begin + static_cast<int64_t>(r) * 32 + lane;  // < n <= INT32_MAX where used
    mb::place_round(e < n ? expert_key(ids[e], E) : -1, static_cast<int>(e), next, permuted_to_unpermuted,
                    unpermuted_to_permuted);
  }
}

struct Tiling {
  int64_t tile, num_tiles;
};

Tiling tiling_for(int64_t n) {
  int64_t tile = kMinTile;
  while ((n + tile - 1) / tile > kMaxTiles) tile *= 2;
  return {tile, (n + tile - 1) / tile};
}

// Warps per scatter block: as many as kMaxWarps whose per-expert counters fit kWarpCountBytes.
int warps_for(int num_experts) {
  int w = kMaxWarps;
  while (w > 1 && static_cast<int64_t>(w) * (num_experts + 1) * sizeof(int) > kWarpCountBytes) w /= 2;
  return w;
}

size_t workspace_bytes_for(int64_t n, int num_experts) {
  return static_cast<size_t>(tiling_for(n).num_tiles) * (num_experts + 1) * sizeof(int32_t);
}

// The workspace of every call of up to n rows: the tile count falls where the tile doubles (65 tiles of 1024 rows
// become 33 of 2048), so a count's own workspace can be smaller than a smaller count's; no tiling has more tiles than
// ceil(n / kMinTile) or kMaxTiles.
size_t workspace_bytes_up_to(int64_t n, int num_experts) {
  const int64_t tiles = std::min(kMaxTiles, (n + kMinTile - 1) / kMinTile);
  return static_cast<size_t>(tiles) * (num_experts + 1) * sizeof(int32_t);
}

// Past the default 48 KB of dynamic shared memory a kernel must be allowed more (many experts): once per call.
template <typename Kernel>
mb_status allow_smem(Kernel kernel, size_t smem, const char* who) {
  if (smem <= 48 * 1024) return MB_OK;
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
  if (err != cudaSuccess) return mb::fail(MB_ERR_CUDA, "%s: shared memory %zu bytes: %s", who, smem,
                                          cudaGetErrorString(err));
  return MB_OK;
}

// The scan + scatter launch of both forms (counts: the histogram of each of t's tiles in the workspace), with the
// blocks past the tiles zeroing zero_out.
mb_status launch_scan_scatter(const char* who, const int32_t* topk_ids, int64_t n, const Tiling& t, int num_experts,
                              const int32_t* counts, int32_t* permuted_to_unpermuted,
                              int32_t* unpermuted_to_permuted, int64_t* expert_first_token_offset, void* zero_out,
                              size_t zero_bytes, cudaStream_t stream) {
  const int warps = warps_for(num_experts);
  const size_t smem = (2 + static_cast<size_t>(warps)) * (num_experts + 1) * sizeof(int);
  MB_TRY(allow_smem(scan_scatter_kernel, smem, who));
  // One block even with no rows: block 0 writes the (all-zero) offsets. Zero blocks: 8 16-byte stores
  // per thread, at most kMaxZeroBlocks.
  const int64_t scan_blocks = t.num_tiles > 0 ? t.num_tiles : 1;
  const int64_t per_zero_block = static_cast<int64_t>(32 * warps) * 16 * 8;
  const int64_t zero_blocks =
      std::min<int64_t>((static_cast<int64_t>(zero_bytes) + per_zero_block - 1) / per_zero_block, kMaxZeroBlocks);
  const int rounds = static_cast<int>(t.tile / (32 * warps));
  return mb::check_launch("scan_scatter_kernel", mb::launch_after_trigger_smem(
      scan_scatter_kernel, dim3(static_cast<unsigned>(scan_blocks + zero_blocks)), dim3(32 * warps), smem, stream, true,
      topk_ids, n, t.tile, rounds, static_cast<int>(t.num_tiles), num_experts, counts, expert_first_token_offset,
      permuted_to_unpermuted, unpermuted_to_permuted, static_cast<unsigned char*>(zero_out),
      static_cast<int64_t>(zero_bytes)));
}

// What both forms check of the maps, the workspace and zero_out for n = T*K rows.
mb_status check_map_args(const char* who, int64_t n, int num_experts, int32_t* permuted_to_unpermuted,
                         int32_t* unpermuted_to_permuted, int64_t* expert_first_token_offset, void* workspace,
                         size_t workspace_bytes, void* zero_out, size_t zero_bytes) {
  MB_REQUIRE(n <= INT32_MAX, "%s: num_tokens*top_k=%lld exceeds the int32 row maps", who, static_cast<long long>(n));
  if (num_experts > kMaxExperts) {
    return mb::fail(MB_ERR_UNSUPPORTED, "%s: num_experts=%d exceeds this kernel's %d", who, num_experts, kMaxExperts);
  }
  const size_t need = workspace_bytes_for(n, num_experts);
  MB_REQUIRE(workspace_bytes >= need, "%s: workspace_bytes=%zu, need %zu", who, workspace_bytes, need);
  MB_REQUIRE(expert_first_token_offset, "%s: expert_first_token_offset must be non-NULL", who);
  MB_REQUIRE(n == 0 || (permuted_to_unpermuted && unpermuted_to_permuted && workspace),
             "%s: both maps and workspace must be non-NULL", who);
  MB_REQUIRE(zero_out || zero_bytes == 0, "%s: zero_out must be non-NULL when zero_bytes (%zu) > 0", who, zero_bytes);
  return MB_OK;
}

}  // namespace

extern "C" size_t mb_routing_prologue_three_step_workspace(int num_tokens, int top_k, int num_experts) {
  if (num_tokens < 0 || top_k < 1 || num_experts < 1) return 0;
  return workspace_bytes_up_to(static_cast<int64_t>(num_tokens) * top_k, num_experts);
}

extern "C" mb_status mb_routing_prologue_three_step(const int32_t* topk_ids, int num_tokens, int top_k,
                                                    int num_experts, int32_t* permuted_to_unpermuted,
                                                    int32_t* unpermuted_to_permuted,
                                                    int64_t* expert_first_token_offset, void* workspace,
                                                    size_t workspace_bytes, void* zero_out, size_t zero_bytes,
                                                    cudaStream_t stream) {
  const char* who = "mb_routing_prologue_three_step";
  MB_REQUIRE(num_tokens >= 0, "%s: num_tokens must be >= 0, got %d", who, num_tokens);
  MB_REQUIRE(top_k >= 1, "%s: top_k must be >= 1, got %d", who, top_k);
  MB_REQUIRE(num_experts >= 1, "%s: num_experts must be >= 1, got %d", who, num_experts);
  const int64_t n = static_cast<int64_t>(num_tokens) * top_k;
  MB_TRY(check_map_args(who, n, num_experts, permuted_to_unpermuted, unpermuted_to_permuted, expert_first_token_offset,
                        workspace, workspace_bytes, zero_out, zero_bytes));
  MB_REQUIRE(n == 0 || topk_ids, "%s: topk_ids must be non-NULL", who);
  const Tiling t = tiling_for(n);
  int32_t* counts = static_cast<int32_t*>(workspace);
  const size_t hist_smem = (static_cast<size_t>(num_experts) + 1) * sizeof(int);
  if (t.num_tiles > 0) {
    MB_TRY(mb::check_launch("histogram_kernel", mb::launch_after_trigger_smem(
                                                    histogram_kernel, dim3(static_cast<unsigned>(t.num_tiles)),
                                                    dim3(kHistThreads), hist_smem, stream, true, topk_ids, n, t.tile,
                                                    num_experts, counts)));
  }
  return launch_scan_scatter(who, topk_ids, n, t, num_experts, counts, permuted_to_unpermuted, unpermuted_to_permuted,
                             expert_first_token_offset, zero_out, zero_bytes, stream);
}

extern "C" mb_status mb_routing_prologue_three_step_routing(
    const void* logits, int dtype, const float* correction_bias, int num_tokens, int num_experts, int top_k,
    int method, int renormalize, int num_groups, int topk_groups, float routed_scaling_factor, int32_t* topk_ids,
    float* topk_weights, int32_t* permuted_to_unpermuted, int32_t* unpermuted_to_permuted,
    int64_t* expert_first_token_offset, void* workspace, size_t workspace_bytes, void* zero_out, size_t zero_bytes,
    cudaStream_t stream) {
  const char* who = "mb_routing_prologue_three_step_routing";
  MB_TRY(mb::check_routing_args(who, correction_bias, num_tokens, num_experts, top_k, method, num_groups,
                                topk_groups, routed_scaling_factor));
  const int64_t n = static_cast<int64_t>(num_tokens) * top_k;
  MB_TRY(check_map_args(who, n, num_experts, permuted_to_unpermuted, unpermuted_to_permuted, expert_first_token_offset,
                        workspace, workspace_bytes, zero_out, zero_bytes));
  MB_REQUIRE(num_tokens == 0 || (logits && topk_ids && topk_weights),
             "%s: logits, topk_ids and topk_weights must be non-NULL", who);
  if (n > kMinTile) {
    return mb::fail(MB_ERR_UNSUPPORTED, "%s: num_tokens*top_k=%lld exceeds the one block's %lld rows", who,
                    static_cast<long long>(n), static_cast<long long>(kMinTile));
  }
  const Tiling t = tiling_for(n);
  int32_t* counts = static_cast<int32_t*>(workspace);
  if (t.num_tiles > 0) {
    const bool grouped = method == MB_SIGMOID_GROUPED && num_groups > 1;
    const int routing_warps = kHistThreads / 32;
    const size_t scratch = grouped ? mb::routing_group_scratch_bytes(num_experts, num_groups) : 0;
    const size_t smem = routing_warps * scratch + (static_cast<size_t>(n) + num_experts + 1) * sizeof(int);
    MB_TRY(mb::dispatch_dtype(dtype, who, [&](auto tag) {
      using T = typename decltype(tag)::type;
      return mb::dispatch_routing_slots<mb::kRoutingMaxExperts / 32>(num_experts, [&](auto slots_const) {
        constexpr int SLOTS = decltype(slots_const)::value;
        const auto kernel =
            grouped ? routed_histogram_kernel<T, SLOTS, true> : routed_histogram_kernel<T, SLOTS, false>;
        MB_TRY(allow_smem(kernel, smem, who));  // many experts in groups
        return mb::check_launch("routed_histogram_kernel", mb::launch_after_trigger_smem(
            kernel, dim3(1), dim3(kHistThreads), smem, stream, true, static_cast<const T*>(logits), correction_bias,
            num_tokens, num_experts, top_k, method, renormalize, grouped ? num_groups : 1, topk_groups,
            routed_scaling_factor, routing_warps, topk_ids, topk_weights, counts));
      });
    }));
  }
  return launch_scan_scatter(who, topk_ids, n, t, num_experts, counts, permuted_to_unpermuted, unpermuted_to_permuted,
                             expert_first_token_offset, zero_out, zero_bytes, stream);
}
