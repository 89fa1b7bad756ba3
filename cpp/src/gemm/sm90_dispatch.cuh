// From a tactic to the wgmma kernel that runs it: CUTLASS 3 ptr-array TMA warp-specialized grouped GEMMs
// (wgmma, grouped problem shapes read from the expert offsets) whose loads run on fixed TMA descriptors over
// all experts' rows and weights (gemm/sm90_static_maps.cuh), with MoeEpilogue (gemm/sm90_epilogue.cuh).
// One template instantiation per (element type, epilogue, tile); the tactic's tile picks it, its launch
// how it is launched and its output_l2 the epilogue's store policy. dispatch_sm90 sends the other
// kernels to their launchers (gemm/decode.cu, gemm/sm80.cu).
//
// No host sync and no setup launch: CUTLASS's grouped problem shape is read on the device straight from
// expert_first_token_offset (OffsetsProblemShape), the loads find each group's rows and weights from the
// same offsets, and CUTLASS is given no host copy of the shapes (it then sizes a persistent grid from the
// SM count), so a call is one CUDA-graph capturable launch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/detail.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "gemm/mma.cuh"
#include "gemm/sm90_epilogue.cuh"
#include "gemm/sm90_pairs.cuh"
#include "gemm/sm90_placement.cuh"
#include "gemm/sm90_problem_shape.cuh"
#include "gemm/sm90_static_maps.cuh"
#include "gemm/tactic.cuh"  // tile_name

