// Routing: logits [T, E] -> topk_ids [T, K] (int32) and topk_weights [T, K] (fp32).
//
// One warp per token. The warp stages the token's selection keys in shared memory, then picks
// the K winners one at a time with a warp-wide argmax (larger key first, lower expert id on
// ties), so the selection order is fixed and the output deterministic. Keys are chosen so that
// selection never depends on rounding of a derived quantity where avoidable:
//   softmax_topk : key = logit (softmax is monotone, so the top-k of the probabilities is the
//                  top-k of the logits, with no rounding ties that the logits do not have);
//                  weight = exp(x - max) / sum_e exp(x_e - max), optionally renormalised over
//                  the K chosen.
//   topk_softmax : key = logit; weight = softmax over the K chosen logits.
//   sigmoid_grouped (DeepSeek-V3): key = sigmoid(x) + correction_bias; with num_groups > 1 only
//                  the topk_groups groups with the largest (sum of their top-2 keys) are
//                  eligible; weight = the UNbiased sigmoid(x), optionally renormalised.
// Every method then multiplies the weights by routed_scaling_factor (pass 1 for none).
#include <cfloat>
#include <climits>

#include "common.cuh"

namespace {

using mb::to_f32;

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxExperts = 1024;  // staging takes up to ~62 bytes of shared memory per expert

struct Best {
  float key;
  int idx;  // INT_MAX = nothing found yet
};

// a beats b: larger key, then lower id. A found entry always beats "nothing".
__device__ __forceinline__ bool beats(const Best& a, const Best& b) {
  if (a.idx == INT_MAX) return false;
  if (b.idx == INT_MAX) return true;
  return a.key > b.key || (a.key == b.key && a.idx < b.idx);
}

__device__ __forceinline__ Best warp_best(Best b) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    Best o{__shfl_xor_sync(0xffffffffu, b.key, off), __shfl_xor_sync(0xffffffffu, b.idx, off)};
    if (beats(o, b)) b = o;
  }
  return b;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// The best not-yet-taken entry among keys[0..n) (lanes stride the range).
__device__ __forceinline__ Best select_next(const float* keys, const unsigned char* taken, int n, int lane) {
  Best b{-FLT_MAX, INT_MAX};
  for (int i = lane; i < n; i += 32) {
    const Best c{keys[i], i};
    if (!taken[i] && beats(c, b)) b = c;
  }
  return warp_best(b);
}

template <typename T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
routing_kernel(const T* __restrict__ logits, const float* __restrict__ bias, int num_tokens, int E, int K,
               int method, int renormalize, int num_groups, int topk_groups, float scale,
               int32_t* __restrict__ topk_ids, float* __restrict__ topk_weights) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  // Per warp: keys[E], group_keys[G], picked weights[K], picked ids[K] (4-byte words), then
  // the byte flags taken[E], group_taken[G] after all warps' words.
  const int group_slots = num_groups > 1 ? num_groups : 0;
  const int words = E + group_slots + 2 * K;
  float* keys = smem + warp * words;
  float* group_keys = keys + E;
  float* picked_w = group_keys + group_slots;
  int* picked_id = reinterpret_cast<int*>(picked_w + K);
  unsigned char* taken = reinterpret_cast<unsigned char*>(smem + kWarpsPerBlock * words) +
                         warp * (E + group_slots);
  unsigned char* group_taken = taken + E;

  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp; t < num_tokens;
       t += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const T* row = logits + t * E;
    float row_max = -FLT_MAX;
    for (int i = lane; i < E; i += 32) {
      const float x = to_f32(row[i]);
      keys[i] = method == MB_SIGMOID_GROUPED ? mb::sigmoid_f32(x) + (bias ? bias[i] : 0.0f) : x;
      taken[i] = 0;
      row_max = fmaxf(row_max, x);
    }
    row_max = warp_max(row_max);
    float denom = 0.0f;
    if (method == MB_SOFTMAX_TOPK) {
      for (int i = lane; i < E; i += 32) denom += expf(to_f32(row[i]) - row_max);
      denom = warp_sum(denom);
    }
    __syncwarp();

    if (group_slots > 0) {
      // Group score = sum of the group's two largest keys; then exclude the experts of every
      // group outside the topk_groups best (ties toward the lower group id).
      const int gsize = E / num_groups;
      for (int g = lane; g < num_groups; g += 32) {
        float a = -FLT_MAX, b = -FLT_MAX;
        for (int i = g * gsize; i < (g + 1) * gsize; ++i) {
          const float k = keys[i];
          if (k > a) { b = a; a = k; } else if (k > b) { b = k; }
        }
        group_keys[g] = a + b;
        group_taken[g] = 0;
      }
      __syncwarp();
      for (int r = 0; r < topk_groups; ++r) {
        const Best g = select_next(group_keys, group_taken, num_groups, lane);
        if (lane == 0) group_taken[g.idx] = 1;
        __syncwarp();
      }
      // taken[] doubles as "not eligible": experts of the groups that were not picked.
      for (int i = lane; i < E; i += 32) taken[i] = !group_taken[i / gsize];
      __syncwarp();
    }

    // Pick the K winners in order, staging ids and raw weights in shared memory.
    float chosen_sum = 0.0f;
    float top_logit = 0.0f;
    for (int j = 0; j < K; ++j) {
      const Best b = select_next(keys, taken, E, lane);
      const float x = to_f32(row[b.idx]);
      float w;
      if (method == MB_SOFTMAX_TOPK) {
        w = expf(x - row_max) / denom;
      } else if (method == MB_TOPK_SOFTMAX) {
        if (j == 0) top_logit = x;  // the largest chosen logit, for a stable exp
        w = expf(x - top_logit);
      } else {
        w = mb::sigmoid_f32(x);
      }
      chosen_sum += w;
      if (lane == 0) {
        taken[b.idx] = 1;
        picked_id[j] = b.idx;
        picked_w[j] = w;
      }
      __syncwarp();
    }
    // chosen_sum was accumulated j ascending on every lane; write the K results coalesced.
    const bool normalise = method == MB_TOPK_SOFTMAX || renormalize;
    const float f = normalise ? scale / chosen_sum : scale;
    for (int j = lane; j < K; j += 32) {
      topk_ids[t * K + j] = picked_id[j];
      topk_weights[t * K + j] = picked_w[j] * f;
    }
    __syncwarp();
  }
}

}  // namespace

