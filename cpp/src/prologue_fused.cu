// Fused routing prologue: one block of 256 threads builds permuted_to_unpermuted, its inverse and
// the int64 expert_first_token_offset[E+1] from topk_ids in a single launch (small batches, where
// the three-step version's three launches dominate).
//
// Method: a stable LSD radix sort of (expert, expanded row) pairs in shared memory, one pass per
// bit of the expert id (expert_log passes), each pass a block-wide stable split on that bit.
// Thread t owns token t's K pairs, so the pass's scan is over 256 per-thread counts. Ids outside
// [0, E) (experts on another node) sort last under the sentinel key E and are left out of the
// offsets: off[E] counts only this node's rows.
//
// Limits (mirrored by moe_build.planner.rules): T <= 256 (one token per thread),
// K in {1,2,4,6,8} (compile-time register arrays), expert_log = floor(log2(E+1)) + 1 <= 9,
// dynamic shared memory = 2*T*K*8 (ping-pong pair buffers) + (E+1)*4 (offsets staging) below
// the device's per-block limit (fused_prologue_smem_bytes).
#include <type_traits>

#include "common.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kMaxTokens = kThreads;
constexpr int kMaxExpertLog = 9;

// Exclusive block-wide scan of one int per thread; *total receives the sum.
__device__ __forceinline__ int block_exclusive_scan(int v, int* warp_sums, int* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int incl = mb::warp_inclusive_scan(v);
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int w = mb::warp_inclusive_scan(lane < kThreads / 32 ? warp_sums[lane] : 0);
    if (lane < kThreads / 32) warp_sums[lane] = w;  // inclusive warp prefix
  }
  __syncthreads();
  const int base = warp == 0 ? 0 : warp_sums[warp - 1];
  *total = warp_sums[kThreads / 32 - 1];
  __syncthreads();  // warp_sums is reused by the next call
  return base + incl - v;
}

template <int K>
__global__ void __launch_bounds__(kThreads)
fused_maps_kernel(const int32_t* __restrict__ topk_ids, int num_tokens, int E, int bits,
                  int32_t* __restrict__ permuted_to_unpermuted, int32_t* __restrict__ unpermuted_to_permuted,
                  int64_t* __restrict__ expert_first_token_offset) {
  extern __shared__ int2 pairs[];  // [2][n] (key = expert, value = expanded row)
  __shared__ int warp_sums[kThreads / 32];
  const int n = num_tokens * K;
  int2* src = pairs;
  int2* dst = pairs + n;
  int* first_row = reinterpret_cast<int*>(pairs + 2 * n);  // [E+1]
  const int t = threadIdx.x;
  const bool owner = t < num_tokens;

  if (owner) {
#pragma unroll
    for (int i = 0; i < K; ++i) {
      const int e = t * K + i;
      const int x = topk_ids[e];
      src[e] = make_int2(x >= 0 && x < E ? x : E, e);
    }
  }
  __syncthreads();

  for (int b = 0; b < bits; ++b) {
    int2 item[K];
    int zeros = 0;
    if (owner) {
#pragma unroll
      for (int i = 0; i < K; ++i) {
        item[i] = src[t * K + i];
        zeros += ((item[i].x >> b) & 1) == 0;
      }
    }
    int total_zeros;
    const int zeros_before = block_exclusive_scan(zeros, warp_sums, &total_zeros);
    if (owner) {
      int z = zeros_before;            // zeros among the pairs before this one
      int o = t * K - zeros_before;    // ones among the pairs before this one
#pragma unroll
      for (int i = 0; i < K; ++i) {
        if (((item[i].x >> b) & 1) == 0) dst[z++] = item[i];
        else dst[total_zeros + o++] = item[i];
      }
    }
    __syncthreads();
    int2* tmp = src; src = dst; dst = tmp;
  }

  // src is sorted by expert, stable in the expanded row. Each boundary between keys a < b at
  // position p sets first_row[x] = p for x in (a, b]; every x in [0, E] is written exactly once.
  if (owner) {
#pragma unroll
    for (int i = 0; i < K; ++i) {
      const int p = t * K + i;
      const int2 cur = src[p];
      permuted_to_unpermuted[p] = cur.y;
      unpermuted_to_permuted[cur.y] = p;
      const int prev_key = p == 0 ? -1 : src[p - 1].x;
      for (int x = prev_key + 1; x <= cur.x; ++x) first_row[x] = p;
    }
  }
  if (t == 0) {
    const int last_key = n == 0 ? -1 : src[n - 1].x;
    for (int x = last_key + 1; x <= E; ++x) first_row[x] = n;
  }
  __syncthreads();
  for (int x = t; x <= E; x += kThreads) expert_first_token_offset[x] = first_row[x];
}