namespace mbk {


// The wgmma tiles of the tactic (MB_TILE_*): tile shape, cluster shape and kernel schedule.
//   coop 128x256      : two consumer warpgroups share one 128x256 tile.
//   pingpong 64x256   : each consumer warpgroup owns a 64-row tile, one's epilogue running under the other's
//                       mainloop; one-CTA clusters take PlacedTileScheduler (gemm/sm90_placement.cuh).
//   pingpong 64x128   : the same at half the columns (twice the tiles).
//   pingpong 64x256 in 2x1 clusters: the two CTAs of a cluster take neighbouring row tiles of one expert and
//                       TMA-multicast the weight tile they share; run as PairedTileScheduler's units
//                       (gemm/sm90_pairs.cuh).
//   pingpong 64x192 in 2x1 clusters: the same at 192 columns; its 96-row multicast weight slices are not
//                       whole 64 x 64 blocks, so it reads row-major weights only.
template <int kTile> struct WgmmaTileTraits;
template <> struct WgmmaTileTraits<MB_TILE_COOP_128x256> {
  using Shape = cute::Shape<cute::_128, cute::_256, cute::_64>;
  using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Schedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
};
template <> struct WgmmaTileTraits<MB_TILE_PINGPONG_64x256> {
  using Shape = cute::Shape<cute::_64, cute::_256, cute::_64>;
  using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Schedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
};
template <> struct WgmmaTileTraits<MB_TILE_PINGPONG_64x256_C2> : WgmmaTileTraits<MB_TILE_PINGPONG_64x256> {
  using Cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
};
template <> struct WgmmaTileTraits<MB_TILE_PINGPONG_64x192_C2> : WgmmaTileTraits<MB_TILE_PINGPONG_64x256_C2> {
  using Shape = cute::Shape<cute::_64, cute::_192, cute::_64>;
};
template <> struct WgmmaTileTraits<MB_TILE_PINGPONG_64x128> {
  using Shape = cute::Shape<cute::_64, cute::_128, cute::_64>;
  using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Schedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
};

template <typename T, int kEpi, int kTile>
struct WgmmaGemm {
  using Element = typename CutlassType<T>::type;
  using TileShape = typename WgmmaTileTraits<kTile>::Shape;
  using ClusterShape = typename WgmmaTileTraits<kTile>::Cluster;
  using Epilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<MoeEpilogue<T, kEpi>>;
  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor*, 8, Element,
      cutlass::layout::ColumnMajor*, 8, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<0>, typename WgmmaTileTraits<kTile>::Schedule>::CollectiveOp;
  // Fixed TMA descriptors over all experts' rows and weights (gemm/sm90_static_maps.cuh); the 2x1-cluster
  // tiles' loads are PairedMainloop's (ClusterMainloop, gemm/sm90_pairs.cuh).
  using StaticMainloop = StaticMapMainloop<BuiltMainloop>;
  using Mainloop = ClusterMainloop<StaticMainloop>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  // One-CTA 64-row tiles can take their tiles by placement (gemm/sm90_placement.cuh): MB_LAUNCH_PLACED.
  static constexpr bool kPlaced = IsPlacedTileScheduler<typename Kernel::TileScheduler>::value;
};

// The whole A ([max_rows, k], experts back to back) and B ([num_experts * n, k]) that the fixed TMA
// descriptors cover; null and zero sizes where only the workspace size is asked.
struct WholeOperands {
  const void* A = nullptr;
  int64_t max_rows = 0;
  const void* B = nullptr;
  int n = 0, k = 0;
  bool b_blocked = false;  // B in MB_WEIGHTS_BLOCKED64's layout
  int32_t* claims = nullptr;  // PlacedTileScheduler's claim region where the launch goes by placement
};

template <typename T, int kEpi, int kTile>
typename WgmmaGemm<T, kEpi, kTile>::Gemm::Arguments make_args(const int64_t* offsets, int num_experts,
                                                            const typename MoeEpilogue<T, kEpi>::Arguments& epi,
                                                            int sm_count, const WholeOperands& whole = {}) {
  using G = WgmmaGemm<T, kEpi, kTile>;
  using Element = typename G::Element;
  cutlass::KernelHardwareInfo hw{};
  cudaGetDevice(&hw.device_id);
  hw.sm_count = sm_count;
  // CUTLASS's per-group pointer and stride arrays are never read (StaticMapMainloop takes each group's
  // origin from the offsets); its host code only needs a 16-byte-aligned address for a placeholder map.
  typename G::Mainloop::Arguments mainloop{
      {reinterpret_cast<const Element**>(const_cast<void*>(whole.A)), nullptr,
       reinterpret_cast<const Element**>(const_cast<void*>(whole.B)), nullptr},
      whole.A, static_cast<int>(whole.max_rows), whole.B, num_experts * whole.n, whole.k, offsets, whole.n,
      whole.b_blocked};
  typename G::Kernel::TileScheduler::Arguments scheduler{};
  if constexpr (G::kPlaced) scheduler.claims = whole.claims;
  return typename G::Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
                                     {num_experts, offsets, whole.n, whole.k},
                                     mainloop,
                                     epi,
                                     hw,
                                     scheduler};
}

template <typename T, int kEpi, int kTile>
size_t cutlass_workspace_bytes(int num_experts, int sm_count) {
  return WgmmaGemm<T, kEpi, kTile>::Gemm::get_workspace_size(
      make_args<T, kEpi, kTile>(nullptr, num_experts, typename MoeEpilogue<T, kEpi>::Arguments{}, sm_count));
}

template <typename T, int kEpi>
size_t max_cutlass_workspace_bytes(int num_experts, int sm_count) {
  return std::max({cutlass_workspace_bytes<T, kEpi, MB_TILE_COOP_128x256>(num_experts, sm_count),
                   cutlass_workspace_bytes<T, kEpi, MB_TILE_PINGPONG_64x256>(num_experts, sm_count),
                   cutlass_workspace_bytes<T, kEpi, MB_TILE_PINGPONG_64x128>(num_experts, sm_count),
                   cutlass_workspace_bytes<T, kEpi, MB_TILE_PINGPONG_64x256_C2>(num_experts, sm_count),
                   cutlass_workspace_bytes<T, kEpi, MB_TILE_PINGPONG_64x192_C2>(num_experts, sm_count)});
}