extern "C" mb_status mb_routing(const void* logits, int dtype, const float* correction_bias, int num_tokens,
                                int num_experts, int top_k, int method, int renormalize, int num_groups,
                                int topk_groups, float routed_scaling_factor, int32_t* topk_ids,
                                float* topk_weights, cudaStream_t stream) {
  const char* who = "mb_routing";
  MB_REQUIRE(num_tokens >= 0, "%s: num_tokens must be >= 0, got %d", who, num_tokens);
  MB_REQUIRE(num_experts >= 1, "%s: num_experts must be >= 1, got %d", who, num_experts);
  MB_REQUIRE(top_k >= 1 && top_k <= num_experts, "%s: top_k must be in [1, num_experts=%d], got %d", who,
             num_experts, top_k);
  MB_REQUIRE(method == MB_SOFTMAX_TOPK || method == MB_TOPK_SOFTMAX || method == MB_SIGMOID_GROUPED,
             "%s: method %d is not softmax_topk(0), topk_softmax(1) or sigmoid_grouped(2)", who, method);
  MB_REQUIRE(routed_scaling_factor > 0.0f && routed_scaling_factor <= FLT_MAX,
             "%s: routed_scaling_factor must be finite and > 0 (1 for none), got %g", who,
             routed_scaling_factor);
  if (method == MB_SIGMOID_GROUPED) {
    MB_REQUIRE(num_groups >= 1 && num_experts % num_groups == 0,
               "%s: num_groups must be >= 1 and divide num_experts=%d, got %d", who, num_experts, num_groups);
    if (num_groups > 1) {
      const int gsize = num_experts / num_groups;
      MB_REQUIRE(gsize >= 2, "%s: grouped top-k sums each group's top-2 scores, so groups need >= 2 experts "
                 "(num_experts=%d, num_groups=%d)", who, num_experts, num_groups);
      MB_REQUIRE(topk_groups >= 1 && topk_groups <= num_groups && top_k <= topk_groups * gsize,
                 "%s: topk_groups must be in [1, num_groups=%d] and keep >= top_k=%d experts eligible, got %d",
                 who, num_groups, top_k, topk_groups);
    }
  } else {
    MB_REQUIRE(correction_bias == nullptr, "%s: correction_bias is only used by sigmoid_grouped", who);
    MB_REQUIRE(num_groups <= 1, "%s: grouped selection is only defined for sigmoid_grouped (num_groups=%d)",
               who, num_groups);
  }
  if (num_experts > kMaxExperts) {
    return mb::fail(MB_ERR_UNSUPPORTED, "%s: num_experts=%d exceeds this kernel's %d", who, num_experts,
                    kMaxExperts);
  }
  if (num_tokens == 0) return MB_OK;
  MB_REQUIRE(logits && topk_ids && topk_weights, "%s: logits, topk_ids and topk_weights must be non-NULL", who);

  const int group_slots = (method == MB_SIGMOID_GROUPED && num_groups > 1) ? num_groups : 0;
  const size_t smem = kWarpsPerBlock * ((num_experts + group_slots + 2 * top_k) * sizeof(float) +
                                        (num_experts + group_slots));
  const unsigned grid = mb::row_grid((static_cast<int64_t>(num_tokens) + kWarpsPerBlock - 1) / kWarpsPerBlock);
  return mb::dispatch_dtype(dtype, who, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // Above 48 KB (large E with large K) the block must opt in to more dynamic shared memory.
    const cudaError_t err = cudaFuncSetAttribute(routing_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(smem));
    if (err != cudaSuccess) {
      return mb::fail(MB_ERR_CUDA, "%s: shared memory %zu bytes: %s", who, smem, cudaGetErrorString(err));
    }
    routing_kernel<T><<<grid, kWarpsPerBlock * 32, smem, stream>>>(
        static_cast<const T*>(logits), correction_bias, num_tokens, num_experts, top_k, method, renormalize,
        group_slots ? num_groups : 1, topk_groups, routed_scaling_factor, topk_ids, topk_weights);
    return mb::check_launch("routing_kernel");
  });
}
