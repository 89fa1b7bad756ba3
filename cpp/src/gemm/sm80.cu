// The mb_grouped_gemm_sm80 entry point (the tactic's decode kernel, gemm/decode.cu, or mma.sync tiles) and
// the mma.sync launcher both entry points use. Kernel design: gemm/mma.cuh.
#include <algorithm>

#include "gemm/mma.cuh"
#include "gemm/tactic.cuh"

namespace mbk {

template <typename T, class Cfg, int EPI>
static mb_status launch_cfg(const GemmParams& p, int64_t max_rows, cudaStream_t stream) {
  constexpr int NB = EPI == EPI_GATED ? 2 : 1;
  constexpr int smem = Cfg::template smem_bytes<NB>();
  auto kernel = grouped_mma_kernel<T, Cfg, EPI>;
  // Idempotent and cheap; done on every call so a new device or thread needs no init step.
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return fail(MB_ERR_CUDA, "grouped gemm: smem attribute: %s", cudaGetErrorString(err));
  // sum over experts of ceil(rows_x / BM) <= ceil(max_rows / BM) + (non-empty experts), and at
  // most min(E, max_rows) experts are non-empty: at decode this keeps dead CTAs few.
  const int64_t m_tiles = (max_rows + Cfg::BM - 1) / Cfg::BM + std::min<int64_t>(p.num_experts, max_rows);
  const int n_tiles = (p.n + Cfg::BN - 1) / Cfg::BN;
  if (m_tiles > INT32_MAX || n_tiles > 65535)
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm: grid too large (m_tiles %lld, n_tiles %d)",
                     (long long)m_tiles, n_tiles);
  kernel<<<dim3((unsigned)m_tiles, n_tiles), Cfg::kThreads, smem, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess) return fail(MB_ERR_CUDA, "grouped gemm launch: %s", cudaGetErrorString(err));
  return MB_OK;
}

template <typename T, int EPI>
static mb_status launch_tile(const GemmParams& p, int64_t max_rows, int tile, cudaStream_t stream) {
  switch (tile) {
    case MB_TILE_MMA_16x64: return launch_cfg<T, CfgSmall, EPI>(p, max_rows, stream);
    case MB_TILE_MMA_64x128: return launch_cfg<T, CfgMid, EPI>(p, max_rows, stream);
    default: return launch_cfg<T, CfgLarge, EPI>(p, max_rows, stream);  // MB_TILE_MMA_128x128
  }
}

template <typename T>
static mb_status launch_epi(const GemmParams& p, int64_t max_rows, int epilogue, int tile, cudaStream_t stream) {
  switch (epilogue) {
    case EPI_GATED: return launch_tile<T, EPI_GATED>(p, max_rows, tile, stream);
    case EPI_FINALIZE: return launch_tile<T, EPI_FINALIZE>(p, max_rows, tile, stream);
    default: return launch_tile<T, EPI_STORE>(p, max_rows, tile, stream);
  }
}

mb_status launch_grouped_mma(const GemmParams& p, int64_t max_rows, int dtype, int epilogue, int tile,
                             cudaStream_t stream) {
  MB_TRY(check_grouped_args(p, max_rows, epilogue));
  if (max_rows == 0) return MB_OK;
  return dispatch_16bit(dtype, [&](auto tag) { return launch_epi<decltype(tag)>(p, max_rows, epilogue, tile, stream); });
}

}  // namespace mbk

extern "C" {

size_t mb_grouped_gemm_sm80_workspace(int num_experts) {
  (void)num_experts;  // the expert lookup runs inside each CTA: no workspace
  return 0;
}

mb_status mb_grouped_gemm_sm80(const void* A, const void* B, const void* bias, void* C,
                               const int64_t* expert_first_token_offset, int num_experts, int64_t max_rows,
                               int n, int k, int dtype, int activation, int fused_gated, float swiglu_alpha,
                               float swiglu_limit, mb_gemm_tactic tactic, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream) {
  // The sm80 kernels need no workspace (mb_grouped_gemm_sm80_workspace is 0).
  (void)workspace;
  (void)workspace_bytes;
  const bool gated_act =
      activation == MB_ACT_SWIGLU || activation == MB_ACT_GEGLU || activation == MB_ACT_SWIGLU_CLAMP;
  if (activation < MB_ACT_IDENTITY || activation > MB_ACT_SWIGLU_CLAMP)
    return mbk::fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm: unknown activation %d", activation);
  if (gated_act != (fused_gated != 0))
    return mbk::fail(MB_ERR_INVALID_ARGUMENT,
                          "grouped gemm: gated activations need fused_gated=1 and others fused_gated=0");
  mbk::GemmParams p = mbk::gemm_params(A, B, bias, C, expert_first_token_offset, num_experts, n, k, activation);
  p.swiglu_alpha = swiglu_alpha;
  p.swiglu_limit = swiglu_limit;
  const int epilogue = fused_gated ? mbk::EPI_GATED : mbk::EPI_STORE;
  MB_TRY(mbk::check_tactic(tactic, {"grouped gemm sm80", false, epilogue, nullptr}));
  if (tactic.kernel == MB_GEMM_DECODE)
    return mbk::launch_grouped_decode(p, max_rows, dtype, epilogue, tactic.k_split,
                                      tactic.launch == MB_LAUNCH_AFTER_TRIGGER, stream);
  return mbk::launch_grouped_mma(p, max_rows, dtype, epilogue, tactic.tile, stream);
}

}  // extern "C"
