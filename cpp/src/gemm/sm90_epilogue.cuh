// The wgmma GEMMs' epilogue (MoeEpilogue): no shared memory, each consumer thread writes its own
// accumulator fragment as a plain store (+ bias), GEMM1's gated activation (act(gate, up) of an
// interleaved W1, written at half width) or the MoE finalize (unpermute + top-k weight + bias, atomically
// reduced into the token's output row), with the 16-byte store / vector-atomic helpers they use.
#pragma once

#include <cstdint>

#include "common/act_math.cuh"
#include "common/fp8_quantize.cuh"  // quotient: the gated epilogue quantizing to e4m3
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/detail.hpp"
#include "gemm/mma.cuh"           // EpilogueKind, Pair
#include "gemm/sm90_pairs.cuh"    // kSplitTileFlag

namespace mbk {

using InternalStrideD = cute::remove_pointer_t<cutlass::detail::TagToStrideC_t<cutlass::layout::RowMajor*>>;

template <typename T> struct CutlassType;
template <> struct CutlassType<__nv_bfloat16> { using type = cutlass::bfloat16_t; };
template <> struct CutlassType<__half> { using type = cutlass::half_t; };

// 4x4 transpose across a lane quad: lane q holds v[s] (s = 0..3); afterwards it holds v[p] = lane
// p's former v[q]. Two butterfly rounds (partner q ^ 2, then q ^ 1), each trading two values chosen by
// the lane's own bit, so every step is a shuffle or a select: no value is indexed at run time (indexing
// v[k] by a run-time k compiles into branches, too long to hide under the other warpgroup's mainloop).
__device__ __forceinline__ void quad_transpose(uint32_t (&v)[4], int q) {
  const bool hi = q & 2, odd = q & 1;
  uint32_t r0 = __shfl_xor_sync(0xffffffffu, hi ? v[0] : v[2], 2);
  uint32_t r1 = __shfl_xor_sync(0xffffffffu, hi ? v[1] : v[3], 2);
  v[0] = hi ? r0 : v[0];
  v[1] = hi ? r1 : v[1];
  v[2] = hi ? v[2] : r0;
  v[3] = hi ? v[3] : r1;
  r0 = __shfl_xor_sync(0xffffffffu, odd ? v[0] : v[1], 1);
  r1 = __shfl_xor_sync(0xffffffffu, odd ? v[2] : v[3], 1);
  v[0] = odd ? r0 : v[0];
  v[2] = odd ? r1 : v[2];
  v[1] = odd ? v[1] : r0;
  v[3] = odd ? v[3] : r1;
}

// One 16-byte atomic add of eight packed 16-bit values (sm_90 vector red; PTX 8.1), and the plain and gated
// epilogues' 16-byte store; where `hinted`, under the L2 cache policy `policy` (a createpolicy handle,
// l2_evict_last()).
// No "memory" clobber: the kernel never reads what it writes (later readers are ordered by the stream), and
// the clobber would pin every load of the epilogue (bias, maps) behind the previous atomic.
template <typename T>
__device__ __forceinline__ void red_add_16B(T* dst, const uint32_t (&v)[4], bool hinted, uint64_t policy);
template <>
__device__ __forceinline__ void red_add_16B<__nv_bfloat16>(__nv_bfloat16* dst, const uint32_t (&v)[4], bool hinted,
                                                          uint64_t policy) {
  if (hinted) {
    asm volatile("red.global.add.L2::cache_hint.noftz.v4.bf16x2 [%0], {%1, %2, %3, %4}, %5;" ::"l"(dst), "r"(v[0]),
                 "r"(v[1]), "r"(v[2]), "r"(v[3]), "l"(policy));
  } else {
    asm volatile("red.global.add.noftz.v4.bf16x2 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v[0]), "r"(v[1]),
                 "r"(v[2]), "r"(v[3]));
  }
}
template <>
__device__ __forceinline__ void red_add_16B<__half>(__half* dst, const uint32_t (&v)[4], bool hinted,
                                                   uint64_t policy) {
  if (hinted) {
    asm volatile("red.global.add.L2::cache_hint.noftz.v4.f16x2 [%0], {%1, %2, %3, %4}, %5;" ::"l"(dst), "r"(v[0]),
                 "r"(v[1]), "r"(v[2]), "r"(v[3]), "l"(policy));
  } else {
    asm volatile("red.global.add.noftz.v4.f16x2 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v[0]), "r"(v[1]),
                 "r"(v[2]), "r"(v[3]));
  }
}
__device__ __forceinline__ void store_16B(void* dst, const uint32_t (&v)[4], bool hinted, uint64_t policy) {
  if (hinted) {
    asm volatile("st.global.L2::cache_hint.v4.b32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(dst), "r"(v[0]), "r"(v[1]),
                 "r"(v[2]), "r"(v[3]), "l"(policy));
  } else {
    *reinterpret_cast<uint4*>(dst) = make_uint4(v[0], v[1], v[2], v[3]);
  }
}
// The same for 8 bytes (a lane's 8 e4m3 features of the quantized gated epilogue).
__device__ __forceinline__ void store_8B(void* dst, uint32_t lo, uint32_t hi, bool hinted, uint64_t policy) {
  if (hinted) {
    asm volatile("st.global.L2::cache_hint.v2.b32 [%0], {%1, %2}, %3;" ::"l"(dst), "r"(lo), "r"(hi), "l"(policy));
  } else {
    *reinterpret_cast<uint2*>(dst) = make_uint2(lo, hi);
  }
}
// An L2 policy under which the written lines are evicted after the others (evict_last) in the whole L2.
__device__ __forceinline__ uint64_t l2_evict_last() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// The FP8 GEMM1's gated epilogue writing GEMM2's e4m3 input by a static scale (fc2_input_quant=gemm1; p.epilogue stays
// EPI_GATED): a kernel of its own rather than a branch of EPI_GATED's, which kept the 16-bit-output kernel's code as it
// was (with the branch in it, dynamic FP8 layers at 256 tokens ran 2% slower: docs/performance.md, "GEMM1's epilogue
// quantizing GEMM2's input").
constexpr int EPI_GATED_E4M3 = 3;
// The block-128 FP8 GEMM1's gated epilogue on the gate/up halves map (gemm/sm90_static_maps.cuh, kGateUpHalves): W1
// stacked, each 128-column tile t's columns 0..63 the gate columns of features 64t..64t+63 and columns 64..127 their up
// columns; the bias stacked as W1 (gate features, then up). The 16-bit output as EPI_GATED's.
constexpr int EPI_GATED_HALVES = 4;

// What CUTLASS's kernel and GemmUniversalAdapter read of an epilogue run by its Sm90TmaWarpSpecializedAdapter (the
// same hook as its DefaultEpilogueArray) whose consumer threads write their own accumulator fragments, with no shared
// memory and no TMA store: its types and host hooks, for arguments Args holding at least `out` and `offsets`, which
// are also its params. MoeEpilogue below and the weight-only GEMMs' transposed epilogues (gemm/woq_sm90.cuh,
// WoqOwnStoresEpilogue) derive from it.
template <typename T, class Args>
class OwnStoresEpilogueSurface {
 public:
  using EpilogueSchedule = cutlass::epilogue::PtrArrayNoSmemWarpSpecialized;
  using DispatchPolicy = EpilogueSchedule;
  using ElementC = typename CutlassType<T>::type;
  using ElementD = ElementC;
  using InternalStrideC = mbk::InternalStrideD;
  using InternalStrideD = mbk::InternalStrideD;
  using StrideC = InternalStrideC*;
  using StrideD = InternalStrideD*;
  using GmemTiledCopyC = void;
  using GmemTiledCopyD = void;
  // GemmUniversalAdapter reads the accumulator type through this.
  struct ThreadEpilogueOp {
    using ElementAccumulator = float;
    using ElementCompute = float;
    using ElementOutput = ElementD;
    using ElementD = ElementOutput;
  };
  struct SharedStorage {};
  using TensorMapStorage = SharedStorage;
  using Arguments = Args;
  using Params = Args;

