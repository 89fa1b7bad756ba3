// The block-128 FP8 wgmma GEMM1 with the gated activation in its epilogue (mb_grouped_gemm_fp8_gated with
// MB_FP8_BLOCK128 scales, tactic kernel MB_GEMM_WGMMA; sm_90a): gemm/fp8_sm90.cuh's blockwise kernels with
// MoeEpilogue<.., EPI_GATED_HALVES>. W1 stays stacked as the checkpoint stores it and is read through the gate/up
// halves map (gemm/sm90_static_maps.cuh, kGateUpHalves), so that each 128-column tile holds 64 features' gate and up
// columns, each half scaled by its own 128-row block's scales (scale_b in the halves' order). The 16-bit output only:
// GEMM2's block-128 input is quantized per 128-column group by the quantize step after it. A translation unit of its
// own: the blockwise kernels compile beside the rowwise gated ones.
#include "gemm/fp8_sm90.cuh"

namespace mbk {

mb_status run_fp8_wgmma_gated_block(const Fp8GemmParams& p, int64_t max_rows, int dtype, int tile, bool after_trigger,
                                    void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  using namespace fp8_sm90;
  auto go = [&](auto tag) {
    using T = decltype(tag);
    return run_scaling<T, MB_FP8_BLOCK128, EPI_GATED_HALVES, false>(p, max_rows, tile, after_trigger, workspace,
                                                                     workspace_bytes, stream);
  };
  return dtype == MB_BF16 ? go(__nv_bfloat16{}) : go(__half{});
}

}  // namespace mbk
