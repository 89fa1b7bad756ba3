// Fused routing prologue: one block builds permuted_to_unpermuted, its inverse and the int64
// expert_first_token_offset[E+1] from topk_ids in a single launch (small batches, where the
// three-step version's three launches dominate).
//
// Method: a counting sort, stable in the expanded row, with the rows split into 16 contiguous
// ranges, one per warp; a lane's rows are e_begin + lane + 32 j, read once into registers (all of a
// lane's loads in flight together) and kept there for the placement. (1) Each warp counts its
// range's rows per expert into its own row of shared counters; (2) per expert, a scan over the 16
// warps gives each warp's start inside the expert's segment, and an exclusive block scan of the E+1
// totals gives the offsets; (3) every warp walks its range in order, 32 rows at a time:
// __match_any_sync groups the lanes with the same expert, so a row's place is its warp's cursor for
// that expert plus the number of equal lanes before it. That is four barriers and one read of
// topk_ids, and step (3) is at most 4 dependent steps per warp (T*K / 16 rows, 32 at a time).
// Ids outside [0, E) (experts on another node) sort last under the sentinel key E and are left
// out of the offsets: off[E] counts only this node's rows. Up to 32 rows (decode calls), every thread
// counts straight over the n keys instead: no counters, no barriers.
//
// Limits (mirrored by moe_build.planner.rules): T <= 256, K in {1,2,4,6,8}, expert_log =
// floor(log2(E+1)) + 1 <= 9 (so at most 511 counters). Shared memory is static (32 KB of per-warp
// counters); the planner's shared-memory gate (fused_prologue_smem_bytes, sized for an earlier radix
// sort) stays under 35 KB inside these limits, so it always passes.
//
// The form that routes (mb_routing_prologue_fused_routing, the plan's routing=prologue): the same block first
// routes the tokens from their logits, a warp per token as the routing kernel does (stages/route_token.cuh), writes
// topk_ids / topk_weights and keeps the ids in shared memory, then builds the maps from those: one launch and one
// wait on the chain fewer than routing, then the map build (0.2-1.9 us a layer at 1-4 tokens on an H200; slower from
// 32, where one block routes what the routing kernel's grid spreads: docs/performance.md). The
// grouped selection's per-warp scratch shares the counters' 32 KB, which are zeroed only after the routing, so
// as many warps route as have scratch there (every warp but for the largest expert counts).
#include <algorithm>

#include "stages/route_token.cuh"

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxTokens = 256;
constexpr int kMaxTopK = 8;
constexpr int kRowsPerLane = kMaxTokens * kMaxTopK / kThreads;  // a lane's rows in the largest call
constexpr int kMaxExpertLog = 9;
constexpr int kMaxKeys = 1 << kMaxExpertLog;  // E + 1 < 2^9 counters
constexpr int kScanPerThread = kMaxKeys / kThreads;

// The counting sort of the n = T * K expanded rows' expert ids `topk_ids` (global or shared memory, complete when
// called) into the three maps; `cursor` is the block's kWarps x kMaxKeys counters.
__device__ __forceinline__ void build_maps(const int32_t* __restrict__ topk_ids, int n, int E,
                                           int32_t* __restrict__ permuted_to_unpermuted,
                                           int32_t* __restrict__ unpermuted_to_permuted,
                                           int64_t* __restrict__ expert_first_token_offset,
                                           int (*cursor)[kMaxKeys]) {
  __shared__ int warp_sums[kWarps];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  auto key_of = [&](int id) { return id >= 0 && id < E ? id : E; };  // other nodes' experts sort last, as E

  if (n <= 32) {
    // A decode call's few rows: each count the maps need read straight off the n keys, by every thread at once (key
    // x's offset: the keys below x; row i's place: the keys below its own and the equal keys of earlier rows), with
    // no counters, barriers or placement rounds.
    int below_x = 0, place = 0;
    const int mine = lane < n ? key_of(topk_ids[lane]) : 0;
#pragma unroll 8
    for (int j = 0; j < n; ++j) {
      const int kj = key_of(topk_ids[j]);
      below_x += kj < tid;
      place += kj < mine || (kj == mine && j < lane);
    }
    if (tid <= E) expert_first_token_offset[tid] = below_x;
    if (warp == 0 && lane < n) {
      permuted_to_unpermuted[place] = lane;
      unpermuted_to_permuted[lane] = place;
    }
    return;
  }

  // This warp's rows: a contiguous range, a multiple of 32 long (the last range may be short). The
  // lane's keys (expert of each row, E for other nodes, -1 past the range) are loaded before the
  // counters are zeroed, so their loads overlap it.
  const int per_warp = (n + kWarps * 32 - 1) / (kWarps * 32) * 32;
  const int e_begin = warp * per_warp, e_end = min(n, e_begin + per_warp);
  int key[kRowsPerLane];
#pragma unroll
  for (int j = 0; j < kRowsPerLane; ++j) {
    const int e = e_begin + lane + 32 * j;
    key[j] = e < e_end ? key_of(topk_ids[e]) : -1;
  }
  // Only keys 0..E are used, so only they are zeroed and scanned (all kMaxKeys would cost time at decode
  // sizes).
  for (int i = tid; i < kWarps * (E + 1); i += kThreads) cursor[i / (E + 1)][i % (E + 1)] = 0;
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kRowsPerLane; ++j) {
    if (key[j] >= 0) atomicAdd(&cursor[warp][key[j]], 1);
  }
  __syncthreads();

  // Per key: the warps' counts become their exclusive prefix (each warp's start inside the key's
  // segment); the key's total goes into the block scan. Thread tid owns kScanPerThread keys.
  int c[kScanPerThread], sum = 0;