  template <class PS>
  static constexpr Params to_underlying_arguments(PS const&, Arguments const& args, void*) {
    return args;
  }
  template <class PS>
  static size_t get_workspace_size(PS const&, Arguments const&, int) {
    return 0;
  }
  template <class PS>
  static cutlass::Status initialize_workspace(PS const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }
  template <class PS>
  static bool can_implement(PS const&, Arguments const& args) {
    return args.out != nullptr && args.offsets != nullptr;
  }

  CUTLASS_HOST_DEVICE OwnStoresEpilogueSurface(Params const& params) : params_(params) {}

  CUTLASS_DEVICE bool is_source_needed() { return false; }

 protected:
  Params params_;
};

// MoeEpilogue's arguments (and params), one type for every mode.
template <typename T>
struct MoeEpilogueArguments {
  const T* bias = nullptr;        // [E, N] or null
  T* out = nullptr;               // plain: [rows, N]; finalize: [tokens, N], zeroed by the caller
  const int64_t* offsets = nullptr;
  const int32_t* permuted_to_unpermuted = nullptr;
  const float* permuted_weights = nullptr;
  int top_k = 1;
  int activation = MB_ACT_SWIGLU;  // gated epilogue: act(gate, up), gate_up_interleaved W1 (gated_row)
  float swiglu_alpha = 1.f;
  float swiglu_limit = 0.f;
  bool evict_last = false;  // the gated stores and finalize atomics under L2 evict_last (MB_OUTPUT_L2_EVICT_LAST)
  const float* row_scale = nullptr;  // kFp8Rowwise: [rows] per permuted row
  const float* col_scale = nullptr;  // kFp8Rowwise: [E, N] per expert and output column
  // EPI_GATED_E4M3 (fc2_input_quant=gemm1): out is e4m3 [rows, N / 2], each act(gate, up) rounded to T and then
  // quantized by this static scale (device scalar) as common/fp8_quantize.cuh does; out_scales [rows] gets the
  // scale of every row written.
  const float* out_static_scale = nullptr;
  float* out_scales = nullptr;
};

// Operator-style epilogue (OwnStoresEpilogueSurface): each consumer thread gets its wgmma accumulator fragment and the
// fragment's (row, column) coordinates in the current group, and writes them itself.
// kFp8Rowwise (every mode): the accumulators are FP8 products, scaled here by the row's and the column's
// scale (MB_FP8_ROWWISE, gemm/fp8.cuh) before the bias (and the gated activation, or the finalize's routing
// weight).
template <typename T, int kEpi, bool kFp8Rowwise = false>
class MoeEpilogue : public OwnStoresEpilogueSurface<T, MoeEpilogueArguments<T>> {
  using Base = OwnStoresEpilogueSurface<T, MoeEpilogueArguments<T>>;
  using Base::params_;

