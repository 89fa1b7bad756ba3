// Finalize: out[t] = sum_j w[t,j] * (gemm2_out[unpermuted_to_permuted[t*K + j]] + b2[ids[t,j]]).
// One block per token gathers its K rows and sums them in fp32, j ascending, in one thread per
// column slice. A gather has no cross-thread reduction at all, so its order is fixed: the
// deterministic and the non-deterministic requests run this same kernel and are bit-identical.
// (The faster scheme for the non-deterministic case, scattering into the token rows from the
// GEMM2 epilogue, is mb_grouped_gemm_sm90_finalize; as a separate pass, the gather is the
// cheaper one: each output is written once and no atomics are needed.)
#include "common.cuh"

namespace {

constexpr int kThreads = 128;

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
finalize_kernel(const T* __restrict__ gemm2_out, const T* __restrict__ b2, const float* __restrict__ topk_weights,
                const int32_t* __restrict__ topk_ids, const int32_t* __restrict__ unpermuted_to_permuted,
                int num_tokens, int hidden, int top_k, T* __restrict__ out) {
  for (int64_t t = blockIdx.x; t < num_tokens; t += gridDim.x) {
    for (int h = threadIdx.x * VEC; h < hidden; h += kThreads * VEC) {
      float acc[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[i] = 0.0f;
      for (int j = 0; j < top_k; ++j) {
        const int64_t e = t * top_k + j;
        const float w = topk_weights[e];
        float x[VEC];
        mb::load_f32<T, VEC>(gemm2_out + static_cast<int64_t>(unpermuted_to_permuted[e]) * hidden + h, x);
        if (b2) {
          float b[VEC];
          mb::load_f32<T, VEC>(b2 + static_cast<int64_t>(topk_ids[e]) * hidden + h, b);
#pragma unroll
          for (int i = 0; i < VEC; ++i) x[i] += b[i];
        }
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc[i] = fmaf(w, x[i], acc[i]);
      }
      mb::store_f32<T, VEC>(out + t * hidden + h, acc);
    }
  }
}

}  // namespace

extern "C" mb_status mb_finalize(const void* gemm2_out, int dtype, const void* b2, const float* topk_weights,
                                 const int32_t* topk_ids, const int32_t* unpermuted_to_permuted, int num_tokens,
                                 int hidden, int top_k, int deterministic, void* out, cudaStream_t stream) {
  (void)deterministic;  // both modes are the fixed-order gather (see the top of this file)
  const char* who = "mb_finalize";
  MB_REQUIRE(num_tokens >= 0, "%s: num_tokens must be >= 0, got %d", who, num_tokens);
  MB_REQUIRE(hidden >= 1, "%s: hidden must be >= 1, got %d", who, hidden);
  MB_REQUIRE(top_k >= 1, "%s: top_k must be >= 1, got %d", who, top_k);
  if (num_tokens == 0) return mb::dispatch_dtype(dtype, who, [](auto) { return MB_OK; });
  MB_REQUIRE(gemm2_out && topk_weights && unpermuted_to_permuted && out,
             "%s: gemm2_out, topk_weights, unpermuted_to_permuted and out must be non-NULL", who);
  MB_REQUIRE(!b2 || topk_ids, "%s: topk_ids must be non-NULL when b2 is given", who);
  return mb::dispatch_dtype(dtype, who, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kWide = 16 / sizeof(T);
    const bool wide = mb::vec_width<T>(hidden, {gemm2_out, b2, out}) == kWide;
    const unsigned grid = mb::row_grid(num_tokens);
    auto launch = [&](auto vec_const) {
      constexpr int VEC = decltype(vec_const)::value;
      finalize_kernel<T, VEC><<<grid, kThreads, 0, stream>>>(
          static_cast<const T*>(gemm2_out), static_cast<const T*>(b2), topk_weights, topk_ids,
          unpermuted_to_permuted, num_tokens, hidden, top_k, static_cast<T*>(out));
      return mb::check_launch("finalize_kernel");
    };
    return wide ? launch(std::integral_constant<int, kWide>{}) : launch(std::integral_constant<int, 1>{});
  });
}
