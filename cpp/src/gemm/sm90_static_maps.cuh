// CUTLASS's ptr-array TMA mainloop with one fixed TMA descriptor per operand instead of one patched
// per group.
//
// CUTLASS's grouped mainloop rewrites its A and B tensor maps whenever a CTA moves to another group
// (address, dims, strides in shared memory, copied out to global memory behind a tensormap release
// fence, then an acquire fence before the next load). A persistent CTA's consecutive tiles are a grid
// apart, so nearly every tile starts in another expert and pays that round trip on the producer's
// critical path. Here every expert's rows already sit in one [rows_a, K] tensor (the expanded
// activations, experts back to back) and every expert's weights in one [E * N, K] tensor, so the maps
// are built once on the host over those whole tensors, and a group only moves the tile's origin: row
// offsets[g] of A (the expert's first permuted row) and row g * N of B. A tile that runs past its expert's
// rows (or columns) reads the next expert's (or, at the end, TMA's zero fill); those rows and columns
// lie outside the group's M x N, which every MoeEpilogue mode masks, and rows of a GEMM are independent,
// so the kept outputs are unchanged.
//
// The weights may also come in MB_WEIGHTS_BLOCKED64's layout (64 x 64 blocks, each contiguous): B's
// map is then built over a hierarchical view of the same [rows_b, k] coordinates, rows (64, rows_b / 64)
// and columns (64, k / 64), so that a weight tile of 64 * j rows is j contiguous 8 KB runs rather than
// 64 * j rows of 128 bytes, 2k bytes apart. Same tiles, same shared-memory layout, same outputs (GEMM1
// bit-identical). A tile whose per-CTA weight slice is not whole 64-row blocks (64x192 in 2x1 clusters:
// 96 rows) cannot take the blocked map (kTakesBlocked) and refuses blocked weights.
//
// kGateUpHalves (the block-128 FP8 GEMM1 with the gated epilogue): B is W1 stacked as the checkpoint stores it (each
// expert's gate rows 0..I-1, then its up rows I..2I-1, n = 2I) and its map is built over a hierarchical view of the
// same rows in which weight tile t's 128 rows are gate rows 64t..64t+63, then up rows I+64t..I+64t+63: rows
// (64, 2, I / 64, E) with strides (k, I k, 64 k, 2I k). A 128-column tile then holds 64 features' gate and up
// columns (MoeEpilogue's EPI_GATED_HALVES), and each 64-row half lies inside one 128-row scale block of the stacked
// rows (I a multiple of 64), so the blockwise mainloop scales each half by its own block's scales (a block-128 scale
// tensor in the halves' order, moe_build.weights.fp8.gate_up_halves_scales) while the weights stay as stored.
#pragma once

#include "common/common.cuh"  // mb::let_dependents_start / wait_for_predecessor
#include <type_traits>

#include "cute/tensor.hpp"

namespace mbk {

// The element type a collective's TMA maps are built over: its InternalElementA / B where it names one
// (CUTLASS's 16-bit and blockwise FP8 collectives), else ElementA / B (its FP8 collective).
template <class C, class = void> struct MapElementA { using type = typename C::ElementA; };
template <class C> struct MapElementA<C, std::void_t<typename C::InternalElementA>> {
  using type = typename C::InternalElementA;
};
template <class C, class = void> struct MapElementB { using type = typename C::ElementB; };
template <class C> struct MapElementB<C, std::void_t<typename C::InternalElementB>> {
  using type = typename C::InternalElementB;
};

template <class Base, bool kGateUpHalves = false>
struct StaticMapMainloop : Base {
  using ElementA = typename MapElementA<Base>::type;
  using ElementB = typename MapElementB<Base>::type;
  using ClusterShape = typename Base::DispatchPolicy::ClusterShape;
  static constexpr int kTileN = cute::size<1>(typename Base::TileShape{});
  static constexpr int kTileK = cute::size<2>(typename Base::TileShape{});
  static constexpr int kBlock = 64;  // MB_WEIGHTS_BLOCKED64's block rows and columns
  // Each CTA's TMA slice of a weight tile is whole blocks, and a k step is one block column.
  static constexpr bool kTakesBlocked =
      (kTileN / cute::size<0>(ClusterShape{})) % kBlock == 0 && kTileK == kBlock;

