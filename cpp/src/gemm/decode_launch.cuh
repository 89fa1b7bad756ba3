// What the swap-AB decode kernels (gemm/decode.cu, gemm/fp8_decode.cu, gemm/woq_decode.cu) share: on the host,
// CTAs of 8 warps, one per (expert, chunk of up to 8 token rows, block of output columns), the grid sized from
// host-known bounds (no host synchronization: CUDA-graph capturable; CTAs past the real chunk count exit), and
// the K split chosen at compile time.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "gemm/mma.cuh"

namespace mbk {

constexpr int kDecodeWarps = 8;
constexpr int kDecodeThreads = kDecodeWarps * 32;
constexpr int kDecodeTokens = 8;  // token rows per chunk: the mma's 8 columns

// A warp's K slice when a CTA splits K wk ways: whole 128-k batches (the FP8 kernel's 128-k scale blocks too;
// slices start on 256-byte boundaries of 16-bit rows), the last slice shorter or empty. Host and device agree on it.
__host__ __device__ constexpr int decode_k_slice(int k, int wk) {
  return ((k + wk * 128 - 1) / (wk * 128)) * 128;
}

// The finalize epilogue's add: permuted row `prow`'s output pair (columns col, col + 1) times its routing weight,
// added into its token's row of `out` [tokens, n] with one packed 2-element atomic.
template <typename T>
__device__ __forceinline__ void finalize_add_pair(void* out, const int32_t* permuted_to_unpermuted,
                                                  const float* permuted_weights, int top_k, int64_t prow, int n,
                                                  int col, float v0, float v1) {
  using P2 = Pair<T>;
  const float wt = permuted_weights[prow];
  T* dst = static_cast<T*>(out) + static_cast<int64_t>(permuted_to_unpermuted[prow] / top_k) * n + col;
  atomicAdd(reinterpret_cast<typename P2::type*>(dst), P2::make(wt * v0, wt * v1));
}

// Chunks to launch: sum over experts of ceil(rows_x / 8) <= ceil(max_rows / 8) + (non-empty experts).
inline int64_t decode_chunks(int64_t max_rows, int num_experts) {
  return (max_rows + kDecodeTokens - 1) / kDecodeTokens + std::min<int64_t>(num_experts, max_rows);
}

// `kernel(p)` over (chunks, ceil(n / out_cols)) CTAs of kDecodeThreads with `smem` bytes of dynamic shared
// memory, after a trigger or plainly; `who` names the GEMM in the error.
template <typename Params>
mb_status launch_decode(void (*kernel)(Params), const Params& p, int n, int out_cols, int64_t chunks,
                        bool after_trigger, cudaStream_t stream, const char* who, size_t smem = 0) {
  const int64_t col_blocks = (n + out_cols - 1) / out_cols;
  if (chunks > INT32_MAX || col_blocks > 65535)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: grid too large (chunks %lld, column blocks %lld)", who,
                (long long)chunks, (long long)col_blocks);
  if (smem > 0) {  // past 48 KB with the kernel's static shared memory it must be asked for; asked for always
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess)
      return fail(MB_ERR_CUDA, "%s: %zu bytes of shared memory: %s", who, smem, cudaGetErrorString(err));
  }
  const dim3 grid((unsigned)chunks, (unsigned)col_blocks), block(kDecodeThreads);
  const cudaError_t err = mb::launch_after_trigger_smem(kernel, grid, block, smem, stream, after_trigger, p);
  if (err != cudaSuccess) return fail(MB_ERR_CUDA, "%s launch: %s", who, cudaGetErrorString(err));
  return MB_OK;
}

// f(std::integral_constant<int, WK>{}) for k_split 1, 2 or 4, else 8 (the callers have checked it).
template <typename F>
mb_status by_k_split(int k_split, F&& f) {
  switch (k_split) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    default: return f(std::integral_constant<int, 8>{});
  }
}

}  // namespace mbk
