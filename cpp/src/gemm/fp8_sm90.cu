// FP8 wgmma grouped GEMM (mb_grouped_gemm_fp8, tactic kernel MB_GEMM_WGMMA; sm_90a): CUTLASS 3's
// ptr-array TMA warp-specialized FP8 mainloops on the same fixed TMA maps over all experts' rows and
// weights as the 16-bit kernels (gemm/sm90_static_maps.cuh), grouped shapes read from the expert
// offsets (OffsetsProblemShape), MoeEpilogue's plain store or finalize (p.epilogue; the gated epilogue's kernels are
// gemm/fp8_sm90_gated.cu's, the kernels themselves gemm/fp8_sm90.cuh's). fp32 accumulator registers in both
// scalings:
//   MB_FP8_ROWWISE : p.accumulation MB_FP8_ACCUM_PROMOTED: CUTLASS's FP8 mainloop, which adds wgmma's partial
//                    sums into fp32 registers every 128 k (its promotion interval 4 x k32); MB_FP8_ACCUM_FAST:
//                    its FP8 fast-accumulation schedules, the 16-bit mainloop on e4m3, wgmma accumulating the
//                    whole k (half the accumulator registers, no promotion adds or waits; pingpong 128x128 runs
//                    so only); then
//                    MoeEpilogue<.., kFp8Rowwise> scales each output by its row's and column's scale (before the
//                    bias, and the routing weight or the gated activation);
//   MB_FP8_BLOCK128: CUTLASS's blockwise-scaling FP8 mainloop: each 128-k block's wgmma sum is scaled by
//                    sa[row, kb] * sb[expert, n / 128, kb] as it is added into fp32 registers; its scales
//                    come by cp.async from a producer warp of their own, from the group's scale rows
//                    (StaticMapBlockwise below sets them where the group changes).
#include "gemm/fp8_sm90.cuh"

