// What the weight-only decode kernels that stage their token rows in shared memory share (gemm/woq_decode.cu's
// staged kernel, gemm/woq_decode_digits.cu): their shared-memory budget, their main loop over big batches, and their
// last step, a CTA's partial sums, held in shared memory by (K slice, weight row, token row), to C.
#pragma once

#include <cstdint>

#include "gemm/decode_launch.cuh"
#include "gemm/woq.cuh"

namespace mbk {

constexpr size_t kTokenBudget = 104 * 1024;  // token bytes a CTA may hold with two CTAs an SM

// A warp's main loop over its nb batches (128-k groups), NB to a big batch, in two register buffers: load_big(buf, jb)
// issues big batch jb's loads into buffer buf (the caller has issued big batch 0's into buffer 0), compute(buf, j, jb,
// valid) computes slot j of buffer buf as batch jb (`valid` false past the slice). A big batch's first batch is
// computed before the next big batch's loads are issued: the wait there (at the first use of its registers) then
// covers this big batch only, and the loads issued after it stay in flight over the remaining batches (issued first,
// the wait that follows them would drain them too). Each batch is computed unconditionally: behind a branch, a
// batch's first instruction would wait again (ptxas cannot know that the branch before it waited).
template <int NB, typename LoadBig, typename Compute>
__device__ __forceinline__ void run_big_batches(int nb, LoadBig&& load_big, Compute&& compute) {
  auto step = [&](int cur, int jb) {
    compute(cur, 0, jb, jb < nb);
    if (jb + NB < nb) load_big(cur ^ 1, jb + NB);  // warp-uniform
#pragma unroll
    for (int j = 1; j < NB; ++j) compute(cur, j, jb + j, jb + j < nb);
  };
  for (int jb = 0; jb < nb; jb += 2 * NB) {  // warp-uniform
    step(0, jb);
    if (jb + NB >= nb) break;
    step(1, jb + NB);
  }
}

// run_big_batches' loop with the big batches taken in pairs: the caller has issued big batch 0's loads into buffer 0
// and, where the slice has a second, big batch 1's into buffer 1, both before its wait for the predecessor. The first
// compute of a pair waits for both (one scoreboard, drained by the wait), then each buffer, once computed, takes the
// loads of the pair after it: one wait per 2 NB batches where run_big_batches waits once per NB, and a slice of at most
// 2 NB batches (Qwen3-30B-A3B's GEMM2, K 768, on the staged kernel's 3 a big batch) waits once in all.
template <int NB, typename LoadBig, typename Compute>
__device__ __forceinline__ void run_big_batch_pairs(int nb, LoadBig&& load_big, Compute&& compute) {
  for (int jb = 0; jb < nb; jb += 2 * NB) {  // warp-uniform
#pragma unroll
    for (int j = 0; j < NB; ++j) compute(0, j, jb + j, jb + j < nb);
    if (jb + 2 * NB < nb) load_big(0, jb + 2 * NB);
    if (jb + NB >= nb) break;
#pragma unroll
    for (int j = 0; j < NB; ++j) compute(1, j, jb + NB + j, jb + NB + j < nb);
    if (jb + 3 * NB < nb) load_big(1, jb + 3 * NB);
  }
}

// After a barrier over s_part: one thread per (token, output column pair), the K slices' partials summed in fixed
// order (bit-reproducible), plus the bias; stored, or with the finalize epilogue
// (p.permuted_to_unpermuted set) times the row's routing weight and added into its token's output row with one
// packed 2-element atomic, as gemm/decode.cu's finalize does.
template <typename T, int WK, int R>
__device__ __forceinline__ void store_part_sums(const WoqGemmParams& p,
                                                const float (&s_part)[WK][R][kDecodeTokens + 1], int expert,
                                                int64_t row_begin, int rows, int col0) {
  using P2 = Pair<T>;
  const int N = p.n;
  const T* bias = p.bias ? static_cast<const T*>(p.bias) + static_cast<int64_t>(expert) * N : nullptr;
  for (int idx = threadIdx.x; idx < kDecodeTokens * (R / 2); idx += kDecodeThreads) {
    const int t = idx / (R / 2), c = 2 * (idx % (R / 2));
    const int col = col0 + c;
    if (t >= rows || col >= N) continue;  // N even: col + 1 < N too
    float v[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float s = 0.f;
#pragma unroll
      for (int wi = 0; wi < WK; ++wi) s += s_part[wi][c + j][t];
      v[j] = s;
    }
    if (bias) {
      const float2 b = P2::to_float2(*reinterpret_cast<const typename P2::type*>(bias + col));
      v[0] += b.x;
      v[1] += b.y;
    }
    const int64_t prow = row_begin + t;
    if (p.permuted_to_unpermuted) {
      finalize_add_pair<T>(p.C, p.permuted_to_unpermuted, p.permuted_weights, p.top_k, prow, N, col, v[0], v[1]);
    } else {
      *reinterpret_cast<typename P2::type*>(static_cast<T*>(p.C) + prow * N + col) = P2::make(v[0], v[1]);
    }
  }
}

}  // namespace mbk
