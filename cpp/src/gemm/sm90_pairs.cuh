// Work units for the 2x1-cluster wgmma tiles (16-bit pingpong 64x256 or 64x192, FP8 cooperative 128x128 or
// 128x192, each in 2x1 clusters) without empty tiles.
//
// In a 2x1 cluster the two CTAs take neighbouring row tiles of one expert and TMA-multicast the
// weight tile they share. CUTLASS's group scheduler rounds each expert's row tiles up to whole
// clusters, so an expert with an odd row-tile count runs one all-padding tile per column tile: with
// random routing about half the experts, ~1/2 tile per expert.
//
// PairedTileScheduler hands out cluster units instead. A unit is either
//   a pair : both CTAs on the same column tile n, row tiles 2p and 2p + 1 (B multicast, as CUTLASS);
//   a split: the expert's odd last row tile on two column tiles n and n + 1, one each; the CTAs share
//            no weight tile, so each loads its own whole B tile (PairedMainloop) without multicast.
// Per expert, the units walk the column tiles in blocks of two: the pairs of column tile 2j, those
// of 2j + 1, then the split of (2j, 2j + 1), so a weight tile is reused while it is still in L2.
// Only when both the row-tile and the column-tile counts are odd is one tile of a split empty.
// Clusters take units strided by the cluster count, as CUTLASS's scheduler takes tiles, so the
// clusters running at one time work on neighbouring units and share weight tiles through L2.
//
// Every ptr-array kernel in 2x1 clusters takes this scheduler (TileSchedulerSelector at the end).
// A split unit is marked with kSplitTileFlag in WorkTileInfo::M_idx (the kernel passes M_idx through
// idx2crd unchanged to the loads and the epilogue); PairedMainloop (its A / B loads and a blockwise-scaled
// collective's scale loads) and MoeEpilogue strip it.
#pragma once

#include <type_traits>

#include "cute/arch/cluster_sm90.hpp"
#include "cute/tensor.hpp"
#include "common/common.cuh"  // mb::warp_inclusive_scan
#include "cutlass/gemm/kernel/tile_scheduler.hpp"

namespace mbk {

constexpr int32_t kSplitTileFlag = 1 << 30;

// What the scheduler warp does with its next tile in CUTLASS's group scheduler (the base's
// advance_to_next_work after its index step), shared by the schedulers here that replace the tile order:
// the whole warp acquires the next slot of the pipeline that carries tiles to the other warps, one lane
// writes the tile there and commits it.
template <class SchedulerPipeline, class SchedulerPipelineState, class Response, class WorkTileInfo>
CUTLASS_DEVICE auto publish_work_tile(SchedulerPipeline& pipeline, SchedulerPipelineState state, Response* response,
                                      WorkTileInfo const& tile) {
  pipeline.producer_acquire(state);
  if (cute::elect_one_sync()) {
    response[state.index()] = tile;
    cutlass::arch::fence_view_async_shared();
    pipeline.producer_commit(state);
  }
  return cute::make_tuple(tile, true);
}

struct PairTile {
  int32_t m, n;
  bool split;
};

// Units of a group with tiles_m x tiles_n tiles.
__host__ __device__ __forceinline__ uint32_t pair_units(uint32_t tiles_m, uint32_t tiles_n) {
  return (tiles_m / 2) * tiles_n + (tiles_m % 2) * ((tiles_n + 1) / 2);
}

// The tile of CTA `rank` (0 or 1) in unit v of such a group (order in the header comment).
__host__ __device__ __forceinline__ PairTile pair_unit_tile(uint32_t v, uint32_t tiles_m, uint32_t tiles_n,
                                                            uint32_t rank) {
  const uint32_t pairs = tiles_m / 2, odd = tiles_m % 2;
  const uint32_t per_block = 2 * pairs + odd;  // units of a block of two column tiles
  const uint32_t full_blocks = tiles_n / 2;
  uint32_t j = full_blocks, w = v - full_blocks * per_block, cols = 1;  // the last, one-column block
  if (v < full_blocks * per_block) {
    j = v / per_block;
    w = v % per_block;
    cols = 2;
  }
  if (w < cols * pairs) {
    return {static_cast<int32_t>(2 * (w % pairs) + rank), static_cast<int32_t>(2 * j + w / pairs), false};
  }
  return {static_cast<int32_t>(tiles_m - 1), static_cast<int32_t>(2 * j + rank), true};
}

// CUTLASS's group scheduler with its work-tile order replaced (the scheduler warp, every warp's
// first tile and the pipeline that carries tiles to the other warps are CUTLASS's).
template <class GroupProblemShape, int Stages>
class PairedTileScheduler
    : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Group<GroupProblemShape, Stages> {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Group<GroupProblemShape, Stages>;

 public:
  using WorkTileInfo = typename Base::WorkTileInfo;
  using Params = typename Base::Params;
  using SchedulerResponse = typename Base::SchedulerResponse;

  PairedTileScheduler() = default;

  CUTLASS_DEVICE PairedTileScheduler(Params const& params, SchedulerResponse* response) : Base(params, response) {
    const dim3 cluster = cute::cluster_id_in_grid(), clusters = cute::cluster_grid_dims();
    num_clusters_ = uint64_t(clusters.x) * clusters.y * clusters.z;
    unit_ = cluster.x + uint64_t(cluster.y) * clusters.x + uint64_t(cluster.z) * clusters.x * clusters.y;
    rank_ = cute::block_rank_in_cluster();
  }

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) {
    return current_work();
  }

