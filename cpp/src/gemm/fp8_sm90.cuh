// The FP8 wgmma grouped GEMM's kernels (gemm/fp8_sm90.cu: the plain store and finalize epilogues, and the
// workspace; gemm/fp8_sm90_gated.cu: the gated epilogue, rowwise scales only): the tiles, CUTLASS's FP8 mainloops
// on the fixed TMA maps, and one launch of one tile. Two translation units instantiate them, so that the gated
// epilogue's kernels compile beside the others.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/detail.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "gemm/fp8.cuh"
#include "gemm/sm90_epilogue.cuh"
#include "gemm/sm90_pairs.cuh"  // ClusterMainloop, and PairedTileScheduler for the 2x1-cluster tiles
#include "gemm/sm90_problem_shape.cuh"
#include "gemm/sm90_static_maps.cuh"
#include "gemm/tactic.cuh"

namespace mbk {
namespace fp8_sm90 {

using Fp8Element = cutlass::float_e4m3_t;
constexpr int kFp8Alignment = 16;  // elements per 16-byte TMA access

// MB_FP8_BLOCK128's scale layouts: K-major, i.e. sa [rows, kb] and sb [E, nb, kb] row-major.
using BlockScaleConfig =
    cutlass::detail::Sm90BlockwiseScaleConfig<1, kFp8Block, kFp8Block, cute::GMMA::Major::K, cute::GMMA::Major::K>;
using LayoutSFA = decltype(BlockScaleConfig::deduce_layoutSFA());
using LayoutSFB = decltype(BlockScaleConfig::deduce_layoutSFB());
// The gated GEMM1's weight scales on the gate/up halves map (EPI_GATED_HALVES, gemm/sm90_static_maps.cuh): one per
// 8 rows of W1 in the halves' order, sb [E, 2I / 8, kb] (each half lies inside one 128-row block, so its 8 rows of a
// scale row share that block's scale). 8 rows, not 64: a wgmma thread's 16 column groups are 8 columns apart, and
// CUTLASS's blockwise consumer takes per-column scales only in that shape (a 64-row scale block splits the groups'
// mode, which its accumulator-shaped scale tensor refuses).
constexpr int kHalvesScaleRows = 8;
using HalvesScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, kHalvesScaleRows, kFp8Block,
                                                                    cute::GMMA::Major::K, cute::GMMA::Major::K>;
using LayoutSFBHalves = decltype(HalvesScaleConfig::deduce_layoutSFB());

// The blockwise mainloop on the fixed maps: StaticMapMainloop's A / B loads, and where a producer warp
// moves to another group, the group's scale tensors (its first scale row of A, its experts' scale
// blocks of B), which the collective's auxiliary load then copies (on the gate/up halves map, this
// mainloop's own load_halves_scales).
template <class Base, bool kGateUpHalves = false>
struct StaticMapBlockwise : StaticMapMainloop<Base, kGateUpHalves> {
  using Static = StaticMapMainloop<Base, kGateUpHalves>;
  struct Arguments : Static::Arguments {
    const float* scale_a = nullptr;  // [rows_a, kb]
    const float* scale_b = nullptr;  // [E, nb, kb]
  };
  struct Params : Static::Params {
    const float* scale_a;
    const float* scale_b;
  };
  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape shapes, Arguments const& args, void* workspace) {
    return Params{Static::to_underlying_arguments(shapes, args, workspace), args.scale_a, args.scale_b};
  }
  template <class InputTensors, class ProblemShape_MNKL>
  CUTLASS_DEVICE auto tensors_perform_update(InputTensors const& input_tensors, Params const& params,
                                             ProblemShape_MNKL shape, int32_t group) {
    Static::tensors_perform_update(input_tensors, params, shape, group);
    const int64_t kb = fp8_k_blocks(params.k);
    const int64_t nb = (params.n + Base::ScaleGranularityN - 1) / Base::ScaleGranularityN;  // scale rows of a group
    group_sa_ = params.scale_a + this->row_a_ * kb;
    group_sb_ = params.scale_b + group * nb * kb;
    group_rows_ = static_cast<int32_t>(cute::get<0>(shape));
    return Base::load_init(shape, params, group_sa_, group_sb_);
  }
  // The scales' producer warp reads scale_a, which the previous kernel writes (the activation quantization,
  // which lets this kernel launch as it starts): like the A / B producer it waits for that kernel before its
  // first copy (await_inputs; at once where the GEMM was not launched after a trigger).
  template <class LoadInputs, class BlockCoord, class KTileIterator>
  CUTLASS_DEVICE void load_auxiliary(Params const& params, typename Base::MainloopPipeline pipeline,
                                     typename Base::PipelineState smem_pipe_write, LoadInputs const& load_inputs,
                                     BlockCoord const& blk_coord, KTileIterator k_tile_iter, int k_tile_count,
                                     int lane, uint32_t block_rank_in_cluster,
                                     typename Base::TensorStorage& shared_tensors) {
    this->await_inputs();
    if constexpr (kGateUpHalves) {
      load_halves_scales(params, pipeline, smem_pipe_write, blk_coord, k_tile_iter, k_tile_count, lane,
                         shared_tensors);
    } else {
      Base::load_auxiliary(params, pipeline, smem_pipe_write, load_inputs, blk_coord, k_tile_iter, k_tile_count,
                           lane, block_rank_in_cluster, shared_tensors);
    }
  }

