// The FP8 grouped GEMM (mb_grouped_gemm_fp8, mb_grouped_gemm_fp8_finalize with the finalize epilogue and
// mb_grouped_gemm_fp8_gated with the gated activation in its epilogue):
// what its kernels share. A and B are e4m3 bytes, the accumulation fp32, the output bf16/fp16 (+ bias; the
// finalize epilogue times the routing weight, added into the token's output row; the gated epilogue writes
// act(gate, up) of W1 interleaved by 8, or stacked with block-128 scales); the scales follow the
// call's mb_fp8_scaling:
//   MB_FP8_ROWWISE : C[p, c] = sa[p] * sb[x, c] * sum_k A[p, k] B[x, c, k]       sa [max_rows], sb [E, n]
//   MB_FP8_BLOCK128: C[p, c] = sum_kb sa[p, kb] * sb[x, c / 128, kb] * sum_{k in kb} A[p, k] B[x, c, k]
//                    sa [max_rows, ceil(k / 128)], sb [E, ceil(n / 128), ceil(k / 128)], both row-major
// (moe_build/weights/fp8.py: per-tensor and per-channel weight scales arrive as sb [E, n], a static or a
// per-token activation scale as sa [max_rows]; block-128 as DeepSeek-V3 stores it).
#pragma once

#include <cstdint>

#include "common/common.cuh"
#include "gemm/mma.cuh"  // EpilogueKind
#include "moe_build_kernels.h"

namespace mbk {

constexpr int kFp8Block = 128;  // MB_FP8_BLOCK128's block side (k blocks of A and B, n blocks of B)

struct Fp8GemmParams {
  const uint8_t* A;      // [max_rows, k] e4m3, the permuted rows of every expert back to back
  const float* scale_a;  // as the scaling says
  const uint8_t* B;      // [E, n, k] e4m3, row-major per expert
  const float* scale_b;  // as the scaling says
  const void* bias;      // [E, n] in the output dtype, or null
  void* C;               // store: [max_rows, n] in the output dtype, rows past off[E] not written;
                         // gated: [max_rows, n / 2]; finalize: [tokens, n], zeroed by the caller, added into
  const int64_t* offsets;  // [E + 1]
  int num_experts;
  int n, k;
  int scaling;       // enum mb_fp8_scaling
  int accumulation;  // enum mb_fp8_accumulation (the wgmma kernel's)
  int epilogue = EPI_STORE;                         // EpilogueKind (EPI_GATED, MB_FP8_BLOCK128: decode kernel only)
  const int32_t* permuted_to_unpermuted = nullptr;  // finalize: expanded row of each permuted row (/ top_k: token)
  const float* permuted_weights = nullptr;          // finalize: routing weight of each permuted row
  int top_k = 1;                                    // finalize
  bool evict_last = false;                          // finalize / gated, wgmma: atomics / stores under L2 evict_last
  // gated: act(gate, up) of W1's rows interleaved in blocks of 8 (rows 16b..16b+7 gate features 8b..8b+7, rows
  // 16b+8..16b+15 their up projections; scale_b and bias in the same order), or with MB_FP8_BLOCK128 scales stacked
  // (gate rows, then up rows: scale_b's 128-row blocks whole), MB_ACT_SWIGLU / GEGLU / SWIGLU_CLAMP
  int activation = MB_ACT_SWIGLU;
  float swiglu_alpha = 1.f;
  float swiglu_limit = 0.f;
  // gated, quantized (the plan's fc2_input_quant=gemm1): C is e4m3 [max_rows, n / 2], each act(gate, up) rounded to
  // the output dtype, then quantized by this static scale (device scalar) as common/fp8_quantize.cuh does, and
  // c_scales [max_rows] gets every written row's scale: the bytes and scales the quantize step would write
  const float* c_static_scale = nullptr;
  float* c_scales = nullptr;
  // quantizing (mb_grouped_gemm_fp8_quantizing_finalize; decode kernel): A and scale_a unused, the kernel quantizes
  // these 16-bit rows [max_rows, k] (the output dtype) itself, by a16_static_scale or per row (MB_FP8_ROWWISE), or per
  // 128-column group (MB_FP8_BLOCK128)
  const void* a16 = nullptr;
  const float* a16_static_scale = nullptr;
};

__host__ __device__ __forceinline__ int fp8_k_blocks(int k) { return (k + kFp8Block - 1) / kFp8Block; }

// gemm/fp8_decode.cu: the swap-AB mma.sync e4m3 kernel (sm_89+), tactic kernel MB_GEMM_DECODE (two_ctas: its tile
// MB_TILE_DECODE_TWOCTA, block-128 scales). Both launchers run p.epilogue.
mb_status launch_fp8_decode(const Fp8GemmParams& p, int64_t max_rows, int dtype, int k_split, bool two_ctas,
                            bool after_trigger, cudaStream_t stream);
// gemm/fp8_sm90.cu: the wgmma kernel (sm_90a), tactic kernel MB_GEMM_WGMMA, and its workspace.
size_t fp8_wgmma_workspace_bytes(int num_experts);
mb_status run_fp8_wgmma(const Fp8GemmParams& p, int64_t max_rows, int dtype, const mb_gemm_tactic& tactic,
                        void* workspace, size_t workspace_bytes, cudaStream_t stream);
// gemm/fp8_sm90_gated.cu: the wgmma kernel with the gated epilogue (run_fp8_wgmma's, for p.epilogue EPI_GATED; rowwise
// scales, its tile checked there).
mb_status run_fp8_wgmma_gated(const Fp8GemmParams& p, int64_t max_rows, int dtype, int tile, bool after_trigger,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream);
// gemm/fp8_sm90_gated_block.cu: the same with block-128 scales, W1 stacked on the gate/up halves map (scale_b in
// the halves' order, [E, 2I / 8, kb]; inter a multiple of 64, checked by fp8_abi.cu).
mb_status run_fp8_wgmma_gated_block(const Fp8GemmParams& p, int64_t max_rows, int dtype, int tile, bool after_trigger,
                                    void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace mbk