 public:
  using typename Base::Params;

  CUTLASS_HOST_DEVICE MoeEpilogue(Params const& params) : Base(params) {}

  // The accumulator layout every mode relies on (CUTLASS's wgmma CLayout_64xN, as partitioned for a
  // thread of any of the tiles here): a thread's fragment is one 64-row wgmma slab, or two where one
  // warpgroup owns 128 rows (pingpong 128 x 128: the fragment's second mode), each walked alone. In a slab,
  // value i = v0 + 2*v1 + 4*j (v0, v1 in {0, 1}, j < slab size / 4) is element (m0 + 8*v1, n0 + v0 + 8*j)
  // of the tile, (m0, n0) being the thread's first element in the slab. So a thread has two rows (h = v1)
  // of a slab and, per row, one column pair in each 8-column group j, with n0 even.
  // The modes below address everything from (m0, n0) with compile-time offsets and test rows and
  // columns with predicates, not branches: one pingpong warpgroup's epilogue must fit under the other's
  // mainloop, and with one warp per scheduler nothing hides its latency (per-element coordinates, a
  // 64-bit address and a branch per column pair, do not fit under a short-K mainloop).
  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_mnk,
                                 BlockCoordMNKL blk_coord_mnkl, cute::Tensor<FrgEngine, FrgLayout> const& acc,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char*) {
    using namespace cute;
    constexpr int kSlabs = decltype(size<1>(acc))::value;  // 64-row wgmma slabs: 2 where a warpgroup owns 128 rows
    static_assert(decltype(size<2>(acc))::value == 1, "a thread's fragment is one wgmma column tile");
    static_assert(decltype(size<0>(acc))::value % 16 == 0, "a slab holds groups of four 8-column pairs");
    const int M = get<0>(problem_shape_mnkl);
    const int N = get<1>(problem_shape_mnkl);
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord_mnkl;
    Tensor coords = local_tile(make_identity_tensor(make_shape(M, N)), take<0, 2>(blk_shape_mnk),
                               make_coord(m_coord & ~kSplitTileFlag, n_coord));
    Tensor tc = tiled_mma.get_thread_slice(thread_idx).partition_C(coords);
    const int64_t row0 = params_.offsets[l_coord];
    const T* bias = params_.bias ? params_.bias + (int64_t)l_coord * N : nullptr;
    const float* col_scale = kFp8Rowwise ? params_.col_scale + (int64_t)l_coord * N : nullptr;
    // kFp8Rowwise: the column scales of every column pair of the thread, read once per tile (the slabs share their
    // columns) and all at once, before the first store or atomic: read group by group, each group's loads waited
    // for in front of its stores, they made the epilogue of a short-K GEMM (Qwen3-30B-A3B's FP8 GEMM2, K 768) a chain
    // of L2 round trips longer than the other warpgroup's mainloop (docs/performance.md, "The FP8 epilogue's column
    // scales read once a tile").
    float2 cs[kColGroups<decltype(size<0>(acc))::value>];
    col_scales(Frag{get<0>(tc(_0{}, _0{}, _0{})), get<1>(tc(_0{}, _0{}, _0{})), M, N, row0}, col_scale, cs);
    // The slab index a compile-time constant, so that every accumulator stays a register.
    for_each(make_int_sequence<kSlabs>{}, [&](auto slab) {
      Tensor a = acc(_, slab, _0{});
      const Frag f{get<0>(tc(_0{}, slab, _0{})), get<1>(tc(_0{}, slab, _0{})), M, N, row0};
      // One branch per tile, not per element, for the bias and the activation.
      if constexpr (kEpi == EPI_FINALIZE) {
        bias ? finalize_tile<true>(a, f, bias, cs) : finalize_tile<false>(a, f, bias, cs);
      } else if constexpr (kEpi == EPI_GATED || kEpi == EPI_GATED_E4M3 || kEpi == EPI_GATED_HALVES) {
        static_assert(kEpi != EPI_GATED_E4M3 || kFp8Rowwise, "the e4m3 gated epilogue is the FP8 GEMM1's");
        static_assert(kEpi != EPI_GATED_HALVES || !kFp8Rowwise, "the gate/up halves are the block-128 GEMM1's");
        gated_act<kEpi == EPI_GATED_E4M3, kEpi == EPI_GATED_HALVES>(a, f, bias, cs);
      } else {
        bias ? store_tile<true>(a, f, bias, cs) : store_tile<false>(a, f, bias, cs);
      }
    });
  }

