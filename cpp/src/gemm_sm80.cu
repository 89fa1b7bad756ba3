// Ampere-style (mma.sync / ldmatrix / cp.async) grouped GEMM over expert segments: the
// mb_grouped_gemm_sm80 entry point, and the launcher that gemm_sm90.cu reuses for decode-sized
// problems and for its finalize variant. Kernel design: gemm_common.cuh.
#include <stdlib.h>

#include <algorithm>

#include "gemm_common.cuh"

namespace mbk {

// Split-K limits (gemm_common.cuh): at most kSplitMaxSlots (tile, split) fp32 slots, so the
// workspace is a fixed 16.8 MB whatever the call; at most kSplitMax splits of at least
// kSplitMinKtiles k-tiles each (a shorter split spends most of its time on the pipeline ramp).
constexpr int64_t kSplitMaxSlots = 4096;
constexpr int kSplitMax = 8;
constexpr int kSplitMinKtiles = 4;
// Shorter K never splits: measured on the H200 at 1 token, the counter memset and the partial
// round trip (~5 us) cost more than the fuller grid gained for K <= 2048 (Qwen3, DeepSeek-V2-Lite),
// while K = 2880 (GPT-OSS GEMM2) gained 3 us and K = 14336 (Mixtral GEMM2) halved the time.
constexpr int kSplitMinK = 2560;
// A split count is taken only when it raises the estimated wave efficiency by this much: each
// split adds an fp32 partial round trip and a per-tile counter.
constexpr double kSplitMinGain = 0.02;

// Workspace: per-tile counters, then the slots. Only the decode tile (CfgSmall, STORE/FINALIZE:
// one B tile per stage) splits, so its slot size bounds every split launch.
constexpr size_t kSplitCounterBytes = (kSplitMaxSlots * sizeof(unsigned) + 255) & ~size_t(255);
template <class Cfg, int NB> constexpr size_t split_slot_bytes() {
  return (size_t)NB * Cfg::MI * Cfg::NI * Cfg::kThreads * sizeof(float4);
}

size_t mma_split_workspace_bytes() { return kSplitCounterBytes + kSplitMaxSlots * split_slot_bytes<CfgSmall, 1>(); }

// Fraction of the resident CTA slots busy over the waves `ctas` CTAs need.
static double wave_efficiency(int64_t ctas, int64_t slots) {
  const int64_t waves = (ctas + slots - 1) / slots;
  return (double)ctas / (double)(waves * slots);
}

// Split count for a decode-tile launch: the smallest S whose estimated grid of real CTAs
// (active experts x N tiles x S) fills the resident slots best, within the workspace and
// k-tile limits; MB_SM90_SPLIT_K=S forces one (tests, bench), clamped to the same limits.
template <class Cfg, int NB, class Kernel>
static int choose_splits(Kernel kernel, int smem, const GemmParams& p, int64_t max_rows, int64_t tiles,
                         int n_tiles, size_t workspace_bytes) {
  const int ktiles = (p.k + Cfg::BK - 1) / Cfg::BK;
  int64_t max_s = std::min<int64_t>(kSplitMax, std::min<int64_t>(ktiles / kSplitMinKtiles, kSplitMaxSlots / tiles));
  if (p.k < kSplitMinK || workspace_bytes < kSplitCounterBytes) return 1;
  max_s = std::min<int64_t>(max_s, (int64_t)((workspace_bytes - kSplitCounterBytes) /
                                             (tiles * split_slot_bytes<Cfg, NB>())));
  if (max_s <= 1) return 1;
  int s = 1;
  const char* force = getenv("MB_SM90_SPLIT_K");
  if (force && *force) {
    s = (int)std::max<int64_t>(1, std::min<int64_t>(max_s, atoi(force)));
  } else {
    int dev = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Cfg::kThreads, smem) != cudaSuccess ||
        sms <= 0 || per_sm <= 0) {
      cudaGetLastError();  // a failed query only costs the split; the launch reports real errors
      return 1;
    }
    const int64_t slots = (int64_t)sms * per_sm;
    // Decode tiles hold <= 16 rows, so each non-empty expert (at most min(E, rows)) is one row tile.
    const int64_t real = std::min<int64_t>(p.num_experts, max_rows) * n_tiles;
    double best = wave_efficiency(real, slots);
    for (int c = 2; c <= max_s; ++c) {
      const double e = wave_efficiency(real * c, slots);
      if (e > best + kSplitMinGain) {
        best = e;
        s = c;
      }
    }
  }
  const int chunk = (ktiles + s - 1) / s;
  return (ktiles + chunk - 1) / chunk;  // the same chunks without an empty last split
}