int expert_log(int num_experts) {
  int log = 0;
  for (unsigned v = static_cast<unsigned>(num_experts) + 1; v > 1; v >>= 1) ++log;  // floor(log2(E+1))
  return log + 1;
}

}  // namespace

extern "C" mb_status mb_build_maps_fused(const int32_t* topk_ids, int num_tokens, int top_k, int num_experts,
                                         int32_t* permuted_to_unpermuted, int32_t* unpermuted_to_permuted,
                                         int64_t* expert_first_token_offset, cudaStream_t stream) {
  const char* who = "mb_build_maps_fused";
  MB_REQUIRE(num_tokens >= 0, "%s: num_tokens must be >= 0, got %d", who, num_tokens);
  MB_REQUIRE(top_k >= 1, "%s: top_k must be >= 1, got %d", who, top_k);
  MB_REQUIRE(num_experts >= 1, "%s: num_experts must be >= 1, got %d", who, num_experts);
  MB_REQUIRE(expert_first_token_offset, "%s: expert_first_token_offset must be non-NULL", who);
  MB_REQUIRE(num_tokens == 0 || (topk_ids && permuted_to_unpermuted && unpermuted_to_permuted),
             "%s: topk_ids and both maps must be non-NULL", who);
  if (num_tokens > kMaxTokens) {
    return mb::fail(MB_ERR_UNSUPPORTED, "%s: num_tokens=%d exceeds the single-block limit %d", who, num_tokens,
                    kMaxTokens);
  }
  const int log = expert_log(num_experts);
  if (log > kMaxExpertLog) {
    return mb::fail(MB_ERR_UNSUPPORTED, "%s: expert_log=%d for num_experts=%d exceeds %d", who, log, num_experts,
                    kMaxExpertLog);
  }
  // Same formula as planner.rules.fused_prologue_smem_bytes.
  const size_t smem = 2ull * num_tokens * top_k * 8 + (static_cast<size_t>(num_experts) + 1) * 4;
  int device = 0, smem_limit = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&smem_limit, cudaDevAttrMaxSharedMemoryPerBlock, device);
  if (err != cudaSuccess) return mb::fail(MB_ERR_CUDA, "%s: reading the shared-memory limit: %s", who, cudaGetErrorString(err));
  if (smem >= static_cast<size_t>(smem_limit)) {
    return mb::fail(MB_ERR_UNSUPPORTED, "%s: needs %zu bytes of shared memory, limit %d", who, smem, smem_limit);
  }

  const int bits = log;  // log bits hold every key in [0, E]
  auto launch = [&](auto k_const) {
    constexpr int K = decltype(k_const)::value;
    fused_maps_kernel<K><<<1, kThreads, smem, stream>>>(topk_ids, num_tokens, num_experts, bits,
                                                        permuted_to_unpermuted, unpermuted_to_permuted,
                                                        expert_first_token_offset);
    return mb::check_launch("fused_maps_kernel");
  };
  switch (top_k) {
    case 1: return launch(std::integral_constant<int, 1>{});
    case 2: return launch(std::integral_constant<int, 2>{});
    case 4: return launch(std::integral_constant<int, 4>{});
    case 6: return launch(std::integral_constant<int, 6>{});
    case 8: return launch(std::integral_constant<int, 8>{});
    default:
      return mb::fail(MB_ERR_UNSUPPORTED, "%s: top_k=%d is not one of 1, 2, 4, 6, 8", who, top_k);
  }
}