  // [rows_b, k] in MB_WEIGHTS_BLOCKED64's layout, as a hierarchical (row, column) view.
  CUTE_HOST_DEVICE static auto blocked_b_layout(int rows_b, int k) {
    using namespace cute;
    return make_layout(
        make_shape(make_shape(Int<kBlock>{}, rows_b / kBlock), make_shape(Int<kBlock>{}, k / kBlock), int32_t(1)),
        make_stride(make_stride(int64_t(kBlock), int64_t(kBlock) * k), make_stride(_1{}, int64_t(kBlock * kBlock)),
                    int64_t(0)));
  }
  template <class Engine>
  static auto make_blocked_tma(Engine const* base_b, int rows_b, int k) {
    using namespace cute;
    return make_tma_copy(typename Base::GmemTiledCopyB{}, make_tensor(base_b, blocked_b_layout(rows_b, k)),
                         typename Base::SmemLayoutB{}(_, _, Int<0>{}), make_shape(Int<kTileN>{}, Int<kTileK>{}),
                         size<0>(ClusterShape{}));
  }
  template <bool kTakes, int = 0> struct BlockedTma {
    using type = decltype(make_blocked_tma(static_cast<ElementB const*>(nullptr), kBlock, kBlock));
  };
  template <int D> struct BlockedTma<false, D> {
    struct type {};  // never built: the tile refuses blocked weights
  };
  using TmaBlockedB = typename BlockedTma<kTakesBlocked>::type;
  // kGateUpHalves: each CTA's TMA slice of a weight tile is whole 64-row halves.
  static constexpr bool kTakesHalves = kTileN == 128 && (kTileN / cute::size<0>(ClusterShape{})) % 64 == 0;
  static_assert(!kGateUpHalves || kTakesHalves, "the gate/up halves map takes 128-column tiles");

  // W1 stacked ([rows_b, k], n = 2I rows an expert) as the gate/up halves view (header comment).
  CUTE_HOST_DEVICE static auto halves_b_layout(int rows_b, int n, int k) {
    using namespace cute;
    const int inter = n / 2;
    return make_layout(
        make_shape(make_shape(Int<64>{}, Int<2>{}, inter / 64, rows_b / n), k, int32_t(1)),
        make_stride(make_stride(int64_t(k), int64_t(inter) * k, int64_t(64) * k, int64_t(n) * k), _1{}, int64_t(0)));
  }
  template <class Engine>
  static auto make_halves_tma(Engine const* base_b, int rows_b, int n, int k) {
    using namespace cute;
    return make_tma_copy(typename Base::GmemTiledCopyB{}, make_tensor(base_b, halves_b_layout(rows_b, n, k)),
                         typename Base::SmemLayoutB{}(_, _, Int<0>{}), make_shape(Int<kTileN>{}, Int<kTileK>{}),
                         size<0>(ClusterShape{}));
  }
  template <bool kHalves, int = 0> struct HalvesTma {
    using type = decltype(make_halves_tma(static_cast<ElementB const*>(nullptr), 128, 128, 128));
  };
  template <int D> struct HalvesTma<false, D> {
    struct type {};  // never built: the kernel reads B row-major or blocked
  };
  using TmaHalvesB = typename HalvesTma<kGateUpHalves>::type;

  struct Arguments : Base::Arguments {
    const void* base_a = nullptr;  // every group's A rows, one row-major [rows_a, k] tensor
    int rows_a = 0;
    const void* base_b = nullptr;  // every group's B, one [rows_b, k] tensor (K-major rows)
    int rows_b = 0;
    int k = 0;
    const int64_t* offsets = nullptr;  // group g's rows of A start at offsets[g]
    int n = 0;                         // group g's rows of B start at g * n
    bool b_blocked = false;            // B in MB_WEIGHTS_BLOCKED64's layout (only where kTakesBlocked)
  };
  struct Params : Base::Params {
    const ElementA* base_a;
    const ElementB* base_b;
    int rows_a, rows_b, k;
    const int64_t* offsets;
    int n;
    bool b_blocked;
    TmaBlockedB tma_load_b_blocked;  // built where b_blocked
    TmaHalvesB tma_load_b_halves;    // built where kGateUpHalves
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape shapes, Arguments const& args, void* workspace) {
    using namespace cute;
    Params p{Base::to_underlying_arguments(shapes, args, workspace), static_cast<const ElementA*>(args.base_a),
             static_cast<const ElementB*>(args.base_b), args.rows_a, args.rows_b, args.k, args.offsets, args.n,
             args.b_blocked, {}, {}};
    typename Base::InternalStrideA stride_a{};
    get<0>(stride_a) = args.k;
    typename Base::InternalStrideB stride_b{};
    get<0>(stride_b) = args.k;
    auto a = make_tensor(p.base_a, make_layout(make_shape(args.rows_a, args.k, int32_t(1)), stride_a));
    auto b = make_tensor(p.base_b, make_layout(make_shape(args.rows_b, args.k, int32_t(1)), stride_b));
    using TileShape = typename Base::TileShape;
    p.tma_load_a = make_tma_copy(typename Base::GmemTiledCopyA{}, a, typename Base::SmemLayoutA{}(_, _, Int<0>{}),
                                 make_shape(shape<0>(TileShape{}), shape<2>(TileShape{})), size<1>(ClusterShape{}));
    p.tma_load_b = make_tma_copy(typename Base::GmemTiledCopyB{}, b, typename Base::SmemLayoutB{}(_, _, Int<0>{}),
                                 make_shape(shape<1>(TileShape{}), shape<2>(TileShape{})), size<0>(ClusterShape{}));
    if constexpr (kTakesBlocked) {
      if (args.b_blocked) p.tma_load_b_blocked = make_blocked_tma(p.base_b, args.rows_b, args.k);
    }
    if constexpr (kGateUpHalves) p.tma_load_b_halves = make_halves_tma(p.base_b, args.rows_b, args.n, args.k);
    return p;
  }