 private:
  // The gate/up halves' scale loads, one cp.async a scale: for each k block of the tile, lane l copies A's scales
  // of rows l, l + 32, .. of the row tile and, for l < 16, B's scale row 16 n + l (8 weight rows each). CUTLASS's
  // auxiliary load is not used here: it spreads a tile's 128 columns over the 32 lanes and lets lanes below the
  // tile's scale count (16) copy, so with 8-column scale rows only rows 0, 1, 4, 5, .. of every 16 arrived (the
  // GPU tests of 2026-12-07 found features 16-31 of every 64 zero).
  template <class BlockCoord, class KTileIterator>
  CUTLASS_DEVICE void load_halves_scales(Params const& params, typename Base::MainloopPipeline& pipeline,
                                         typename Base::PipelineState smem_pipe_write, BlockCoord const& blk_coord,
                                         KTileIterator k_tile_iter, int k_tile_count, int lane,
                                         typename Base::TensorStorage& shared_tensors) {
    using namespace cute;
    using Copy = SM80_CP_ASYNC_CACHEALWAYS<float>;
    constexpr int kRows = size<0>(typename Base::TileShape{}), kScaleRowsB = Base::ScaleNsPerTile;
    Tensor sSFA = make_tensor(make_smem_ptr(shared_tensors.smem_SFA.data()), typename Base::SmemLayoutSFA{});
    Tensor sSFB = make_tensor(make_smem_ptr(shared_tensors.smem_SFB.data()), typename Base::SmemLayoutSFB{});
    const int64_t kb = fp8_k_blocks(params.k);
    const int32_t row0 = get<0>(blk_coord) * kRows, scale_row0 = get<1>(blk_coord) * kScaleRowsB;
    const int32_t scale_rows_b = params.n / Base::ScaleGranularityN;
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      pipeline.producer_acquire(smem_pipe_write);
      const int stage = smem_pipe_write.index();
      const int64_t kt = *k_tile_iter;
      CUTLASS_PRAGMA_UNROLL
      for (int i = lane; i < kRows; i += 32) {
        if (row0 + i < group_rows_)
          Copy::copy(group_sa_[(row0 + i) * kb + kt], sSFA(make_coord(0, i), make_coord(0, 0), stage));
      }
      if (lane < kScaleRowsB && scale_row0 + lane < scale_rows_b)
        Copy::copy(group_sb_[(scale_row0 + lane) * kb + kt], sSFB(make_coord(0, lane), make_coord(0, 0), stage));
      pipeline.producer_commit(smem_pipe_write, cutlass::arch::cpasync_barrier_arrive_noinc);
      ++k_tile_iter;
      ++smem_pipe_write;
    }
  }

  const float* group_sa_ = nullptr;  // the group's first scale row of A, of B (tensors_perform_update)
  const float* group_sb_ = nullptr;
  int32_t group_rows_ = 0;  // the group's rows
};

