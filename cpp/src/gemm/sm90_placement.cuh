// Tiles by placement: a persistent wgmma GEMM launched after a trigger (programmatic dependent launch)
// starts each CTA at the tiles a plain launch would have given the CTA on its SM, so that it keeps a plain
// launch's layout of tiles over the chip.
//
// A persistent CTA takes the linear tiles start, start + grid, ...; neighbouring linear tiles are row tiles
// of one expert that share a weight tile. In a plain launch the hardware spreads neighbouring CTAs over
// the chip: CTAs 2j and 2j + 1 on the two SMs of one TPC, successive pairs on different GPCs. A kernel
// launched after a trigger gets each CTA an SM as the previous kernel's CTAs leave them, in whatever order
// that is; starting CTAs at their block index would put the tiles that share a weight tile anywhere.
//
// So once per device, outside any graph capture, record_placement_kernel is launched plainly with one CTA
// per SM and records which CTA each SM got (g_cta_of_sm); the host checks that the record is a permutation
// over sm_count distinct SMs before it publishes g_placed_ctas. A GEMM launched by placement
// (MB_LAUNCH_PLACED: after a trigger) is given a claim region (the caller's, zeroed once, per GEMM that may
// run at the same time as another); thread 0 of each CTA claims its SM's recorded CTA as its start slot, or
// the first free slot where another CTA of the launch has claimed that one (a second CTA on one SM: the
// first had no tiles, or finished before all CTAs were placed), and the last CTA to arrive zeroes the
// claims again. The starts are distinct by the claims alone, whatever the placement or the record: every
// tile is computed once, by one CTA.
#pragma once

#include <mutex>
#include <type_traits>
#include <vector>

#include "common/common.cuh"
#include "cute/tensor.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "gemm/sm90_pairs.cuh"  // publish_work_tile

namespace mbk {

constexpr int kMaxSmIds = 1024;                  // %smid values the record can hold
__device__ int32_t g_cta_of_sm[kMaxSmIds];       // the CTA a plain one-CTA-per-SM launch put on each SM
__device__ int32_t g_placed_ctas = 0;            // that launch's CTA count, once checked (0: no record)

__device__ __forceinline__ uint32_t sm_id() {
  uint32_t id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

// Launched plainly, one CTA per SM (its dynamic shared memory makes sure of that).
__global__ void record_placement_kernel() {
  extern __shared__ unsigned char one_cta_per_sm[];
  if (threadIdx.x == 0) {
    const uint32_t sm = sm_id();
    if (sm < kMaxSmIds) g_cta_of_sm[sm] = static_cast<int32_t>(blockIdx.x);
  }
}

// What the host knows per device: whether it has a checked record (0 not tried, 1 recorded, -1 refused).
struct DevicePlacement {
  int status = 0;
};
struct PlacementState {
  std::mutex mu;
  std::vector<DevicePlacement> by_device;
};

// The current device's entry (created on first use), under the state's lock; null without a device.
inline DevicePlacement* device_placement(PlacementState& ps) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return nullptr;
  if (static_cast<int>(ps.by_device.size()) <= dev) ps.by_device.resize(dev + 1);
  return &ps.by_device[dev];
}
inline PlacementState& placement_state() {
  static PlacementState state;
  return state;
}

// Whether the current device has a checked record (without taking one).
inline bool placement_record_exists() {
  PlacementState& ps = placement_state();
  std::lock_guard<std::mutex> lock(ps.mu);
  const DevicePlacement* d = device_placement(ps);
  return d != nullptr && d->status > 0;
}

// Takes the current device's record: one plain launch of `sm_count` one-CTA-per-SM CTAs, then a check that
// every CTA landed on its own SM. A synchronous round trip on `stream`.
inline bool take_placement_record(int sm_count, cudaStream_t stream) {
  int dev = 0, smem = 0;
  if (sm_count <= 0 || sm_count > kMaxSmIds || cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
    return false;
  std::vector<int32_t> record(kMaxSmIds, -1);
  if (cudaMemcpyToSymbolAsync(g_cta_of_sm, record.data(), sizeof(int32_t) * kMaxSmIds, 0,
                              cudaMemcpyHostToDevice, stream) != cudaSuccess ||
      cudaFuncSetAttribute(record_placement_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) !=
          cudaSuccess)
    return false;
  record_placement_kernel<<<sm_count, 32, smem, stream>>>();
  if (cudaGetLastError() != cudaSuccess ||
      cudaMemcpyFromSymbolAsync(record.data(), g_cta_of_sm, sizeof(int32_t) * kMaxSmIds, 0, cudaMemcpyDeviceToHost,
                                stream) != cudaSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess)
    return false;
  std::vector<bool> seen(sm_count, false);
  int placed = 0;
  for (int32_t cta : record) {
    if (cta < 0) continue;
    if (cta >= sm_count || seen[cta]) return false;
    seen[cta] = true;
    ++placed;
  }
  return placed == sm_count &&
         cudaMemcpyToSymbolAsync(g_placed_ctas, &sm_count, sizeof(int32_t), 0, cudaMemcpyHostToDevice, stream) ==
             cudaSuccess &&
         cudaStreamSynchronize(stream) == cudaSuccess;
}

// Whether the current device has a checked record for launches of `sm_count` CTAs. Takes the record on the
// first call outside a graph capture (once per device and process); later calls only read the entry.
inline bool placement_ready(int sm_count, cudaStream_t stream) {
  PlacementState& ps = placement_state();
  std::lock_guard<std::mutex> lock(ps.mu);
  DevicePlacement* d = device_placement(ps);
  if (d == nullptr) return false;
  if (d->status == 0) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone)
      return false;  // try again on a call that is not captured
    d->status = take_placement_record(sm_count, stream) ? 1 : -1;
  }
  return d->status > 0;
}