  // The kernel's per-group hooks: the maps never change, so there is nothing to patch or fence; a new
  // group only moves the tile origin (set here, by the whole producer warp, before the group's first
  // load).
  template <class... Ts>
  CUTLASS_DEVICE void tensormaps_perform_update(Ts const&...) {}
  template <class... Ts>
  CUTLASS_DEVICE void tensormaps_cp_fence_release(Ts const&...) {}
  template <class... Ts>
  CUTLASS_DEVICE void tensormaps_fence_acquire(Ts const&...) {}
  template <class InputTensors, class ProblemShape_MNKL>
  CUTLASS_DEVICE InputTensors tensors_perform_update(InputTensors const& input_tensors, Params const& params,
                                                     ProblemShape_MNKL, int32_t group) {
    row_a_ = static_cast<int32_t>(params.offsets[group]);
    row_b_ = group * params.n;
    return input_tensors;
  }

  // Programmatic dependent launch: before its first load the producer lets the next kernel in the
  // stream launch (its CTAs find an SM only as this grid's CTAs exit, so they set up under this grid's
  // last tiles) and, where run_wgmma launched this kernel after a trigger, waits for the previous
  // kernel, which may still be writing A (without that launch attribute the wait returns at once).
  // Nothing runs ahead of the wait but what reads memory written before the previous kernel started
  // (the scheduler's expert offsets): the consumers' mainloops and epilogues, and so every output
  // write and every read of the routing maps and weights, come after these loads.
  CUTLASS_DEVICE void await_inputs() {
    if (inputs_ready_) return;
    mb::let_dependents_start();
    mb::wait_for_predecessor();
    inputs_ready_ = true;
  }

  // The (BLK_M, BLK_K, k) tile m of the current group's A, and (BLK_N, BLK_K, k) tile n of its B.
  CUTLASS_DEVICE auto tile_a(Params const& params, int32_t m) const {
    using namespace cute;
    Tensor mA = domain_offset(make_coord(row_a_, 0, 0),
                              params.tma_load_a.get_tma_tensor(make_shape(params.rows_a, params.k, int32_t(1))));
    return local_tile(mA, typename Base::TileShape{}, make_coord(_, _, _), Step<_1, X, _1>{})(_, _, m, _, 0);
  }
  CUTLASS_DEVICE auto tile_b(Params const& params, int32_t n) const {
    using namespace cute;
    Tensor mB = domain_offset(make_coord(row_b_, 0, 0),
                              params.tma_load_b.get_tma_tensor(make_shape(params.rows_b, params.k, int32_t(1))));
    return local_tile(mB, typename Base::TileShape{}, make_coord(_, _, _), Step<X, _1, _1>{})(_, _, n, _, 0);
  }
  // The same tile on the blocked map (kTakesBlocked only).
  CUTLASS_DEVICE auto tile_b_blocked(Params const& params, int32_t n) const {
    using namespace cute;
    Tensor mB = domain_offset(make_coord(row_b_, 0, 0), params.tma_load_b_blocked.get_tma_tensor(
                                                            shape(blocked_b_layout(params.rows_b, params.k))));
    return local_tile(mB, typename Base::TileShape{}, make_coord(_, _, _), Step<X, _1, _1>{})(_, _, n, _, 0);
  }
  // The same tile on the gate/up halves map (kGateUpHalves only).
  CUTLASS_DEVICE auto tile_b_halves(Params const& params, int32_t n) const {
    using namespace cute;
    Tensor mB = domain_offset(make_coord(row_b_, 0, 0), params.tma_load_b_halves.get_tma_tensor(
                                                            shape(halves_b_layout(params.rows_b, params.n, params.k))));
    return local_tile(mB, typename Base::TileShape{}, make_coord(_, _, _), Step<X, _1, _1>{})(_, _, n, _, 0);
  }
  // f(B's map, the tile's (BLK_N, BLK_K, k) coordinates) on the map the weights' layout needs.
  template <class F>
  CUTLASS_DEVICE void with_b_tile(Params const& params, int32_t n, F&& f) const {
    if constexpr (kGateUpHalves) {
      f(params.tma_load_b_halves, tile_b_halves(params, n));
    } else {
      if constexpr (kTakesBlocked) {
        if (params.b_blocked) return f(params.tma_load_b_blocked, tile_b_blocked(params, n));
      }
      f(params.tma_load_b, tile_b(params, n));
    }
  }