  // Same contract as the base's: the whole scheduler warp calls it; one lane publishes the tile.
  template <typename SchedulerPipeline, typename SchedulerPipelineState>
  CUTLASS_DEVICE auto advance_to_next_work(SchedulerPipeline& pipeline, SchedulerPipelineState state,
                                           uint32_t advance_count = 1) {
    unit_ += num_clusters_ * advance_count;
    return publish_work_tile(pipeline, state, this->response_ptr_, current_work());
  }

 private:
  // The unit counts of groups group_ + 1 .. group_ + 32 are scanned a warp at a time until one
  // holds unit_; a CTA's units only grow, so the walk never goes back.
  CUTLASS_DEVICE WorkTileInfo current_work() {
    auto& shapes = this->scheduler_params.problem_shapes_;
    const int groups = shapes.groups();
    const uint32_t tm = this->scheduler_params.cta_shape_.m(), tn = this->scheduler_params.cta_shape_.n();
    const int lane = cutlass::canonical_lane_idx();
    while (unit_ >= start_ + units_) {
      const uint64_t first = start_ + units_;
      const int g = group_ + 1 + lane;
      uint32_t tiles_m = 0, tiles_n = 0;
      if (g < groups) {
        const auto s = shapes.get_problem_shape(g);
        tiles_m = (cute::get<0>(s) + tm - 1) / tm;
        tiles_n = (cute::get<1>(s) + tn - 1) / tn;
      }
      const int count = static_cast<int>(pair_units(tiles_m, tiles_n));
      const int incl = mb::warp_inclusive_scan(count);
      const uint32_t hit = __ballot_sync(0xffffffffu, g < groups && unit_ < first + incl);
      const int src = hit ? __ffs(hit) - 1 : 31;
      group_ = __shfl_sync(0xffffffffu, g, src);
      units_ = __shfl_sync(0xffffffffu, count, src);
      start_ = first + __shfl_sync(0xffffffffu, incl - count, src);
      tiles_m_ = __shfl_sync(0xffffffffu, tiles_m, src);
      tiles_n_ = __shfl_sync(0xffffffffu, tiles_n, src);
      if (!hit && group_ + 1 >= groups) return WorkTileInfo::invalid_work_tile();
    }
    const PairTile t = pair_unit_tile(static_cast<uint32_t>(unit_ - start_), tiles_m_, tiles_n_, rank_);
    return {t.split ? (t.m | kSplitTileFlag) : t.m, t.n, group_, 1};
  }

  uint64_t unit_ = 0, num_clusters_ = 1;
  uint32_t rank_ = 0;
  int group_ = -1;               // the group holding units [start_, start_ + units_)
  uint64_t start_ = 0, units_ = 0;
  uint32_t tiles_m_ = 0, tiles_n_ = 0;
};

// The ptr-array TMA mainloop (StaticMapMainloop's, gemm/sm90_static_maps.cuh), except that a split
// unit's B tile is loaded whole by its own CTA (both multicast slices, addressed to this CTA alone)
// instead of half by each CTA of the pair.
// Each CTA's full barrier still expects one A and one B tile; the empty barriers stay cluster-wide,
// so the two CTAs keep stepping through the pipeline stages together.
template <class Base>
struct PairedMainloop : Base {
  static_assert(cute::size<0>(typename Base::DispatchPolicy::ClusterShape{}) == 2 &&
                    cute::size<1>(typename Base::DispatchPolicy::ClusterShape{}) == 1,
                "PairedMainloop pairs the CTAs of a 2x1 cluster");