// Runs the wgmma GEMM of tile kTile. `launch` is the tactic's: PLAIN an ordinary launch; AFTER_TRIGGER a
// programmatic dependent launch (its CTAs set up under the previous kernel's last CTAs and its producer
// waits for that kernel before its first load, StaticMapMainloop::await_inputs); PLACED the same with each
// CTA starting at the tiles a plain launch puts on its SM (`claims`, PlacedTileScheduler), from the device's
// placement record, and plainly while there is none (a first call inside a graph capture).
template <typename T, int kEpi, int kTile>
mb_status run_wgmma(const void* A, const void* B, bool b_blocked, const typename MoeEpilogue<T, kEpi>::Arguments& epi,
                    const int64_t* offsets, int num_experts, int64_t max_rows, int n, int k, int launch,
                    int32_t* claims, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  using G = WgmmaGemm<T, kEpi, kTile>;
  static_assert(G::kPlaced == (kTile == MB_TILE_PINGPONG_64x256 || kTile == MB_TILE_PINGPONG_64x128),
                "check_tactic's placed tiles are the tiles that take PlacedTileScheduler");
  if (b_blocked && !G::StaticMainloop::kTakesBlocked)
    return fail(MB_ERR_UNSUPPORTED, "grouped gemm sm90: this wgmma tile cannot read MB_WEIGHTS_BLOCKED64 weights "
                                    "(its per-CTA weight slice is not whole 64-row blocks)");
  const int sm_count = mb::device_attribute(cudaDevAttrMultiProcessorCount);
  const size_t need = cutlass_workspace_bytes<T, kEpi, kTile>(num_experts, sm_count);
  if (!workspace || workspace_bytes < need)
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm sm90: workspace %zu bytes < %zu needed",
                     workspace_bytes, need);
  if (max_rows > INT32_MAX || static_cast<int64_t>(num_experts) * n > INT32_MAX)
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm sm90: max_rows (%lld) and num_experts * n (%lld) must fit int32",
                static_cast<long long>(max_rows), static_cast<long long>(num_experts) * n);
  const bool placed = launch == MB_LAUNCH_PLACED && placement_ready(sm_count, stream);
  const bool after_trigger = placed || launch == MB_LAUNCH_AFTER_TRIGGER;
  typename G::Gemm gemm;
  auto args = make_args<T, kEpi, kTile>(offsets, num_experts, epi, sm_count,
                                        WholeOperands{A, max_rows, B, n, k, b_blocked, placed ? claims : nullptr});
  cutlass::Status st = gemm.can_implement(args);
  if (st != cutlass::Status::kSuccess)
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm sm90: CUTLASS cannot implement (%s)",
                     cutlassGetStatusString(st));
  st = gemm.initialize(args, workspace, stream);
  if (st == cutlass::Status::kSuccess) st = gemm.run(stream, nullptr, after_trigger);
  const cudaError_t err = cudaGetLastError();
  if (st != cutlass::Status::kSuccess || err != cudaSuccess)
    return fail(MB_ERR_CUDA, "grouped gemm sm90: %s / %s", cutlassGetStatusString(st), cudaGetErrorString(err));
  return MB_OK;
}