template <typename T, class Cfg, int EPI>
static mb_status launch_cfg(const GemmParams& params, int64_t max_rows, bool may_split, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
  constexpr int NB = EPI == EPI_GATED ? 2 : 1;
  constexpr int smem = Cfg::template smem_bytes<NB>();
  auto kernel = grouped_mma_kernel<T, Cfg, EPI>;
  // Idempotent and cheap; done on every call so a new device or thread needs no init step.
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return fail(MB_ERR_CUDA, "grouped gemm: smem attribute: %s", cudaGetErrorString(err));
  // sum over experts of ceil(rows_x / BM) <= ceil(max_rows / BM) + (non-empty experts), and at
  // most min(E, max_rows) experts are non-empty: at decode this keeps dead CTAs few.
  const int64_t m_tiles = (max_rows + Cfg::BM - 1) / Cfg::BM + std::min<int64_t>(params.num_experts, max_rows);
  const int n_tiles = (params.n + Cfg::BN - 1) / Cfg::BN;
  if (m_tiles > INT32_MAX || n_tiles > 65535)
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm: grid too large (m_tiles %lld, n_tiles %d)",
                     (long long)m_tiles, n_tiles);
  GemmParams p = params;
  const int64_t tiles = m_tiles * n_tiles;
  const int splits = may_split && workspace && tiles <= kSplitMaxSlots
                         ? choose_splits<Cfg, NB>(kernel, smem, p, max_rows, tiles, n_tiles, workspace_bytes)
                         : 1;
  if (splits > 1) {
    p.split_counters = static_cast<unsigned*>(workspace);
    p.split_partials = reinterpret_cast<float4*>(static_cast<char*>(workspace) + kSplitCounterBytes);
    err = cudaMemsetAsync(p.split_counters, 0, tiles * sizeof(unsigned), stream);
    if (err != cudaSuccess) return fail(MB_ERR_CUDA, "grouped gemm split-K counters: %s", cudaGetErrorString(err));
  }
  kernel<<<dim3((unsigned)m_tiles, n_tiles, splits), Cfg::kThreads, smem, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess) return fail(MB_ERR_CUDA, "grouped gemm launch: %s", cudaGetErrorString(err));
  return MB_OK;
}

template <typename T, int EPI>
static mb_status launch_tile(const GemmParams& p, int64_t max_rows, int tile, void* ws, size_t ws_bytes,
                             cudaStream_t stream) {
  // Only the decode tile splits K: larger tiles come with enough rows to fill the grid, and the
  // gated epilogue is reached only through the sm80 entry point, which has no workspace.
  switch (tile) {
    case TILE_SMALL: return launch_cfg<T, CfgSmall, EPI>(p, max_rows, EPI != EPI_GATED, ws, ws_bytes, stream);
    case TILE_MID: return launch_cfg<T, CfgMid, EPI>(p, max_rows, false, ws, ws_bytes, stream);
    default: return launch_cfg<T, CfgLarge, EPI>(p, max_rows, false, ws, ws_bytes, stream);
  }
}

template <typename T>
static mb_status launch_epi(const GemmParams& p, int64_t max_rows, int epilogue, int tile, void* ws,
                            size_t ws_bytes, cudaStream_t stream) {
  switch (epilogue) {
    case EPI_GATED: return launch_tile<T, EPI_GATED>(p, max_rows, tile, ws, ws_bytes, stream);
    case EPI_FINALIZE: return launch_tile<T, EPI_FINALIZE>(p, max_rows, tile, ws, ws_bytes, stream);
    default: return launch_tile<T, EPI_STORE>(p, max_rows, tile, ws, ws_bytes, stream);
  }
}

mb_status launch_grouped_mma(const GemmParams& p, int64_t max_rows, int dtype, int epilogue, int tile,
                             void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (!p.A || !p.B || !p.C || !p.offsets || p.num_experts <= 0 || max_rows < 0 || p.n <= 0 || p.k <= 0)
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm: null pointer or non-positive size");
  // 16-byte cp.async rows need K % 8 == 0; the paired epilogue stores need N even. N % 8 keeps
  // every output/bias row 16-byte aligned as well.
  if (p.k % 8 != 0 || p.n % 8 != 0)
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm: n (%d) and k (%d) must be multiples of 8", p.n, p.k);
  if (epilogue == EPI_FINALIZE && (!p.permuted_to_unpermuted || !p.permuted_weights || p.top_k <= 0))
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm finalize: missing maps/weights or top_k <= 0");
  if (max_rows == 0) return MB_OK;
  switch (dtype) {
    case MB_BF16: return launch_epi<__nv_bfloat16>(p, max_rows, epilogue, tile, workspace, workspace_bytes, stream);
    case MB_FP16: return launch_epi<__half>(p, max_rows, epilogue, tile, workspace, workspace_bytes, stream);
    case MB_FP32: return fail(MB_ERR_UNSUPPORTED, "grouped gemm: fp32 is not implemented (fp16/bf16 only)");
    default: return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm: unknown dtype %d", dtype);
  }
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
                               float swiglu_limit, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream) {
  // The sm80 workspace is empty (mb_grouped_gemm_sm80_workspace), so these calls never split K.
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
  return mbk::launch_grouped_mma(p, max_rows, dtype, fused_gated ? mbk::EPI_GATED : mbk::EPI_STORE,
                                 mbk::choose_tile(max_rows, num_experts > 0 ? num_experts : 1), nullptr, 0, stream);
}

}  // extern "C"