#pragma unroll
  for (int i = 0; i < kScanPerThread; ++i) {
    const int x = tid * kScanPerThread + i;
    int total = 0;
    if (x <= E) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const int v = cursor[w][x];
        cursor[w][x] = total;
        total += v;
      }
    }
    c[i] = total;
    sum += total;
  }
  const int incl = mb::warp_inclusive_scan(sum);
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  int base = incl - sum;
  for (int w = 0; w < warp; ++w) base += warp_sums[w];
#pragma unroll
  for (int i = 0; i < kScanPerThread; ++i) {
    const int x = tid * kScanPerThread + i;
    if (x <= E) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) cursor[w][x] += base;  // each warp's first row of key x
      expert_first_token_offset[x] = base;
    }
    base += c[i];
  }
  __syncthreads();

#pragma unroll
  for (int j = 0; j < kRowsPerLane; ++j) {
    if (e_begin + 32 * j < e_end) {  // warp-uniform: every lane takes part in the round
      mb::place_round(key[j], e_begin + lane + 32 * j, cursor[warp], permuted_to_unpermuted, unpermuted_to_permuted);
    }
  }
}

__global__ void __launch_bounds__(kThreads)
fused_maps_kernel(const int32_t* __restrict__ topk_ids, int n, int E,
                  int32_t* __restrict__ permuted_to_unpermuted, int32_t* __restrict__ unpermuted_to_permuted,
                  int64_t* __restrict__ expert_first_token_offset) {
  __shared__ int cursor[kWarps][kMaxKeys];  // per-warp rows per key, then per-warp cursors
  mb::chain_start();
  build_maps(topk_ids, n, E, permuted_to_unpermuted, unpermuted_to_permuted, expert_first_token_offset, cursor);
}

// Routes the T tokens (warp w: tokens w, w + routing_warps, ...), then builds the maps from the ids it kept.
template <typename T, int SLOTS, bool kGrouped>
__global__ void __launch_bounds__(kThreads)
routed_maps_kernel(const T* __restrict__ logits, const float* __restrict__ bias, int num_tokens, int E, int K,
                   int method, int renormalize, int num_groups, int topk_groups, float scale, int routing_warps,
                   int32_t* __restrict__ topk_ids, float* __restrict__ topk_weights,
                   int32_t* __restrict__ permuted_to_unpermuted, int32_t* __restrict__ unpermuted_to_permuted,
                   int64_t* __restrict__ expert_first_token_offset) {
  __shared__ alignas(16) int cursor[kWarps][kMaxKeys];  // the routing's scratch first, then the counters
  __shared__ int32_t kept_ids[kMaxTokens * kMaxTopK];
  const int warp = threadIdx.x / 32;
  mb::chain_start();
  if (warp < routing_warps) {
    unsigned char* scratch = reinterpret_cast<unsigned char*>(&cursor[0][0]) +
                             warp * mb::routing_group_scratch_bytes(E, num_groups);
    for (int t = warp; t < num_tokens; t += routing_warps) {
      mb::route_token<T, SLOTS, kGrouped, true>(logits + static_cast<int64_t>(t) * E, bias, E, K, method,
                                                renormalize, num_groups, topk_groups, scale, topk_ids + t * K,
                                                topk_weights + t * K, scratch, kept_ids + t * K);
    }
  }
  __syncthreads();  // every id kept, every warp's scratch read: the counters may be zeroed
  build_maps(kept_ids, num_tokens * K, E, permuted_to_unpermuted, unpermuted_to_permuted, expert_first_token_offset,
             cursor);
}

int expert_log(int num_experts) {
  int log = 0;
  for (unsigned v = static_cast<unsigned>(num_experts) + 1; v > 1; v >>= 1) ++log;  // floor(log2(E+1))
  return log + 1;
}