 private:
  // A slab's 8-column groups j (a column pair each) for a thread's fragment of kValues values a slab.
  template <int kValues>
  static constexpr int kColGroups = kValues / 4;

  // A thread's place in the tile: its first element (m0, n0), the group's M x N and first permuted row.
  struct Frag {
    int m0, n0, M, N;
    int64_t row0;
    __device__ __forceinline__ bool row_in(int h) const { return m0 + 8 * h < M; }
    __device__ __forceinline__ bool col_in(int j) const { return n0 + 8 * j < N; }  // N even: n + 1 fits too
    // Lane q's whole 8-column group of block g after quad_group (N is a multiple of 8).
    __device__ __forceinline__ bool group_in(int g, int q) const { return n0 + 6 * q + 32 * g < N; }
  };

  // The gated tile of the call's activation, with or without the bias (one branch per tile).
  template <bool kQuantized, bool kHalves, class Acc, int kGroups>
  CUTLASS_DEVICE void gated_act(Acc const& acc, Frag const& f, const T* bias, const float2 (&cs)[kGroups]) {
    switch (params_.activation) {
      case MB_ACT_GEGLU: return bias ? gated_tile<MB_ACT_GEGLU, true, kQuantized, kHalves>(acc, f, bias, cs)
                                     : gated_tile<MB_ACT_GEGLU, false, kQuantized, kHalves>(acc, f, bias, cs);
      case MB_ACT_SWIGLU_CLAMP:
        return bias ? gated_tile<MB_ACT_SWIGLU_CLAMP, true, kQuantized, kHalves>(acc, f, bias, cs)
                    : gated_tile<MB_ACT_SWIGLU_CLAMP, false, kQuantized, kHalves>(acc, f, bias, cs);
      default: return bias ? gated_tile<MB_ACT_SWIGLU, true, kQuantized, kHalves>(acc, f, bias, cs)
                           : gated_tile<MB_ACT_SWIGLU, false, kQuantized, kHalves>(acc, f, bias, cs);
    }
  }