// The claim region of a GEMM launched by placement: kMaxSmIds slot flags and an arrival count, all zero
// between launches (its owner zeroes it once; the last CTA of each launch to arrive zeroes them again),
// then one mailbox per CTA through which thread 0 hands its CTA's slot to the other threads (global
// memory: a static __shared__ variable would move the kernel's dynamic shared memory off the 1 KB
// alignment its swizzled TMA tiles need).
constexpr int kPlacementCount = kMaxSmIds;
constexpr int kPlacementMailboxes = kMaxSmIds + 1;
constexpr int kPlacementInts = 2 * kMaxSmIds + 1;

// This CTA's start index among `grid`: its SM's recorded CTA where that slot is still free, else the first
// free slot. Thread 0 of each CTA, once. A slot is taken by compare-and-swap, so the CTAs of one launch
// get distinct slots whatever the placement: one that lands on an SM where another CTA of the launch has
// already run (an idle CTA that exited, or one that finished before all were placed) takes a free one.
__device__ inline int32_t claim_start_slot(int32_t* claims, int32_t grid, int32_t fallback) {
  int32_t slot = fallback;
  if (g_placed_ctas == grid) {
    const uint32_t sm = sm_id();
    const int32_t recorded = sm < kMaxSmIds ? g_cta_of_sm[sm] : -1;
    if (recorded >= 0 && recorded < grid) slot = recorded;
  }
  if (atomicCAS(&claims[slot], 0, 1) != 0) {
    slot = -1;
    for (int32_t s = 0; s < grid && slot < 0; ++s) {
      if (atomicCAS(&claims[s], 0, 1) == 0) slot = s;
    }
    if (slot < 0) slot = fallback;  // only where the region was not zero at the launch (a caller's error)
  }
  __threadfence();  // this CTA's claim before its arrival
  if (atomicAdd(&claims[kPlacementCount], 1) == grid - 1) {
    // Every CTA of the launch has claimed: leave the slots and the count zeroed for the next launch.
    for (int32_t s = 0; s < grid; ++s) claims[s] = 0;
    claims[kPlacementCount] = 0;
    __threadfence();
  }
  return slot;
}