  // The producer's walk over a tile's k blocks, shared by this load and PairedMainloop's split units:
  // for each, wait for a free stage, then issue(barrier, k block, stage) starts its copies on that
  // stage's full barrier.
  template <class KTileIterator, class Issue>
  CUTLASS_DEVICE static void load_k_tiles(typename Base::MainloopPipeline& pipeline,
                                          typename Base::PipelineState& smem_pipe_write, KTileIterator& k_tile_iter,
                                          int k_tile_count, Issue&& issue) {
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      pipeline.producer_acquire(smem_pipe_write);
      issue(*pipeline.producer_get_barrier(smem_pipe_write), *k_tile_iter, smem_pipe_write.index());
      ++k_tile_iter;
      ++smem_pipe_write;
    }
  }

  // CUTLASS's load, on the fixed maps at the group's origin (the collective's load inputs are not used:
  // A and B come from the fixed maps, and a blockwise collective's scales from its auxiliary load).
  template <class LoadInputs, class TensorMapA, class TensorMapB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, typename Base::MainloopPipeline pipeline,
                           typename Base::PipelineState smem_pipe_write, LoadInputs const&,
                           cute::tuple<TensorMapA, TensorMapB> const&, BlockCoord const& blk_coord,
                           KTileIterator k_tile_iter, int k_tile_count, int, uint32_t block_rank_in_cluster,
                           typename Base::TensorStorage& shared_tensors) {
    using namespace cute;
    if (!cute::elect_one_sync()) return;
    await_inputs();
    constexpr uint32_t cluster_x = size<0>(ClusterShape{});
    const uint32_t cx = block_rank_in_cluster % cluster_x, cy = block_rank_in_cluster / cluster_x;
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), typename Base::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), typename Base::SmemLayoutB{});
    auto tma_a = params.tma_load_a.get_slice(cy);
    Tensor tAgA = tma_a.partition_S(tile_a(params, get<0>(blk_coord)));
    Tensor tAsA = tma_a.partition_D(sA);
    uint16_t mcast_a = 0, mcast_b = 0;
    auto block_layout = Layout<ClusterShape>{};  // (m, n) -> block id
    if constexpr (cute::is_same_v<typename Base::GmemTiledCopyA, SM90_TMA_LOAD_MULTICAST>) {
      for (int n = 0; n < size<1>(block_layout); ++n) mcast_a |= uint16_t(1) << block_layout(cx, n, Int<0>{});
    }
    if constexpr (cute::is_same_v<typename Base::GmemTiledCopyB, SM90_TMA_LOAD_MULTICAST>) {
      for (int m = 0; m < size<0>(block_layout); ++m) mcast_b |= uint16_t(1) << block_layout(m, cy, Int<0>{});
    }
    with_b_tile(params, get<1>(blk_coord), [&](auto const& tma_load_b, auto const& gB) {
      auto tma_b = tma_load_b.get_slice(cx);
      Tensor tBgB = tma_b.partition_S(gB);
      Tensor tBsB = tma_b.partition_D(sB);
      load_k_tiles(pipeline, smem_pipe_write, k_tile_iter, k_tile_count, [&](auto& barrier, auto k, int stage) {
        copy(params.tma_load_a.with(barrier, mcast_a), tAgA(_, _, _, k), tAsA(_, _, _, stage));
        copy(tma_load_b.with(barrier, mcast_b), tBgB(_, _, _, k), tBsB(_, _, _, stage));
      });
    });
  }

 protected:
  int32_t row_a_ = 0, row_b_ = 0;  // the current group's first row of A and of B
  bool inputs_ready_ = false;      // await_inputs() has returned (on the producer's elected thread)
};

}  // namespace mbk