// The FP8 tiles, k blocks of 128 (128 bytes): tile shape, cluster shape, the kernel schedules of both
// scalings (rowwise promoted or fast) and whether the blockwise mainloop takes the tile. That mainloop scales
// the accumulators by weight-scale blocks of 128 columns and has no form for 256 columns (or 192, not whole
// blocks), so coop 128x256 and 128x192 are rowwise only.
//
// At the FP8 tensor rate a 128 x 128 x 128 tile's 32 KB of A and B per 512 clocks is ~64 bytes per clock per
// SM from L2, more than L2 delivers to every SM at once; the wider and clustered tiles read fewer bytes per
// FLOP while keeping the promoted fp32 accumulation (its second accumulator doubles the registers, so a
// 64 x 256 warpgroup tile, coop 128x256, does not fit them):
//   coop 128x128 in 2x1 clusters: the cluster's two CTAs take neighbouring row tiles of one expert and
//                                 TMA-multicast their weight tile (PairedTileScheduler's units,
//                                 gemm/sm90_pairs.cuh): 24 KB per 512 clocks, ~48 B/clock;
//   coop 128x192                : 64 x 192 per warpgroup, 96 + 96 accumulator registers: 40 KB per 768
//                                 clocks, ~53 B/clock;
//   coop 128x192 in 2x1 clusters: both: 28 KB per 768 clocks, ~37 B/clock.
// Fast accumulation keeps one accumulator, so coop 128x256 fits its registers there.
template <int kTile> struct Fp8TileTraits;
template <> struct Fp8TileTraits<MB_TILE_COOP_128x128> {
  using Shape = cute::Shape<cute::_128, cute::_128, cute::_128>;
  using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Rowwise = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using RowwiseFast = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum;
  using Block = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise;
  static constexpr bool kTakesBlock128 = true;
  static constexpr bool kFastOnly = false;
};
template <> struct Fp8TileTraits<MB_TILE_COOP_128x256> : Fp8TileTraits<MB_TILE_COOP_128x128> {
  using Shape = cute::Shape<cute::_128, cute::_256, cute::_128>;
  static constexpr bool kTakesBlock128 = false;
};
template <> struct Fp8TileTraits<MB_TILE_PINGPONG_64x128> {
  using Shape = cute::Shape<cute::_64, cute::_128, cute::_128>;
  using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Rowwise = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using RowwiseFast = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8FastAccum;
  using Block = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise;
  static constexpr bool kTakesBlock128 = true;
  static constexpr bool kFastOnly = false;
};
// pingpong 64 x 128 in 2x1 clusters: an expert's row tiles two by two on one weight tile, multicast (the units of
// PairedTileScheduler, as the 16-bit pingpong c2 tiles): where the narrow tile runs (up to 128 rows an expert with
// fast accumulation) an expert has two or three row tiles, each of which otherwise reads the weight tile itself.
template <> struct Fp8TileTraits<MB_TILE_PINGPONG_64x128_C2> : Fp8TileTraits<MB_TILE_PINGPONG_64x128> {
  using Cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
};
// pingpong 128 x 128: a consumer warpgroup's tile is 128 rows, two 64-row wgmmas on each weight tile it loads (MoeEpilogue
// walks both slabs), so each weight tile is read once per 128 rows and one warpgroup's epilogue runs under the other's
// mainloop. Its 128 accumulator registers a thread leave no room for promotion: fast accumulation only.
template <> struct Fp8TileTraits<MB_TILE_PINGPONG_128x128> : Fp8TileTraits<MB_TILE_PINGPONG_64x128> {
  using Shape = cute::Shape<cute::_128, cute::_128, cute::_128>;
  static constexpr bool kTakesBlock128 = false;
  static constexpr bool kFastOnly = true;
};
template <> struct Fp8TileTraits<MB_TILE_PINGPONG_128x128_C2> : Fp8TileTraits<MB_TILE_PINGPONG_128x128> {
  using Cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
};
template <> struct Fp8TileTraits<MB_TILE_COOP_128x128_C2> : Fp8TileTraits<MB_TILE_COOP_128x128> {
  using Cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
};
template <> struct Fp8TileTraits<MB_TILE_COOP_128x192> : Fp8TileTraits<MB_TILE_COOP_128x128> {
  using Shape = cute::Shape<cute::_128, cute::_192, cute::_128>;
  static constexpr bool kTakesBlock128 = false;
};
template <> struct Fp8TileTraits<MB_TILE_COOP_128x192_C2> : Fp8TileTraits<MB_TILE_COOP_128x192> {
  using Cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
};

