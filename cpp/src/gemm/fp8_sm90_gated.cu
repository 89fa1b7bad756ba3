// The FP8 wgmma GEMM1 with the gated activation in its epilogue (mb_grouped_gemm_fp8_gated, tactic kernel
// MB_GEMM_WGMMA; sm_90a): gemm/fp8_sm90.cuh's kernels with MoeEpilogue<.., EPI_GATED, kFp8Rowwise>, which scales
// each gate and up accumulator by its row's and column's scale, adds the bias and writes act(gate, up) at half
// width. Rowwise scales only: the blockwise mainloop scales W1's 128-row blocks, which the gate/up interleave
// by 8 splits (gemm/fp8_abi.cu refuses MB_FP8_BLOCK128 before this runs).
#include "gemm/fp8_sm90.cuh"

namespace mbk {

mb_status run_fp8_wgmma_gated(const Fp8GemmParams& p, int64_t max_rows, int dtype, int tile, bool after_trigger,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  using namespace fp8_sm90;
  auto go = [&](auto tag) {
    using T = decltype(tag);
    return p.accumulation == MB_FP8_ACCUM_FAST
               ? run_scaling<T, MB_FP8_ROWWISE, EPI_GATED, true>(p, max_rows, tile, after_trigger, workspace,
                                                                  workspace_bytes, stream)
               : run_scaling<T, MB_FP8_ROWWISE, EPI_GATED, false>(p, max_rows, tile, after_trigger, workspace,
                                                                   workspace_bytes, stream);
  };
  return dtype == MB_BF16 ? go(__nv_bfloat16{}) : go(__half{});
}

}  // namespace mbk
