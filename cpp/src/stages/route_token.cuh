// One token's routing by one warp: its logits row -> its K expert ids and weights. The body of the routing kernel
// (stages/routing.cu, a warp per token) and of the routing phase of the fused prologue that routes
// (stages/routing_prologue_fused.cu, one block: routing, then the expert maps); the method, the keys and the order
// of the picks are described in routing.cu.
#pragma once

#include <cfloat>
#include <climits>

#include "common/common.cuh"

namespace mb {

constexpr int kRoutingMaxExperts = 1024;  // 32 register slots per lane

// Order-preserving map of a float key to unsigned bits (larger key -> larger bits), with
// -0 folded onto +0 so that they tie as the float compare says. 0 is below every finite or
// infinite key and stands for "no candidate".
__device__ __forceinline__ unsigned routing_key_bits(float k) {
  const unsigned u = __float_as_uint(k + 0.0f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float routing_warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Winner of a warp-wide (larger bits, lower id) argmax; bits == 0 means "nothing" on that lane.
__device__ __forceinline__ int routing_warp_argmax(unsigned bits, int id) {
  const unsigned best = __reduce_max_sync(0xffffffffu, bits);
  return static_cast<int>(__reduce_min_sync(0xffffffffu, bits == best && bits != 0 ? static_cast<unsigned>(id)
                                                                                   : static_cast<unsigned>(INT_MAX)));
}

// The grouped selection's scratch a warp needs (sigmoid_grouped with num_groups > 1), in bytes: the keys with one
// padding word every 32 (so that the lanes scanning 32-key groups read 32 banks), the group scores and the
// chosen-group flags, rounded to 16 bytes.
__host__ __device__ constexpr int routing_group_scratch_bytes(int num_experts, int num_groups) {
  return ((num_experts + num_experts / 32) * 4 + num_groups * 5 + 15) / 16 * 16;
}

// Every lane of a warp calls it for one token: `row` is the token's E logits, `ids` / `weights` its K outputs. With
// kGrouped, `scratch` is the warp's routing_group_scratch_bytes(E, num_groups) of shared memory (rewritten by each
// token). With kKeepIds the ids are also written to `kept_ids` (the token's K, in shared memory).
template <typename T, int SLOTS, bool kGrouped, bool kKeepIds = false>
__device__ __forceinline__ void route_token(const T* __restrict__ row, const float* __restrict__ bias, int E, int K,
                                            int method, int renormalize, int num_groups, int topk_groups,
                                            float scale, int32_t* __restrict__ ids, float* __restrict__ weights,
                                            unsigned char* scratch, int32_t* kept_ids) {
  const int lane = threadIdx.x % 32;
  float x[SLOTS], key[SLOTS], b[SLOTS];
  unsigned taken = 0;  // bit s: slot s is chosen, ineligible or past E
  float row_max = -FLT_MAX;
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) {  // the logits and the correction bias in one round trip
    const int i = lane + 32 * s;
    x[s] = i < E ? to_f32(row[i]) : -FLT_MAX;
    b[s] = bias && i < E ? bias[i] : 0.0f;
    if (i >= E) taken |= 1u << s;
  }
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) {
    const int i = lane + 32 * s;
    key[s] = method == MB_SIGMOID_GROUPED && i < E ? sigmoid_f32(x[s]) + b[s] : x[s];
    row_max = fmaxf(row_max, x[s]);
  }
  row_max = lanes_max(row_max);
  // Only an un-renormalised softmax_topk needs the full-row denominator.
  float denom = 1.0f;
  if (method == MB_SOFTMAX_TOPK && !renormalize) {
    float d = 0.0f;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) d += (taken >> s) & 1 ? 0.0f : expf(x[s] - row_max);
    denom = routing_warp_sum(d);
  }