template <typename T, int kScaling, int kTile, int kEpi, bool kFast>
struct Fp8Wgmma {
  static constexpr bool kBlock = kScaling == MB_FP8_BLOCK128;
  // The block-128 gated GEMM1: W1 stacked, read through the gate/up halves map, its scales by 64-row halves.
  static constexpr bool kHalves = kEpi == EPI_GATED_HALVES;
  static_assert(!kHalves || kBlock, "the gate/up halves map is the block-128 gated GEMM1's");
  using Tile = Fp8TileTraits<kTile>;
  static_assert(!kBlock || Tile::kTakesBlock128, "the blockwise mainloop's tiles are 128 columns wide");
  static_assert(!kBlock || !kFast, "the blockwise mainloop promotes every 128-k block");
  using Schedule = std::conditional_t<kBlock, typename Tile::Block,
                                      std::conditional_t<kFast, typename Tile::RowwiseFast, typename Tile::Rowwise>>;
  using Cluster = typename Tile::Cluster;
  using Epi = MoeEpilogue<T, kEpi, !kBlock>;
  using Epilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<Epi>;
  using LayoutA = std::conditional_t<kBlock, cute::tuple<cutlass::layout::RowMajor*, LayoutSFA*>,
                                     cutlass::layout::RowMajor*>;
  using LayoutB = std::conditional_t<
      kBlock, cute::tuple<cutlass::layout::ColumnMajor*, std::conditional_t<kHalves, LayoutSFBHalves, LayoutSFB>*>,
      cutlass::layout::ColumnMajor*>;
  using Built = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Fp8Element, LayoutA, kFp8Alignment, Fp8Element, LayoutB,
      kFp8Alignment, float, typename Tile::Shape, Cluster, cutlass::gemm::collective::StageCountAutoCarveout<0>,
      Schedule>::CollectiveOp;
  // The fixed maps (and the blockwise scales' group origins); PairedMainloop's loads in 2x1 clusters.
  using Static = StaticMapMainloop<Built, kHalves>;
  using Mainloop = ClusterMainloop<std::conditional_t<kBlock, StaticMapBlockwise<Built, kHalves>, Static>>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <typename T, int kScaling, int kTile, int kEpi, bool kFast>
typename Fp8Wgmma<T, kScaling, kTile, kEpi, kFast>::Gemm::Arguments fp8_args(const Fp8GemmParams& p, int64_t max_rows,
                                                                             int sm_count) {
  using G = Fp8Wgmma<T, kScaling, kTile, kEpi, kFast>;
  cutlass::KernelHardwareInfo hw{};
  cudaGetDevice(&hw.device_id);
  hw.sm_count = sm_count;
  // CUTLASS's per-group pointer arrays are never read (the fixed maps and the offsets replace them); its
  // host code only needs a 16-byte-aligned address for a placeholder map.
  using Element = Fp8Element;
  typename G::Static::Arguments fixed{};
  static_cast<typename G::Built::Arguments&>(fixed).ptr_A =
      reinterpret_cast<const Element**>(const_cast<uint8_t*>(p.A));
  static_cast<typename G::Built::Arguments&>(fixed).ptr_B =
      reinterpret_cast<const Element**>(const_cast<uint8_t*>(p.B));
  fixed.base_a = p.A;
  fixed.rows_a = static_cast<int>(max_rows);
  fixed.base_b = p.B;
  fixed.rows_b = p.num_experts * p.n;
  fixed.k = p.k;
  fixed.offsets = p.offsets;
  fixed.n = p.n;
  typename G::Mainloop::Arguments mainloop{};
  static_cast<typename G::Static::Arguments&>(mainloop) = fixed;
  if constexpr (G::kBlock) {
    mainloop.scale_a = p.scale_a;
    mainloop.scale_b = p.scale_b;
  }
  typename G::Epi::Arguments epi{};
  epi.bias = static_cast<const T*>(p.bias);
  epi.out = static_cast<T*>(p.C);
  epi.offsets = p.offsets;
  epi.permuted_to_unpermuted = p.permuted_to_unpermuted;
  epi.permuted_weights = p.permuted_weights;
  epi.top_k = p.top_k;
  epi.evict_last = p.evict_last;
  epi.activation = p.activation;
  epi.swiglu_alpha = p.swiglu_alpha;
  epi.swiglu_limit = p.swiglu_limit;
  if constexpr (!G::kBlock) {
    epi.row_scale = p.scale_a;
    epi.col_scale = p.scale_b;
    epi.out_static_scale = p.c_static_scale;
    epi.out_scales = p.c_scales;
  }
  return typename G::Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
                                     {p.num_experts, p.offsets, p.n, p.k},
                                     mainloop,
                                     epi,
                                     hw,
                                     {}};
}