// The wgmma kernel for the call `p` describes, as `tactic` says (checked by check_tactic: a wgmma tile, and
// PLACED / EVICT_LAST only where they apply); the same GemmParams the decode and mma kernels take (for the
// gated epilogue p.n is the output width, the GEMM's columns are gate and up: 2 * p.n).
template <int kEpi>
mb_status dispatch_wgmma(const GemmParams& p, int64_t max_rows, int dtype, const mb_gemm_tactic& tactic,
                         void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const int n = kEpi == EPI_GATED ? 2 * p.n : p.n;
  // Every epilogue writes (or atomically adds) 16-byte vectors; n % 8 keeps the rows aligned.
  if (reinterpret_cast<uintptr_t>(p.C) % 16 != 0)
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm sm90: the output pointer must be 16-byte aligned");
  auto go = [&](auto tag) {
    using T = decltype(tag);
    const typename MoeEpilogue<T, kEpi>::Arguments epi{
        static_cast<const T*>(p.bias), static_cast<T*>(p.C), p.offsets, p.permuted_to_unpermuted,
        p.permuted_weights, p.top_k, p.activation, p.swiglu_alpha, p.swiglu_limit,
        tactic.output_l2 == MB_OUTPUT_L2_EVICT_LAST};
    auto run = [&](auto tile) {
      return run_wgmma<T, kEpi, decltype(tile)::value>(p.A, p.B, p.weights_blocked != 0, epi, p.offsets,
                                                       p.num_experts, max_rows, n, p.k, tactic.launch, p.placement,
                                                       workspace, workspace_bytes, stream);
    };
    switch (tactic.tile) {
      case MB_TILE_PINGPONG_64x256: return run(std::integral_constant<int, MB_TILE_PINGPONG_64x256>{});
      case MB_TILE_PINGPONG_64x128: return run(std::integral_constant<int, MB_TILE_PINGPONG_64x128>{});
      case MB_TILE_PINGPONG_64x256_C2: return run(std::integral_constant<int, MB_TILE_PINGPONG_64x256_C2>{});
      case MB_TILE_PINGPONG_64x192_C2: return run(std::integral_constant<int, MB_TILE_PINGPONG_64x192_C2>{});
      case MB_TILE_COOP_128x128:
      case MB_TILE_COOP_128x128_C2:
      case MB_TILE_COOP_128x192:
      case MB_TILE_COOP_128x192_C2:
      case MB_TILE_PINGPONG_64x128_C2:
      case MB_TILE_PINGPONG_128x128:
      case MB_TILE_PINGPONG_128x128_C2:
        return fail(MB_ERR_UNSUPPORTED, "grouped gemm sm90: tile %s is the FP8 GEMM's (mb_grouped_gemm_fp8)",
                    tile_name(tactic.tile));
      case MB_TILE_WOQ_128x16:
      case MB_TILE_WOQ_128x32:
      case MB_TILE_WOQ_128x64:
      case MB_TILE_WOQ_128x128:
      case MB_TILE_WOQ_128x256:
      case MB_TILE_WOQ_128x320_C2:
      case MB_TILE_WOQ_128x160:
      case MB_TILE_WOQ_128x192:
      case MB_TILE_WOQ_128x224:
        return fail(MB_ERR_UNSUPPORTED, "grouped gemm sm90: tile %s is the weight-only GEMM's "
                    "(mb_grouped_gemm_woq_sm90)", tile_name(tactic.tile));
      default: return run(std::integral_constant<int, MB_TILE_COOP_128x256>{});  // MB_TILE_COOP_128x256
    }
  };
  return dtype == MB_BF16 ? go(__nv_bfloat16{}) : go(__half{});
}

// Every sm90 entry point, after its checks (check_tactic included): the tactic's kernel.
inline mb_status dispatch_sm90(const GemmParams& p, int64_t max_rows, int dtype, int epilogue,
                               const mb_gemm_tactic& tactic, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream) {
  switch (tactic.kernel) {
    case MB_GEMM_DECODE:
      return launch_grouped_decode(p, max_rows, dtype, epilogue, tactic.k_split,
                                   tactic.launch == MB_LAUNCH_AFTER_TRIGGER, stream);
    case MB_GEMM_MMA:
      if (p.weights_blocked)
        return fail(MB_ERR_UNSUPPORTED, "grouped gemm sm90: the mma tiles read row-major weights only, not "
                                        "MB_WEIGHTS_BLOCKED64");
      return launch_grouped_mma(p, max_rows, dtype, epilogue, tactic.tile, stream);
    default:
      switch (epilogue) {
        case EPI_GATED:
          return dispatch_wgmma<EPI_GATED>(p, max_rows, dtype, tactic, workspace, workspace_bytes, stream);
        case EPI_FINALIZE:
          return dispatch_wgmma<EPI_FINALIZE>(p, max_rows, dtype, tactic, workspace, workspace_bytes, stream);
        default: return dispatch_wgmma<EPI_STORE>(p, max_rows, dtype, tactic, workspace, workspace_bytes, stream);
      }
  }
}

}  // namespace mbk