// The fused prologue's limits on T, K and E (MB_ERR_UNSUPPORTED outside them).
mb_status check_fused_limits(const char* who, int num_tokens, int top_k, int num_experts) {
  if (num_tokens > kMaxTokens) {
    return mb::fail(MB_ERR_UNSUPPORTED, "%s: num_tokens=%d exceeds the single-block limit %d", who, num_tokens,
                    kMaxTokens);
  }
  const int log = expert_log(num_experts);
  if (log > kMaxExpertLog) {
    return mb::fail(MB_ERR_UNSUPPORTED, "%s: expert_log=%d for num_experts=%d exceeds %d", who, log, num_experts,
                    kMaxExpertLog);
  }
  if (top_k != 1 && top_k != 2 && top_k != 4 && top_k != 6 && top_k != 8) {
    return mb::fail(MB_ERR_UNSUPPORTED, "%s: top_k=%d is not one of 1, 2, 4, 6, 8", who, top_k);
  }
  return MB_OK;
}

}  // namespace

extern "C" mb_status mb_routing_prologue_fused(const int32_t* topk_ids, int num_tokens, int top_k,
                                               int num_experts, int32_t* permuted_to_unpermuted,
                                               int32_t* unpermuted_to_permuted, int64_t* expert_first_token_offset,
                                               cudaStream_t stream) {
  const char* who = "mb_routing_prologue_fused";
  MB_REQUIRE(num_tokens >= 0, "%s: num_tokens must be >= 0, got %d", who, num_tokens);
  MB_REQUIRE(top_k >= 1, "%s: top_k must be >= 1, got %d", who, top_k);
  MB_REQUIRE(num_experts >= 1, "%s: num_experts must be >= 1, got %d", who, num_experts);
  MB_REQUIRE(expert_first_token_offset, "%s: expert_first_token_offset must be non-NULL", who);
  MB_REQUIRE(num_tokens == 0 || (topk_ids && permuted_to_unpermuted && unpermuted_to_permuted),
             "%s: topk_ids and both maps must be non-NULL", who);
  MB_TRY(check_fused_limits(who, num_tokens, top_k, num_experts));
  return mb::check_launch("fused_maps_kernel",
                           mb::launch_after_trigger(fused_maps_kernel, dim3(1), dim3(kThreads), stream, topk_ids,
                                                    num_tokens * top_k, num_experts, permuted_to_unpermuted,
                                                    unpermuted_to_permuted, expert_first_token_offset));
}

extern "C" mb_status mb_routing_prologue_fused_routing(
    const void* logits, int dtype, const float* correction_bias, int num_tokens, int num_experts, int top_k,
    int method, int renormalize, int num_groups, int topk_groups, float routed_scaling_factor, int32_t* topk_ids,
    float* topk_weights, int32_t* permuted_to_unpermuted, int32_t* unpermuted_to_permuted,
    int64_t* expert_first_token_offset, cudaStream_t stream) {
  const char* who = "mb_routing_prologue_fused_routing";
  MB_TRY(mb::check_routing_args(who, correction_bias, num_tokens, num_experts, top_k, method, num_groups,
                                topk_groups, routed_scaling_factor));
  MB_REQUIRE(expert_first_token_offset, "%s: expert_first_token_offset must be non-NULL", who);
  MB_REQUIRE(num_tokens == 0 || (logits && topk_ids && topk_weights && permuted_to_unpermuted &&
                                 unpermuted_to_permuted),
             "%s: logits, topk_ids, topk_weights and both maps must be non-NULL", who);
  MB_TRY(check_fused_limits(who, num_tokens, top_k, num_experts));
  const bool grouped = method == MB_SIGMOID_GROUPED && num_groups > 1;
  const int scratch = grouped ? mb::routing_group_scratch_bytes(num_experts, num_groups) : 0;
  const int routing_warps = grouped ? std::min(kWarps, static_cast<int>(sizeof(int) * kWarps * kMaxKeys) / scratch)
                                    : kWarps;
  return mb::dispatch_dtype(dtype, who, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return mb::dispatch_routing_slots<kMaxKeys / 32>(num_experts, [&](auto slots_const) {
      constexpr int SLOTS = decltype(slots_const)::value;
      return mb::check_launch("routed_maps_kernel", mb::launch_after_trigger(
          grouped ? routed_maps_kernel<T, SLOTS, true> : routed_maps_kernel<T, SLOTS, false>, dim3(1),
          dim3(kThreads), stream, static_cast<const T*>(logits), correction_bias, num_tokens, num_experts, top_k,
          method, renormalize, grouped ? num_groups : 1, topk_groups, routed_scaling_factor, routing_warps, topk_ids,
          topk_weights, permuted_to_unpermuted, unpermuted_to_permuted, expert_first_token_offset));
    });
  });
}
