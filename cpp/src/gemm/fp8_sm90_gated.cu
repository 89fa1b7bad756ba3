// The FP8 wgmma GEMM1 with the gated activation in its epilogue (mb_grouped_gemm_fp8_gated, tactic kernel
// MB_GEMM_WGMMA; sm_90a): gemm/fp8_sm90.cuh's kernels with MoeEpilogue<.., EPI_GATED, kFp8Rowwise>, which scales
// each gate and up accumulator by its row's and column's scale, adds the bias and writes act(gate, up) at half
// width, or (a static scale, fc2_input_quant=gemm1: MoeEpilogue<.., EPI_GATED_E4M3, true>) GEMM2's e4m3 input and its
// row scales. Rowwise scales only: the blockwise mainloop scales W1's 128-row blocks, which the gate/up interleave
// by 8 splits (gemm/fp8_abi.cu refuses MB_FP8_BLOCK128 before this runs).
#include "gemm/fp8_sm90.cuh"

namespace mbk {

mb_status run_fp8_wgmma_gated(const Fp8GemmParams& p, int64_t max_rows, int dtype, int tile, bool after_trigger,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  using namespace fp8_sm90;
  auto go = [&](auto tag, auto epi) {
    using T = decltype(tag);
    constexpr int kEpi = decltype(epi)::value;
    return p.accumulation == MB_FP8_ACCUM_FAST
               ? run_scaling<T, MB_FP8_ROWWISE, kEpi, true>(p, max_rows, tile, after_trigger, workspace,
                                                             workspace_bytes, stream)
               : run_scaling<T, MB_FP8_ROWWISE, kEpi, false>(p, max_rows, tile, after_trigger, workspace,
                                                              workspace_bytes, stream);
  };
  // e4m3 out by the static scale (c_static_scale) or 16-bit out: two kernels (EPI_GATED_E4M3's comment says why)
  auto out = [&](auto tag) {
    return p.c_static_scale != nullptr ? go(tag, std::integral_constant<int, EPI_GATED_E4M3>{})
                                       : go(tag, std::integral_constant<int, EPI_GATED>{});
  };
  return dtype == MB_BF16 ? out(__nv_bfloat16{}) : out(__half{});
}

}  // namespace mbk