  // v + bias for the column pair at n of group j (the bias read only for columns in range); kHalves: column n of
  // the gate/up halves' order reads the stacked bias (EPI_GATED_HALVES): tile n / 128's column n % 128 is gate
  // feature 64 (n / 128) + n % 128 below 64, else that feature's up row, N / 2 further on.
  template <bool kBias, bool kHalves = false>
  CUTLASS_DEVICE static float2 biased(float2 v, const T* bias, Frag const& f, int j) {
    const int c = f.n0 + 8 * j;
    const int n = kHalves ? (c >> 7) * 64 + (c & 63) + ((c & 64) ? f.N / 2 : 0) : c;
    if (kBias && f.col_in(j)) {
      const uint32_t bits = __ldg(reinterpret_cast<const unsigned int*>(bias + n));
      const float2 b = Pair<T>::to_float2(*reinterpret_cast<const typename Pair<T>::type*>(&bits));
      v.x += b.x;
      v.y += b.y;
    }
    return v;
  }

  // kFp8Rowwise: the row scales of a thread's two rows (once per slab) and the column scales of its column pair
  // in every 8-column group j, which serve every row (once per tile), only in range (1 elsewhere, and for the
  // 16-bit GEMMs, which read none). The epilogue's inputs (scales, bias, weights, maps) are read through the
  // read-only path: nothing in the kernel writes them, so their loads need not wait behind its stores.
  CUTLASS_DEVICE void row_scales(Frag const& f, float (&rs)[2]) const {
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h)
      rs[h] = kFp8Rowwise && f.row_in(h) ? __ldg(params_.row_scale + f.row0 + f.m0 + 8 * h) : 1.f;
  }
  template <int kGroups>
  CUTLASS_DEVICE static void col_scales(Frag const& f, const float* col_scale, float2 (&cs)[kGroups]) {
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kGroups; ++j)
      cs[j] = kFp8Rowwise && f.col_in(j) ? __ldg(reinterpret_cast<const float2*>(col_scale + f.n0 + 8 * j))
                                         : float2{1.f, 1.f};
  }

  // Row h's column pairs of the four 8-column groups 4g..4g+3, each (acc (* rs * cs where kFp8Rowwise)
  // + bias) (* `weight` where kWeighted), packed, then transposed across the lane quad: afterwards lane q
  // holds group 4g + q whole, columns n0 - 2q + 8q + 32g = n0 + 6q + 32g onwards (values 4 * (4g + s) + 2h
  // are row h's pairs in those groups, and a quad holds the four groups whole). Every lane of the quad must
  // call it, in range or not.
  template <bool kBias, bool kWeighted, class Acc>
  CUTLASS_DEVICE static void quad_group(Acc const& acc, Frag const& f, const T* bias, int g, int h, float rs,
                                        const float2 (&cs)[4], float weight, uint32_t (&v)[4]) {
    using P2 = Pair<T>;
    CUTLASS_PRAGMA_UNROLL
    for (int s = 0; s < 4; ++s) {
      const int j = 4 * g + s, i = 4 * j + 2 * h;
      float2 x{acc(i), acc(i + 1)};
      if constexpr (kFp8Rowwise) x = {x.x * rs * cs[s].x, x.y * rs * cs[s].y};
      x = biased<kBias>(x, bias, f, j);
      if constexpr (kWeighted) x = {weight * x.x, weight * x.y};
      const typename P2::type packed = P2::make(x.x, x.y);
      v[s] = *reinterpret_cast<const uint32_t*>(&packed);
    }
    quad_transpose(v, threadIdx.x & 3);
  }

  // The plain store: out[row0 + m, n] = acc (* row_scale[m] * col_scale[n] for FP8 products) (+ bias),
  // each lane's whole 8-column group (quad_group) written with one 16-byte store instead of four 4-byte ones.
  template <bool kBias, class Acc, int kGroups>
  CUTLASS_DEVICE void store_tile(Acc const& acc, Frag const& f, const T* bias, const float2 (&col)[kGroups]) {
    const int q = threadIdx.x & 3;
    T* row[2];
    float rs[2];
    row_scales(f, rs);
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) row[h] = params_.out + (f.row0 + f.m0 + 8 * h) * f.N + f.n0 + 6 * q;
    CUTLASS_PRAGMA_UNROLL
    for (int g = 0; g < cute::size(acc) / 16; ++g) {
      const float2 cs[4] = {col[4 * g], col[4 * g + 1], col[4 * g + 2], col[4 * g + 3]};
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        uint32_t v[4];
        quad_group<kBias, false>(acc, f, bias, g, h, rs[h], cs, 1.f, v);
        if (f.row_in(h) && f.group_in(g, q))
          store_16B(row[h] + 32 * g, v, false, 0);
      }
    }
  }

  // The finalize epilogue: each row's (acc (* row_scale * col_scale for FP8 products) + bias) * routing
  // weight, atomically added into its token's output row, each lane's whole 8-column group (quad_group)
  // with one 16-byte vector atomic instead of four 4-byte ones.
  // Each row's weight, scale and output row are read once per slab (a tile is one slab, or two for the pingpong
  // 128 x 128 tiles), before the column loop, so that no dependent global loads sit in front of the atomics
  // (reading every slab's before the first atomic was no faster: docs/experiments.md).
  template <bool kBias, class Acc, int kGroups>
  CUTLASS_DEVICE void finalize_tile(Acc const& acc, Frag const& f, const T* bias, const float2 (&col)[kGroups]) {
    const int q = threadIdx.x & 3;
    float w[2], rs[2];
    T* dst[2];
    row_scales(f, rs);
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      w[h] = 0.f;
      dst[h] = nullptr;
      if (f.row_in(h)) {
        const int64_t p = f.row0 + f.m0 + 8 * h;
        w[h] = __ldg(params_.permuted_weights + p);
        dst[h] = params_.out + (int64_t)(__ldg(params_.permuted_to_unpermuted + p) / params_.top_k) * f.N + f.n0 + 6 * q;
      }
    }
    const uint64_t policy = params_.evict_last ? l2_evict_last() : 0;
    CUTLASS_PRAGMA_UNROLL
    for (int g = 0; g < cute::size(acc) / 16; ++g) {
      const float2 cs[4] = {col[4 * g], col[4 * g + 1], col[4 * g + 2], col[4 * g + 3]};
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        uint32_t v[4];
        quad_group<kBias, true>(acc, f, bias, g, h, rs[h], cs, w[h], v);
        if (dst[h] != nullptr && f.group_in(g, q)) red_add_16B<T>(dst[h] + 32 * g, v, params_.evict_last, policy);
      }
    }
  }

  // Gate group s (< 4) of the quad's block g: 8g + 2s with W1 interleaved by 8, 4g + s on the gate/up halves.
  template <bool kHalves>
  CUTLASS_DEVICE static constexpr int gate_group(int g, int s) { return kHalves ? 4 * g + s : 8 * g + 2 * s; }

  // The gated epilogue: W1 interleaved in blocks of 8 rows (gated_row), so GEMM column c with
  // c % 16 < 8 is feature (c / 16) * 8 + c % 8's gate and column c + 8 its up projection. Tiles start
  // at multiples of 16 columns (the tile widths are 128, 192 and 256) and n0 % 16 = 2 * (lane % 4) < 8,
  // so for even j the pair at n0 + 8j is a gate pair and group j + 1 (values 4 further on) holds its up
  // pair: each thread has both halves of its features. A lane quad's act(gate, up) pairs of gate group j
  // are 8 consecutive features of the [rows, N / 2] activation; four gate groups' pairs are transposed
  // across the quad (quad_transpose), so each lane writes one group whole with one 16-byte store.
  // kFp8Rowwise: gate and up are each scaled by the row's and their own column's scale (W1's column scales come
  // in the same interleaved order) before the bias and the activation.
  // kQuantized (fc2_input_quant=gemm1): each act(gate, up) pair, rounded to T as the 16-bit store would write it,
  // is quantized to two e4m3 bytes by the static scale (mb::fp8::quantize_pair, the quantize step's rule: the bytes the
  // quantize step would write from those 16-bit rows); after the transpose a lane stores its 8 features' bytes
  // with one 8-byte store, and the lanes holding a row's first features (the tile at column 0, lane 0 of the
  // quad) write the row's scale.
  // kHalves (EPI_GATED_HALVES): gate group j < 8 of a 128-column tile and its up group j + 8 (values 32 further on)
  // instead: the quad's four gate groups 4g..4g+3 are again 8 consecutive features each, the same features and
  // stores as below.
  template <int ACT, bool kBias, bool kQuantized, bool kHalves, class Acc, int kGroups>
  CUTLASS_DEVICE void gated_tile(Acc const& acc, Frag const& f, const T* bias, const float2 (&col)[kGroups]) {
    using P2 = Pair<T>;
    static_assert(decltype(cute::size(acc))::value % 32 == 0, "blocks of four gate groups");
    static_assert(!kHalves || decltype(cute::size(acc))::value == 64, "the gate/up halves: a 128-column slab");
    const int inter = f.N / 2;
    const float alpha = params_.swiglu_alpha, limit = params_.swiglu_limit;
    const int q = threadIdx.x & 3;
    const int nq = f.n0 - 2 * q;  // the quad's first column, a multiple of 16; its first feature is nq / 2
    const uint64_t policy = params_.evict_last ? l2_evict_last() : 0;
    T* row[2];
    float rs[2];
    row_scales(f, rs);
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) row[h] = params_.out + (f.row0 + f.m0 + 8 * h) * inter + nq / 2 + 8 * q;
    float qs = 1.f, qy = 1.f;  // kQuantized: the static scale and its correctly rounded reciprocal
    if constexpr (kQuantized) {
      qs = *params_.out_static_scale;
      qy = __frcp_rn(qs);
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        if (nq == 0 && q == 0 && f.row_in(h)) params_.out_scales[f.row0 + f.m0 + 8 * h] = qs;
      }
    }
    CUTLASS_PRAGMA_UNROLL
    for (int g = 0; g < cute::size(acc) / 32; ++g) {  // gate groups j = 8g + 2s, s < 4
      constexpr int kUp = kHalves ? 8 : 1;  // the up group of gate group j: j + kUp
      float2 cs_gate[4], cs_up[4];  // kFp8Rowwise: the column scales of gate group j and up group j + 1
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < 4; ++s) {
        cs_gate[s] = col[gate_group<kHalves>(g, s)];
        cs_up[s] = col[gate_group<kHalves>(g, s) + kUp];  // N is a multiple of 16: in range where the gate group is
      }
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        uint32_t v[4];
        CUTLASS_PRAGMA_UNROLL
        for (int s = 0; s < 4; ++s) {
          const int j = gate_group<kHalves>(g, s), i = 4 * j + 2 * h;
          float2 gate{acc(i), acc(i + 1)}, up{acc(i + 4 * kUp), acc(i + 4 * kUp + 1)};
          if constexpr (kFp8Rowwise) {
            gate = {gate.x * rs[h] * cs_gate[s].x, gate.y * rs[h] * cs_gate[s].y};
            up = {up.x * rs[h] * cs_up[s].x, up.y * rs[h] * cs_up[s].y};
          }
          gate = biased<kBias, kHalves>(gate, bias, f, j);
          up = biased<kBias, kHalves>(up, bias, f, j + kUp);
          const typename P2::type packed =
              P2::make(mb::act_apply<ACT>(gate.x, up.x, alpha, limit), mb::act_apply<ACT>(gate.y, up.y, alpha, limit));
          if constexpr (kQuantized) {
            v[s] = mb::fp8::quantize_pair(P2::to_float2(packed), qs, qy);
          } else {
            v[s] = *reinterpret_cast<const uint32_t*>(&packed);
          }
        }
        quad_transpose(v, q);
        // Lane q now holds gate group 8g + 2q (kHalves: 4g + q) whole: features nq / 2 + 32g + 8q onwards, in range
        // where nq + 64g + 16q < N (N is a multiple of 16: its up columns are in range too).
        if (f.row_in(h) && nq + 64 * g + 16 * q < f.N) {
          if constexpr (kQuantized) {
            uint8_t* dst = reinterpret_cast<uint8_t*>(params_.out) + (row[h] - params_.out) + 32 * g;
            store_8B(dst, v[0] | v[1] << 16, v[2] | v[3] << 16, params_.evict_last, policy);
          } else {
            store_16B(row[h] + 32 * g, v, params_.evict_last, policy);
          }
        }
      }
    }
  }
};

}  // namespace mbk