  if constexpr (kGrouped) {
    // Group score = sum of the group's two largest keys, lane g scanning group g's keys from shared memory (the
    // groups in parallel: a warp-wide reduction per group, one group after another, made DeepSeek-V3's routing of
    // 256 experts in 8 groups 14.0 us a call on an H200, this 5.3); then exclude the experts of every group outside
    // the topk_groups best (ties toward the lower group id).
    const int gsize = E / num_groups;
    float* staged = reinterpret_cast<float*>(scratch);
    float* group_keys = staged + E + E / 32;
    unsigned char* group_taken = reinterpret_cast<unsigned char*>(group_keys + num_groups);
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int i = lane + 32 * s;
      if (i < E) staged[i + i / 32] = key[s];
    }
    __syncwarp();
    for (int g = lane; g < num_groups; g += 32) {
      float a = -FLT_MAX, c = -FLT_MAX;
      for (int i = g * gsize; i < (g + 1) * gsize; ++i) {
        const float v = staged[i + i / 32];
        if (v > a) { c = a; a = v; } else if (v > c) { c = v; }
      }
      group_keys[g] = a + c;
      group_taken[g] = 0;
    }
    __syncwarp();
    for (int r = 0; r < topk_groups; ++r) {
      unsigned bits = 0;
      int id = INT_MAX;
      for (int g = lane; g < num_groups; g += 32) {
        const unsigned kb = group_taken[g] ? 0u : routing_key_bits(group_keys[g]);
        if (kb > bits) { bits = kb; id = g; }  // lanes stride g upward: the first of equals wins
      }
      const int gbest = routing_warp_argmax(bits, id);
      if (lane == 0) group_taken[gbest] = 1;
      __syncwarp();
    }
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int i = lane + 32 * s;
      if (i < E && !group_taken[i / gsize]) taken |= 1u << s;
    }
    __syncwarp();  // the scratch is rewritten by this warp's next token
  }

  // Pick the K winners in order. The keys' order bits are made once per token (0: taken,
  // ineligible or past E), and a pick only selects: lane (j % 32) keeps pick j's id, and the
  // weights of a chunk of 32 picks are computed at its end by the lanes holding them, in parallel
  // (made inside the loop, each key's bits and each pick's weight made the kernel issue-bound).
  unsigned kb[SLOTS];
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) kb[s] = (taken >> s) & 1 ? 0u : routing_key_bits(key[s]);
  float chosen_sum = 0.0f;
  float top_logit = 0.0f;
  int my_id = 0;
  float my_w = 0.0f;
  for (int j = 0; j < K; ++j) {
    unsigned bits = 0;
    int bslot = 0;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {  // ascending ids per lane: the first of equals wins
      if (kb[s] > bits) { bits = kb[s]; bslot = s; }
    }
    const int win = routing_warp_argmax(bits, lane + 32 * bslot);
    const bool won = lane + 32 * bslot == win;  // only the winner's lane holds id win
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) kb[s] = won && s == bslot ? 0u : kb[s];
    if (lane == j % 32) my_id = win;
    if (j % 32 != 31 && j + 1 < K) continue;
    // Chunk [j0, j] is complete: lane l < n fetches pick j0 + l's logit from the lane holding it.
    const int j0 = j / 32 * 32, n = j - j0 + 1;
    float wx = 0.0f;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const float v = __shfl_sync(0xffffffffu, x[s], my_id % 32);
      wx = s == my_id / 32 ? v : wx;
    }
    if (j0 == 0) top_logit = __shfl_sync(0xffffffffu, wx, 0);  // the largest chosen logit
    float w = 0.0f;
    if (lane < n) {
      if (method == MB_SOFTMAX_TOPK) w = expf(wx - row_max) / denom;
      else if (method == MB_TOPK_SOFTMAX) w = expf(wx - top_logit);  // stable: wx <= top_logit
      else w = sigmoid_f32(wx);
    }
    chosen_sum += routing_warp_sum(w);  // a butterfly: every lane gets the same bits, run after run
    my_w = w;
    if (j + 1 < K && lane < n) {  // parked raw, rescaled below by this lane
      ids[j0 + lane] = my_id;
      weights[j0 + lane] = w;
      if constexpr (kKeepIds) kept_ids[j0 + lane] = my_id;
    }
  }
  const bool normalise = method == MB_TOPK_SOFTMAX || renormalize;
  const float f = normalise ? scale / chosen_sum : scale;
  const int last = (K - 1) / 32 * 32;  // first pick of the chunk still in registers
  if (last + lane < K) {
    ids[last + lane] = my_id;
    weights[last + lane] = my_w * f;
    if constexpr (kKeepIds) kept_ids[last + lane] = my_id;
  }
  for (int j = lane; j < last; j += 32) weights[j] *= f;  // this lane's own parked writes
}

// The routing arguments both routing entry points take, checked as one (MB_OK, or the failure naming `who`).
inline mb_status check_routing_args(const char* who, const float* correction_bias, int num_tokens, int num_experts,
                                    int top_k, int method, int num_groups, int topk_groups,
                                    float routed_scaling_factor) {
  MB_REQUIRE(num_tokens >= 0, "%s: num_tokens must be >= 0, got %d", who, num_tokens);
  MB_REQUIRE(num_experts >= 1, "%s: num_experts must be >= 1, got %d", who, num_experts);
  MB_REQUIRE(top_k >= 1 && top_k <= num_experts, "%s: top_k must be in [1, num_experts=%d], got %d", who,
             num_experts, top_k);
  MB_REQUIRE(method == MB_SOFTMAX_TOPK || method == MB_TOPK_SOFTMAX || method == MB_SIGMOID_GROUPED,
             "%s: method %d is not softmax_topk(0), topk_softmax(1) or sigmoid_grouped(2)", who, method);
  MB_REQUIRE(routed_scaling_factor > 0.0f && routed_scaling_factor <= FLT_MAX,
             "%s: routed_scaling_factor must be finite and > 0 (1 for none), got %g", who, routed_scaling_factor);
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
  if (num_experts > kRoutingMaxExperts) {
    return fail(MB_ERR_UNSUPPORTED, "%s: num_experts=%d exceeds the routing's %d", who, num_experts,
                kRoutingMaxExperts);
  }
  return MB_OK;
}

// Calls f(std::integral_constant<int, SLOTS>{}) with the fewest register slots per lane that hold E keys
// (SLOTS * 32 >= E, a power of two), E <= 32 * kMaxSlots (the caller's limit; kRoutingMaxExperts at most).
template <int kMaxSlots, typename F>
mb_status dispatch_routing_slots(int num_experts, F&& f) {
  static_assert(kMaxSlots >= 1 && kMaxSlots * 32 <= kRoutingMaxExperts, "at most the routing's register slots");
  if (num_experts <= 32) return f(std::integral_constant<int, 1>{});
  if constexpr (kMaxSlots >= 2) if (num_experts <= 64) return f(std::integral_constant<int, 2>{});
  if constexpr (kMaxSlots >= 4) if (num_experts <= 128) return f(std::integral_constant<int, 4>{});
  if constexpr (kMaxSlots >= 8) if (num_experts <= 256) return f(std::integral_constant<int, 8>{});
  if constexpr (kMaxSlots >= 16) if (num_experts <= 512) return f(std::integral_constant<int, 16>{});
  if constexpr (kMaxSlots >= 32) return f(std::integral_constant<int, 32>{});
  return fail(MB_ERR_UNSUPPORTED, "routing: num_experts=%d exceeds %d register slots a lane", num_experts, kMaxSlots);
}

}  // namespace mb