namespace mbk {
namespace {

using namespace fp8_sm90;

// The scaling and accumulation (fast only with rowwise scales: fp8_abi.cu refuses the rest).
template <typename T, int kEpi>
mb_status run_epilogue(const Fp8GemmParams& p, int64_t max_rows, int tile, bool after_trigger, void* workspace,
                       size_t workspace_bytes, cudaStream_t stream) {
  if (p.scaling == MB_FP8_BLOCK128)
    return run_scaling<T, MB_FP8_BLOCK128, kEpi, false>(p, max_rows, tile, after_trigger, workspace, workspace_bytes,
                                                        stream);
  return p.accumulation == MB_FP8_ACCUM_FAST
             ? run_scaling<T, MB_FP8_ROWWISE, kEpi, true>(p, max_rows, tile, after_trigger, workspace,
                                                          workspace_bytes, stream)
             : run_scaling<T, MB_FP8_ROWWISE, kEpi, false>(p, max_rows, tile, after_trigger, workspace,
                                                           workspace_bytes, stream);
}

}  // namespace

size_t fp8_wgmma_workspace_bytes(int num_experts) {
  const int sm = mb::device_attribute(cudaDevAttrMultiProcessorCount);
  size_t most = 0;
  auto rowwise = [&](auto tag, auto epi, auto fast) {
    using T = decltype(tag);
    constexpr int E = decltype(epi)::value;
    constexpr bool F = decltype(fast)::value;
    most = std::max({most, fp8_cutlass_workspace<T, MB_FP8_ROWWISE, MB_TILE_COOP_128x256, E, F>(num_experts, sm),
                     fp8_cutlass_workspace<T, MB_FP8_ROWWISE, MB_TILE_COOP_128x128, E, F>(num_experts, sm),
                     fp8_cutlass_workspace<T, MB_FP8_ROWWISE, MB_TILE_PINGPONG_64x128, E, F>(num_experts, sm),
                     fp8_cutlass_workspace<T, MB_FP8_ROWWISE, MB_TILE_PINGPONG_64x128_C2, E, F>(num_experts, sm),
                     fp8_cutlass_workspace<T, MB_FP8_ROWWISE, MB_TILE_COOP_128x128_C2, E, F>(num_experts, sm),
                     fp8_cutlass_workspace<T, MB_FP8_ROWWISE, MB_TILE_COOP_128x192, E, F>(num_experts, sm),
                     fp8_cutlass_workspace<T, MB_FP8_ROWWISE, MB_TILE_COOP_128x192_C2, E, F>(num_experts, sm)});
    if constexpr (F)
      most = std::max({most, fp8_cutlass_workspace<T, MB_FP8_ROWWISE, MB_TILE_PINGPONG_128x128, E, F>(num_experts, sm),
                       fp8_cutlass_workspace<T, MB_FP8_ROWWISE, MB_TILE_PINGPONG_128x128_C2, E, F>(num_experts, sm)});
  };
  auto each = [&](auto tag, auto epi) {
    using T = decltype(tag);
    constexpr int E = decltype(epi)::value;
    rowwise(tag, epi, std::false_type{});
    rowwise(tag, epi, std::true_type{});
    most = std::max({most, fp8_cutlass_workspace<T, MB_FP8_BLOCK128, MB_TILE_COOP_128x128, E, false>(num_experts, sm),
                     fp8_cutlass_workspace<T, MB_FP8_BLOCK128, MB_TILE_PINGPONG_64x128, E, false>(num_experts, sm),
                     fp8_cutlass_workspace<T, MB_FP8_BLOCK128, MB_TILE_PINGPONG_64x128_C2, E, false>(num_experts, sm),
                     fp8_cutlass_workspace<T, MB_FP8_BLOCK128, MB_TILE_COOP_128x128_C2, E, false>(num_experts, sm)});
  };
  using Store = std::integral_constant<int, EPI_STORE>;
  using Finalize = std::integral_constant<int, EPI_FINALIZE>;
  each(__nv_bfloat16{}, Store{});
  each(__half{}, Store{});
  each(__nv_bfloat16{}, Finalize{});
  each(__half{}, Finalize{});
  return most;
}

mb_status run_fp8_wgmma(const Fp8GemmParams& p, int64_t max_rows, int dtype, const mb_gemm_tactic& tactic,
                        void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  switch (tactic.tile) {
    case MB_TILE_COOP_128x128:
    case MB_TILE_COOP_128x128_C2:
    case MB_TILE_COOP_128x192:
    case MB_TILE_COOP_128x192_C2:
    case MB_TILE_COOP_128x256:
    case MB_TILE_PINGPONG_64x128:
    case MB_TILE_PINGPONG_64x128_C2:
    case MB_TILE_PINGPONG_128x128:
    case MB_TILE_PINGPONG_128x128_C2: break;
    default:
      return fail(MB_ERR_UNSUPPORTED, "grouped gemm fp8: the wgmma kernel has the tiles coop128x128, coop128x128c2, "
                  "coop128x192, coop128x192c2, coop128x256, pingpong64x128, pingpong64x128c2, pingpong128x128 and "
                  "pingpong128x128c2, "
                  "not %s",
                  tile_name(tactic.tile));
  }
  if (max_rows > INT32_MAX || static_cast<int64_t>(p.num_experts) * p.n > INT32_MAX)
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm fp8: max_rows and num_experts * n must fit int32");
  if (max_rows == 0) return MB_OK;
  const bool after_trigger = tactic.launch == MB_LAUNCH_AFTER_TRIGGER;
  if (p.epilogue == EPI_GATED)
    return p.scaling == MB_FP8_BLOCK128
               ? run_fp8_wgmma_gated_block(p, max_rows, dtype, tactic.tile, after_trigger, workspace, workspace_bytes,
                                           stream)
               : run_fp8_wgmma_gated(p, max_rows, dtype, tactic.tile, after_trigger, workspace, workspace_bytes,
                                     stream);
  auto go = [&](auto tag) {
    using T = decltype(tag);
    return p.epilogue == EPI_FINALIZE
               ? run_epilogue<T, EPI_FINALIZE>(p, max_rows, tactic.tile, after_trigger, workspace, workspace_bytes,
                                               stream)
               : run_epilogue<T, EPI_STORE>(p, max_rows, tactic.tile, after_trigger, workspace, workspace_bytes,
                                            stream);
  };
  return dtype == MB_BF16 ? go(__nv_bfloat16{}) : go(__half{});
}

}  // namespace mbk