template <typename T, int kScaling, int kTile, int kEpi, bool kFast>
size_t fp8_cutlass_workspace(int num_experts, int sm_count) {
  Fp8GemmParams none{};
  none.num_experts = num_experts;
  return Fp8Wgmma<T, kScaling, kTile, kEpi, kFast>::Gemm::get_workspace_size(
      fp8_args<T, kScaling, kTile, kEpi, kFast>(none, 0, sm_count));
}

template <typename T, int kScaling, int kTile, int kEpi, bool kFast>
mb_status run_tile(const Fp8GemmParams& p, int64_t max_rows, bool after_trigger, void* workspace,
                   size_t workspace_bytes, cudaStream_t stream) {
  using G = Fp8Wgmma<T, kScaling, kTile, kEpi, kFast>;
  const int sm_count = mb::device_attribute(cudaDevAttrMultiProcessorCount);
  const size_t need = fp8_cutlass_workspace<T, kScaling, kTile, kEpi, kFast>(p.num_experts, sm_count);
  if (!workspace || workspace_bytes < need)
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm fp8: workspace %zu bytes < %zu needed", workspace_bytes, need);
  typename G::Gemm gemm;
  auto args = fp8_args<T, kScaling, kTile, kEpi, kFast>(p, max_rows, sm_count);
  cutlass::Status st = gemm.can_implement(args);
  if (st != cutlass::Status::kSuccess)
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm fp8: CUTLASS cannot implement (%s)", cutlassGetStatusString(st));
  st = gemm.initialize(args, workspace, stream);
  if (st == cutlass::Status::kSuccess) st = gemm.run(stream, nullptr, after_trigger);
  const cudaError_t err = cudaGetLastError();
  if (st != cutlass::Status::kSuccess || err != cudaSuccess)
    return fail(MB_ERR_CUDA, "grouped gemm fp8: %s / %s", cutlassGetStatusString(st), cudaGetErrorString(err));
  return MB_OK;
}

template <typename T, int kScaling, int kEpi, bool kFast>
mb_status run_scaling(const Fp8GemmParams& p, int64_t max_rows, int tile, bool after_trigger, void* workspace,
                      size_t workspace_bytes, cudaStream_t stream) {
  auto run = [&](auto tag) {
    constexpr int kTile = decltype(tag)::value;
    if constexpr (kScaling == MB_FP8_BLOCK128 && !Fp8TileTraits<kTile>::kTakesBlock128)
      return fail(MB_ERR_UNSUPPORTED, "grouped gemm fp8: tile %s takes rowwise scales only (block128: coop128x128, "
                                      "coop128x128c2, pingpong64x128 or pingpong64x128c2)", tile_name(kTile));
    else if constexpr (!kFast && Fp8TileTraits<kTile>::kFastOnly)
      return fail(MB_ERR_UNSUPPORTED, "grouped gemm fp8: tile %s takes fast accumulation only (promoted: every other "
                                      "rowwise tile)", tile_name(kTile));
    else
      return run_tile<T, kScaling, kTile, kEpi, kFast>(p, max_rows, after_trigger, workspace, workspace_bytes,
                                                       stream);
  };
  switch (tile) {
    case MB_TILE_PINGPONG_64x128: return run(std::integral_constant<int, MB_TILE_PINGPONG_64x128>{});
    case MB_TILE_PINGPONG_64x128_C2: return run(std::integral_constant<int, MB_TILE_PINGPONG_64x128_C2>{});
    case MB_TILE_PINGPONG_128x128: return run(std::integral_constant<int, MB_TILE_PINGPONG_128x128>{});
    case MB_TILE_PINGPONG_128x128_C2: return run(std::integral_constant<int, MB_TILE_PINGPONG_128x128_C2>{});
    case MB_TILE_COOP_128x256: return run(std::integral_constant<int, MB_TILE_COOP_128x256>{});
    case MB_TILE_COOP_128x128_C2: return run(std::integral_constant<int, MB_TILE_COOP_128x128_C2>{});
    case MB_TILE_COOP_128x192: return run(std::integral_constant<int, MB_TILE_COOP_128x192>{});
    case MB_TILE_COOP_128x192_C2: return run(std::integral_constant<int, MB_TILE_COOP_128x192_C2>{});
    default: return run(std::integral_constant<int, MB_TILE_COOP_128x128>{});  // MB_TILE_COOP_128x128
  }
}

}  // namespace fp8_sm90
}  // namespace mbk