// CUTLASS's group scheduler (its scheduler warp, tile order and the pipeline that carries tiles to the
// other warps), each CTA starting at a claimed slot where the launch is given a claim region (launches
// by placement), else at its block index.
template <class GroupProblemShape, int Stages>
class PlacedTileScheduler
    : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Group<GroupProblemShape, Stages> {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Group<GroupProblemShape, Stages>;

 public:
  using WorkTileInfo = typename Base::WorkTileInfo;
  using SchedulerResponse = typename Base::SchedulerResponse;
  struct Arguments : Base::Arguments {
    int32_t* claims = nullptr;  // kPlacementInts zeroed ints, or null: start at the block index
  };
  struct Params : Base::Params {
    int32_t* claims = nullptr;
  };

  template <class ProblemShape, class TileShape, class ClusterShape>
  static Params to_underlying_arguments(ProblemShape problem_shapes, TileShape tile_shape, ClusterShape cluster_shape,
                                        cutlass::KernelHardwareInfo const& hw_info, Arguments const& args,
                                        void* workspace = nullptr, const uint32_t epilogue_subtile = 1,
                                        uint32_t ktile_start_alignment_count = 1u) {
    Params p;
    static_cast<typename Base::Params&>(p) = Base::to_underlying_arguments(
        problem_shapes, tile_shape, cluster_shape, hw_info, args, workspace, epilogue_subtile,
        ktile_start_alignment_count);
    p.claims = args.claims;
    return p;
  }

  PlacedTileScheduler() = default;

  // Every thread constructs the scheduler; the kernel syncs its threads (__syncthreads, which makes thread
  // 0's mailbox store visible to them) before any asks for its first tile.
  // The grid is one-dimensional (one-CTA clusters): the base's start is blockIdx.x + blockIdx.y.
  CUTLASS_DEVICE PlacedTileScheduler(Params const& params, SchedulerResponse* response)
      : Base(params, response), claims_(grid_fits(params.claims)) {
    grid_ = uint64_t(gridDim.x) * gridDim.y * gridDim.z;
    linear_ = uint64_t(blockIdx.x) + blockIdx.y;
    if (claims_ != nullptr && threadIdx.x == 0) {
      claims_[kPlacementMailboxes + blockIdx.x] =
          claim_start_slot(claims_, static_cast<int32_t>(grid_), static_cast<int32_t>(linear_));
    }
  }

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) {
    if (claims_ != nullptr) linear_ = static_cast<uint64_t>(claims_[kPlacementMailboxes + blockIdx.x]);
    return this->get_current_work_for_linear_idx(linear_);
  }

  // Same contract as the base's: the whole scheduler warp calls it; one lane publishes the tile.
  template <typename SchedulerPipeline, typename SchedulerPipelineState>
  CUTLASS_DEVICE auto advance_to_next_work(SchedulerPipeline& pipeline, SchedulerPipelineState state,
                                           uint32_t advance_count = 1) {
    linear_ += grid_ * advance_count;
    return publish_work_tile(pipeline, state, this->response_ptr_, this->get_current_work_for_linear_idx(linear_));
  }

 private:
  // The claim region, where there is one and the grid fits it: one-dimensional along x (the mailboxes are
  // indexed by blockIdx.x; CUTLASS lays a one-CTA-cluster grid out so for the default M-major raster) and
  // at most kMaxSmIds CTAs (a persistent grid is at most the SM count).
  CUTLASS_DEVICE static int32_t* grid_fits(int32_t* claims) {
    return gridDim.y == 1 && gridDim.z == 1 && gridDim.x <= uint32_t(kMaxSmIds) ? claims : nullptr;
  }

  int32_t* claims_ = nullptr;  // the region; thread 0's slot reaches the other threads in its mailbox
  uint64_t linear_ = 0, grid_ = 1;
};

template <class Scheduler>
struct IsPlacedTileScheduler : std::false_type {};
template <class GroupProblemShape, int Stages>
struct IsPlacedTileScheduler<PlacedTileScheduler<GroupProblemShape, Stages>> : std::true_type {};

}  // namespace mbk

// The ptr-array kernels take their scheduler from this selector (they accept no scheduler tag but the group
// one): the 16-bit 64-row tiles get PlacedTileScheduler in one-CTA clusters (tiles in 2x1 clusters get
// PairedTileScheduler, gemm/sm90_pairs.cuh; other one-CTA tiles keep CUTLASS's group scheduler).
namespace cutlass::gemm::kernel::detail {
template <uint32_t Stages, class GroupProblemShape, class TileN>
struct TileSchedulerSelector<GroupScheduler, arch::Sm90, cute::Shape<cute::_64, TileN, cute::_64>,
                             cute::Shape<cute::_1, cute::_1, cute::_1>, Stages, GroupProblemShape> {
  using Scheduler = mbk::PlacedTileScheduler<GroupProblemShape, Stages>;
};
}  // namespace cutlass::gemm::kernel::detail
