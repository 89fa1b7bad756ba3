// Routing: logits [T, E] -> topk_ids [T, K] (int32) and topk_weights [T, K] (fp32).
//
// One warp per token, everything in registers: lane l holds experts l, l+32, ... (SLOTS = E/32
// rounded up to a power of two, so E <= 1024 needs at most 32 keys per lane). The K winners are
// picked one at a time: each lane's best untaken slot, then a warp-wide argmax done as two
// single-instruction reductions (max of the order-preserving key bits, then min of the ids that
// hold it), so larger key first, lower expert id on ties: a fixed order and a deterministic
// output. No block-wide barrier, one pass over the logits, no shared memory but the grouped
// selection's (its keys, per warp): at decode sizes the kernel is its launch plus one global round
// trip. Keys are chosen so that selection never depends on rounding of a derived quantity where
// avoidable:
//   softmax_topk : key = logit (softmax is monotone, so the top-k of the probabilities is the
//                  top-k of the logits, with no rounding ties that the logits do not have);
//                  weight = exp(x - max) / sum_e exp(x_e - max), or with renormalize
//                  exp(x - max) / sum over the K chosen (the full-row sum cancels, so it is skipped).
//   topk_softmax : key = logit; weight = softmax over the K chosen logits.
//   sigmoid_grouped (DeepSeek-V3): key = sigmoid(x) + correction_bias; with num_groups > 1 only
//                  the topk_groups groups with the largest (sum of their top-2 keys) are
//                  eligible; weight = the UNbiased sigmoid(x), optionally renormalised.
// Every method then multiplies the weights by routed_scaling_factor (pass 1 for none).
#include "stages/route_token.cuh"

namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxGroups = mb::kRoutingMaxExperts / 2;  // groups need >= 2 experts

// kGrouped: num_groups > 1 (sigmoid_grouped); only then the kernel has the shared memory the group selection uses.
template <typename T, int SLOTS, bool kGrouped>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
routing_kernel(const T* __restrict__ logits, const float* __restrict__ bias, int num_tokens, int E, int K,
               int method, int renormalize, int num_groups, int topk_groups, float scale,
               int32_t* __restrict__ topk_ids, float* __restrict__ topk_weights) {
  const int warp = threadIdx.x / 32;
  mb::chain_start();
  unsigned char* scratch = nullptr;
  if constexpr (kGrouped) {
    __shared__ alignas(16) unsigned char group_scratch[kWarpsPerBlock][mb::routing_group_scratch_bytes(
        mb::kRoutingMaxExperts, kMaxGroups)];
    scratch = group_scratch[warp];
  }
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp; t < num_tokens;
       t += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    mb::route_token<T, SLOTS, kGrouped>(logits + t * E, bias, E, K, method, renormalize, num_groups, topk_groups,
                                        scale, topk_ids + t * K, topk_weights + t * K, scratch, nullptr);
  }
}

}  // namespace

extern "C" mb_status mb_routing(const void* logits, int dtype, const float* correction_bias, int num_tokens,
                                int num_experts, int top_k, int method, int renormalize, int num_groups,
                                int topk_groups, float routed_scaling_factor, int32_t* topk_ids,
                                float* topk_weights, cudaStream_t stream) {
  const char* who = "mb_routing";
  MB_TRY(mb::check_routing_args(who, correction_bias, num_tokens, num_experts, top_k, method, num_groups,
                                topk_groups, routed_scaling_factor));
  if (num_tokens == 0) return MB_OK;
  MB_REQUIRE(logits && topk_ids && topk_weights, "%s: logits, topk_ids and topk_weights must be non-NULL", who);

  const bool grouped = method == MB_SIGMOID_GROUPED && num_groups > 1;
  // One warp per token, four per block.
  const unsigned grid = mb::row_grid((static_cast<int64_t>(num_tokens) + kWarpsPerBlock - 1) / kWarpsPerBlock);
  return mb::dispatch_dtype(dtype, who, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return mb::dispatch_routing_slots<32>(num_experts, [&](auto slots_const) {
      constexpr int SLOTS = decltype(slots_const)::value;
      return mb::check_launch("routing_kernel", mb::launch_after_trigger(
          grouped ? routing_kernel<T, SLOTS, true> : routing_kernel<T, SLOTS, false>, dim3(grid),
          dim3(kWarpsPerBlock * 32), stream, static_cast<const T*>(logits), correction_bias, num_tokens, num_experts,
          top_k, method, renormalize, grouped ? num_groups : 1, topk_groups, routed_scaling_factor, topk_ids,
          topk_weights));
    });
  });
}