  template <class LoadInputs, class TensorMapA, class TensorMapB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(typename Base::Params const& params, typename Base::MainloopPipeline pipeline,
                           typename Base::PipelineState smem_pipe_write, LoadInputs const& load_inputs,
                           cute::tuple<TensorMapA, TensorMapB> const& input_tensormaps, BlockCoord const& blk_coord,
                           KTileIterator k_tile_iter, int k_tile_count, int thread_idx, uint32_t block_rank_in_cluster,
                           typename Base::TensorStorage& shared_tensors) {
    using namespace cute;
    const int32_t m_coord = get<0>(blk_coord);
    if (!(m_coord & kSplitTileFlag)) {
      Base::load(params, pipeline, smem_pipe_write, load_inputs, input_tensormaps, blk_coord, k_tile_iter,
                 k_tile_count, thread_idx, block_rank_in_cluster, shared_tensors);
      return;
    }
    if (!cute::elect_one_sync()) return;
    this->await_inputs();
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), typename Base::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), typename Base::SmemLayoutB{});
    Tensor gA = this->tile_a(params, m_coord & ~kSplitTileFlag);
    auto tma_a = params.tma_load_a.get_slice(0);
    Tensor tAgA = tma_a.partition_S(gA);
    Tensor tAsA = tma_a.partition_D(sA);
    const uint16_t self = uint16_t(1) << block_rank_in_cluster;
    this->with_b_tile(params, get<1>(blk_coord), [&](auto const& tma_load_b, auto const& gB) {
      auto tma_b0 = tma_load_b.get_slice(0);
      auto tma_b1 = tma_load_b.get_slice(1);
      Tensor tB0gB = tma_b0.partition_S(gB);
      Tensor tB0sB = tma_b0.partition_D(sB);
      Tensor tB1gB = tma_b1.partition_S(gB);
      Tensor tB1sB = tma_b1.partition_D(sB);
      Base::load_k_tiles(pipeline, smem_pipe_write, k_tile_iter, k_tile_count, [&](auto& barrier, auto k, int stage) {
        copy(params.tma_load_a.with(barrier, uint16_t(0)), tAgA(_, _, _, k), tAsA(_, _, _, stage));
        copy(tma_load_b.with(barrier, self), tB0gB(_, _, _, k), tB0sB(_, _, _, stage));
        copy(tma_load_b.with(barrier, self), tB1gB(_, _, _, k), tB1sB(_, _, _, stage));
      });
    });
  }

  // A blockwise-scaled collective's scale loads (its auxiliary producer warp: cp.async by each CTA for its
  // own tile, no multicast) on the unit's row tile: a split unit's without its flag.
  template <class LoadInputs, class BlockCoord, class... Rest>
  CUTLASS_DEVICE void load_auxiliary(typename Base::Params const& params, typename Base::MainloopPipeline pipeline,
                                     typename Base::PipelineState smem_pipe_write, LoadInputs const& load_inputs,
                                     BlockCoord const& blk_coord, Rest&&... rest) {
    using cute::get;
    Base::load_auxiliary(params, pipeline, smem_pipe_write, load_inputs,
                         cute::make_coord(get<0>(blk_coord) & ~kSplitTileFlag, get<1>(blk_coord), get<2>(blk_coord),
                                          get<3>(blk_coord)),
                         static_cast<Rest&&>(rest)...);
  }
};

// The mainloop a tile's kernel runs over its static-map mainloop `Static` (gemm/sm90_static_maps.cuh): in
// 2x1 clusters the kernel runs PairedTileScheduler's units (TileSchedulerSelector below),
// whose split units need PairedMainloop's loads; in one-CTA clusters `Static` itself.
template <class Static>
using ClusterMainloop = std::conditional_t<cute::size<0>(typename Static::DispatchPolicy::ClusterShape{}) == 2,
                                           PairedMainloop<Static>, Static>;

}  // namespace mbk

// The ptr-array kernels take their scheduler from this selector (they accept no scheduler tag but the group
// one): every tile in 2x1 clusters (16-bit pingpong, FP8 cooperative) runs PairedTileScheduler's units, so
// its mainloop must be a PairedMainloop (ClusterMainloop above).
namespace cutlass::gemm::kernel::detail {
template <uint32_t Stages, class GroupProblemShape, class TileShape>
struct TileSchedulerSelector<GroupScheduler, arch::Sm90, TileShape, cute::Shape<cute::_2, cute::_1, cute::_1>, Stages,
                             GroupProblemShape> {
  using Scheduler = mbk::PairedTileScheduler<GroupProblemShape, Stages>;
};
}  // namespace cutlass::gemm::kernel::detail
