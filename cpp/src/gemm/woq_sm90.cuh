// The weight-only grouped GEMM on wgmma (issue 47; sm_90a): CUTLASS 3's ptr-array mixed-input mainloop, which
// converts the int4 / int8 weights in registers (scaled per group, int4 plus its zero term) and feeds them to wgmma as
// the register operand, so no 16-bit copy of the weights is ever written. Two entry points, each its own translation
// unit: mb_grouped_gemm_woq_sm90 (gemm/woq_sm90.cu, CUTLASS's TMA store of the product),
// mb_grouped_gemm_woq_sm90_gated (gemm/woq_sm90_gated.cu, GEMM1's gated activation in the epilogue) and
// mb_grouped_gemm_woq_sm90_finalize (gemm/woq_sm90_finalize.cu, GEMM2's finalize in the epilogue); this header is what
// they share: the kernel by tile and epilogue (WoqWgmma), its per-group arrays, arguments, workspace and checks.
//
// The register operand is wgmma's A, so the GEMM runs transposed: C^T[x] = dequant(B[x]) @ A[x]^T, the expert's
// weights [n, k] as A (M = n), its token rows [rows, k] as B (N = rows), C^T stored column-major, which is C
// [rows, n] row-major. CUTLASS reads each group's operands through per-group pointer and stride arrays: a setup
// kernel writes them from the expert offsets into the workspace before the GEMM (two launches, no host sync,
// CUDA-graph capturable), and the grouped shapes are read from the same offsets (TransposedOffsetsProblemShape).
//
// int4 weights take CUTLASS's scale-and-zero mode, w = (u - 8) * s + zs with u the stored 4-bit code, read as u - 8
// (Uint4Minus8 below), and zs = (8 - z) * s (z the zero point, 8 without zeros: zs = 0), s and zs in the
// activations' 16-bit type, MN-major ([E, groups, n]); int8 and e5m2 weights its scale-only mode, w = q * s. Both of
// int4's roundings before the weight's own then fall on numbers no larger than its two parts, |u - 8| s and |8 - z| s,
// where reading u as it is would round u * s and z * s, up to 15 s each, for a weight of |u - z| s. e5m2 is MXFP4
// re-encoded under one bf16 scale per 64 k (MXFP4's scale per 32 k is two a k tile, which this mainloop does not
// take): each e2m1 value times its block's 2^(e - 127) is q * s exactly where the 64 k's two exponents lie within 27
// of each other, and CUTLASS converts e5m2 to bf16 exactly (through f16 and fp32), so w is the stored weight.
// CUTLASS 4.2's grouped kernel does not carry the scale tensor's map in the scale-and-zero mode (it initializes,
// updates and fences only the zero points' map): GroupedZeroPointMainloop below does it for the scales as well.
#pragma once

// CUTLASS's device-side asserts compiled out here: with them ptxas serializes the mixed-input mainloop's wgmma
// pipeline (an assert is a function call between the wgmma instructions, ptxas warning C7510).
#ifndef NDEBUG
#define NDEBUG
#endif
// wgmma's N in steps of 8 (CuTe's default set stops at 8, 16, 32, 64, 96, 128, 192, 256): the 160- and 224-row token
// tiles run as one wgmma a k step, and the 320-row one as two of 160 (five of 64 without it).
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#include <algorithm>
#include <iterator>
#include <cstdint>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "gemm/mma.cuh"
#include "gemm/sm90_epilogue.cuh"  // CutlassType, OwnStoresEpilogueSurface
#include "gemm/sm90_problem_shape.cuh"  // TransposedOffsetsProblemShape
#include "gemm/tactic.cuh"
#include "gemm/woq.cuh"

namespace mbk {

// A stored int4 code u (mb_grouped_gemm_woq's unsigned form, the even column in the low nibble) that converts to the
// 16-bit value u - 8: CUTLASS's mixed-input mainloop converts its weight type with NumericArrayConverter, given here.
struct Uint4Minus8 : cutlass::uint4b_t {
  using cutlass::uint4b_t::uint4b_t;
};

}  // namespace mbk

template <> struct cutlass::sizeof_bits<mbk::Uint4Minus8> { static constexpr int value = 4; };

namespace mbk {

// u - 8 for 8 codes a 32-bit word, as 4 packed pairs: each byte's two nibbles placed into the mantissa of 128 (bf16) /
// 1024 (fp16) and 136 / 1032 subtracted, exactly (the same placement as gemm/woq.cuh's dequant_step).
template <typename T, int N>
struct Uint4Minus8Converter {
  using result_type = cutlass::Array<T, N>;
  using source_type = cutlass::Array<Uint4Minus8, N>;
  static constexpr bool kBf16 = std::is_same_v<T, cutlass::bfloat16_t>;
  static constexpr uint32_t kMagic = kBf16 ? 0x43004300u : 0x64006400u;     // 128 / 1024 in both halves
  static constexpr uint32_t kMagicPlus8 = kBf16 ? 0x43084308u : 0x64086408u;  // 136 / 1032

  CUTLASS_DEVICE static result_type convert(source_type const& s) {
    result_type out;
    // the mainloop converts whole 32-bit words of codes (its pack is 8 or more)
    static_assert(N % 8 == 0, "Uint4Minus8Converter converts 8 codes a 32-bit word");
    const uint32_t* in = reinterpret_cast<const uint32_t*>(&s);
    uint32_t* o = reinterpret_cast<uint32_t*>(&out);
    CUTLASS_PRAGMA_UNROLL
    for (int w = 0; w < N / 8; ++w) {
      const uint32_t v = in[w], vs = v >> 4;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 4; ++j) {
        const uint32_t p = (__byte_perm(v, vs, 0x0400u + 0x0101u * j) & 0x000f000fu) | kMagic;
        uint32_t d;
        if constexpr (kBf16) {
          asm("sub.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(p), "r"(kMagicPlus8));
        } else {
          asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(p), "r"(kMagicPlus8));
        }
        o[4 * w + j] = d;
      }
    }
    return out;
  }
  CUTLASS_DEVICE result_type operator()(source_type const& s) const { return convert(s); }
};

}  // namespace mbk

namespace cutlass {
template <FloatRoundStyle Round, int N>
struct NumericArrayConverter<bfloat16_t, mbk::Uint4Minus8, N, Round> : mbk::Uint4Minus8Converter<bfloat16_t, N> {};
template <FloatRoundStyle Round, int N>
struct NumericArrayConverter<half_t, mbk::Uint4Minus8, N, Round> : mbk::Uint4Minus8Converter<half_t, N> {};
}  // namespace cutlass

namespace mbk {
namespace {

struct WoqSm90Params {
  const void* A;        // [max_rows, k] in T
  const void* B;        // uint8 [E, n, k/2] 4-bit codes, or int8 / e5m2 [E, n, k]
  const void* scales;   // T [E, groups, n]
  const void* zeros;    // T [E, groups, n], int4 only: (8 - z) * s
  void* C;              // [max_rows, n] in T
  const int64_t* offsets;
  int num_experts;
  int n, k;
  int group;  // k per scale; 0: one per output row
  int kind;   // MB_WOQ_INT4, MB_WOQ_INT8 or MB_WOQ_E5M2
};

// The grouped mixed-input mainloop with the scale map carried in the scale-and-zero mode: copied to shared memory
// with the others, its address, shape and strides replaced where a CTA moves to another group, and fenced with
// them (the base class does all three for the zero points only). Other modes: the base class as it is.
template <class Base>
struct GroupedZeroPointMainloop : Base {
  static constexpr bool kFix = Base::KernelConversionMode == Base::ConversionMode::ConvertAndScaleWithZero;

  CUTLASS_DEVICE auto tensormaps_init(typename Base::Params const& p, typename Base::TensorMapStorage& smem,
                                      int32_t sm_count, int32_t sm_idx) {
    auto maps = Base::tensormaps_init(p, smem, sm_count, sm_idx);
    if constexpr (kFix) {
      auto from = cute::make_tensor(p.tma_load_scale.get_tma_descriptor(), cute::Int<1>{}, cute::Int<1>{});
      auto to = cute::make_tensor(cute::make_smem_ptr(&smem.smem_tensormap_scale), cute::Int<1>{}, cute::Int<1>{});
      if (cute::elect_one_sync()) cute::copy(cute::recast<cute::uint128_t>(from), cute::recast<cute::uint128_t>(to));
      __syncwarp();
    }
    return maps;
  }

  template <class... TMs, class ProblemShapeMNKL>
  CUTLASS_DEVICE void tensormaps_perform_update(typename Base::TensorMapStorage& smem, typename Base::Params const& p,
                                                cute::tuple<TMs...> const& maps, ProblemShapeMNKL shape, int32_t next) {
    Base::tensormaps_perform_update(smem, p, maps, shape, next);
    if constexpr (kFix) {
      if (cute::elect_one_sync()) {
        using Scale = typename Base::NonVoidElementScale;
        cute::tma_descriptor_replace_addr_in_shared_mem(smem.smem_tensormap_scale, p.ptr_S[next]);
        cute::array<uint32_t, 5> dims = {1, 1, 1, 1, 1};
        cute::array<uint64_t, 5> strides = {0, 0, 0, 0, 0};
        const uint32_t m = cute::get<0>(shape), k = cute::get<2>(shape);
        auto scales = cute::make_tensor(cutlass::gemm::collective::detail::get_logical_ptr(static_cast<Scale const*>(nullptr)),
                                        cute::make_shape(m, cute::ceil_div(k, p.chunk_size), cute::Int<1>{}), p.dS[next]);
        cute::detail::fill_tma_gmem_shape_stride(p.tma_load_scale, scales, dims, strides);
        for (uint64_t& s : strides) s = s * cute::sizeof_bits_v<Scale> / 8;
        cute::tma_descriptor_replace_dims_strides_in_shared_mem(smem.smem_tensormap_scale, dims, strides);
      }
    }
  }

  template <class... TMs>
  CUTLASS_DEVICE void tensormaps_cp_fence_release(typename Base::TensorMapStorage& smem,
                                                  cute::tuple<TMs...> const& maps) {
    Base::tensormaps_cp_fence_release(smem, maps);
    if constexpr (kFix) cute::tma_descriptor_cp_fence_release(cute::get<2>(maps), smem.smem_tensormap_scale);
  }

  template <class... TMs>
  CUTLASS_DEVICE void tensormaps_fence_acquire(cute::tuple<TMs...> const& maps) {
    Base::tensormaps_fence_acquire(maps);
    if constexpr (kFix) cute::tma_descriptor_fence_acquire(cute::get<2>(maps));
  }
};

// The epilogue a WoqWgmma runs, by a tag: WoqStore, CUTLASS's TMA store of C^T (below); WoqGated, GEMM1's gated
// activation; WoqGatedFp8, the same storing each value as its e4m3 quantization by a static scale, dequantized (W4AFP8,
// int4 weights only); WoqFinalize, GEMM2's finalize (gemm/woq_sm90_gated.cu and gemm/woq_sm90_finalize.cu specialize
// WoqEpilogueOf for them).
struct WoqStore {};
struct WoqGated {};
struct WoqGatedFp8 {};
struct WoqFinalize {};
template <class Epi, typename T, class TileShape, class ClusterShape>
struct WoqEpilogueOf;
template <typename T, class TileShape, class ClusterShape>
struct WoqEpilogueOf<WoqStore, T, TileShape, ClusterShape> {
  static constexpr int kAlign16 = 8;
  using type = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::ColumnMajor*, kAlign16,
      typename CutlassType<T>::type, cutlass::layout::ColumnMajor*, kAlign16,
      cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
};

// An epilogue of the transposed GEMM that writes its accumulator fragments itself (CUTLASS's surface as MoeEpilogue's,
// gemm/sm90_epilogue.cuh OwnStoresEpilogueSurface, for arguments Args holding `out`, `offsets` and `bias` [E, M] or
// null): the walk over a consumer thread's fragment, which hands Derived::slab each 64-row slab and wgmma column tile
// with the thread's place in it and the group's bias row. The gated and finalize epilogues are its Derived.
template <class Derived, typename T, class Args>
class WoqOwnStoresEpilogue : public OwnStoresEpilogueSurface<T, Args> {
  using Base = OwnStoresEpilogueSurface<T, Args>;

 public:
  using typename Base::Params;

  CUTLASS_HOST_DEVICE WoqOwnStoresEpilogue(Params const& params) : Base(params) {}

  // A thread's place in a slab (CUTLASS's wgmma CLayout_64xN, as MoeEpilogue describes it): it holds rows m0 and m0 + 8
  // at columns n0 + 8j and n0 + 8j + 1, values 4j + {0, 1} and 4j + {2, 3}, m0 % 16 = lane / 4 < 8 (the slabs start
  // at multiples of 16); M x N the group's (M weight rows, N token rows), row0 its first permuted row.
  struct Frag {
    int m0, n0, M, N;
    int64_t row0;
  };

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_mnk,
                                 BlockCoordMNKL blk_coord_mnkl, cute::Tensor<FrgEngine, FrgLayout> const& acc,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char*) {
    using namespace cute;
    static_assert(decltype(size<0>(acc))::value % 4 == 0, "a slab holds 8-column groups of four values");
    const int M = get<0>(problem_shape_mnkl);
    const int N = get<1>(problem_shape_mnkl);
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord_mnkl;
    Tensor coords = local_tile(make_identity_tensor(make_shape(M, N)), take<0, 2>(blk_shape_mnk),
                               make_coord(m_coord, n_coord));
    Tensor tc = tiled_mma.get_thread_slice(thread_idx).partition_C(coords);
    const int64_t row0 = this->params_.offsets[l_coord];
    const T* bias = this->params_.bias ? this->params_.bias + static_cast<int64_t>(l_coord) * M : nullptr;
    // The slab and column tile indices compile-time constants, so that every accumulator stays a register.
    for_each(make_int_sequence<decltype(size<1>(acc))::value>{}, [&](auto mi) {
      for_each(make_int_sequence<decltype(size<2>(acc))::value>{}, [&](auto ni) {
        const Frag f{get<0>(tc(_0{}, mi, ni)), get<1>(tc(_0{}, mi, ni)), M, N, row0};
        static_cast<Derived*>(this)->slab(acc(_, mi, ni), f, bias);
      });
    });
  }
};

// The tactic's tile: 128 weight rows (two consumer warpgroups of 64) x kTokens token rows (16 to 320) x 64 k, in
// clusters of kCluster CTAs along the weight rows, with the epilogue Epi. A TMA box holds at most 256 rows, and CUTLASS
// cuts a multicast operand's box by the cluster: the 320-row token tile runs in 2x1 clusters, each CTA loading 160 of
// its rows for both.
template <typename T, int KIND, int kTokens, int kCluster = 1, class Epi = WoqStore>
struct WoqWgmma {
  static_assert(kTokens <= 256 * kCluster, "a token tile past 256 rows needs a cluster to cut its TMA box");
  using Value = T;  // the activations' CUDA type
  using Element = typename CutlassType<T>::type;
  using Quant = std::conditional_t<KIND == MB_WOQ_INT4, Uint4Minus8,
                                   std::conditional_t<KIND == MB_WOQ_E5M2, cutlass::float_e5m2_t, int8_t>>;
  // {weights, scales[, zero terms]}: the operand CUTLASS converts, in the mode the tuple names.
  using Operand = std::conditional_t<KIND == MB_WOQ_INT4, cute::tuple<Quant, Element, Element>,
                                     cute::tuple<Quant, Element>>;
  using TileShape = cute::Shape<cute::_128, cute::Int<kTokens>, cute::_64>;
  using ClusterShape = cute::Shape<cute::Int<kCluster>, cute::_1, cute::_1>;
  using LayoutW = cutlass::layout::RowMajor;     // [n, k] per expert: K-major A
  using LayoutRows = cutlass::layout::ColumnMajor;  // [rows, k] row-major: K-major B
  static constexpr int kAlignW = 128 / cutlass::sizeof_bits<Quant>::value;
  static constexpr int kAlign16 = 8;

  // C^T [n, rows] column-major (C [rows, n] row-major) through CUTLASS's store, or the gated epilogue's own stores
  using Epilogue = typename WoqEpilogueOf<Epi, T, TileShape, ClusterShape>::type;
  static constexpr bool kStore = std::is_same_v<Epi, WoqStore>;
  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Operand, LayoutW*, kAlignW, Element, LayoutRows*,
      kAlign16, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using Mainloop = GroupedZeroPointMainloop<BuiltMainloop>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<TransposedOffsetsProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  using StrideW = typename Mainloop::InternalStrideA;
  using StrideRows = typename Mainloop::InternalStrideB;
  using StrideScale = typename Mainloop::NonVoidStrideScale;
  using StrideOut = typename Epilogue::InternalStrideD;
};

// The per-group pointer and stride arrays CUTLASS reads, in the workspace after its own part.
template <class G>
struct GroupArrays {
  using Element = typename G::Element;
  using Quant = typename G::Quant;
  const Quant** w;
  const Element** rows;
  const Element** scales;
  const Element** zeros;
  Element** out;
  typename G::StrideW* dw;
  typename G::StrideRows* drows;
  typename G::StrideScale* dscale;
  typename G::StrideOut* dout;

  static size_t round16(size_t b) { return (b + 15) / 16 * 16; }
  // Lays the arrays out from `base` (null: only the size is wanted); returns the bytes they take.
  static size_t carve(char* base, int experts, GroupArrays* a) {
    size_t at = 0;
    auto take = [&](auto*& field, size_t each) {
      using P = std::remove_reference_t<decltype(field)>;
      if (a) field = reinterpret_cast<P>(base + at);
      at += round16(each * experts);
    };
    GroupArrays dummy{};
    GroupArrays& t = a ? *a : dummy;
    take(t.w, sizeof(void*));
    take(t.rows, sizeof(void*));
    take(t.scales, sizeof(void*));
    take(t.zeros, sizeof(void*));
    take(t.out, sizeof(void*));
    take(t.dw, sizeof(typename G::StrideW));
    take(t.drows, sizeof(typename G::StrideRows));
    take(t.dscale, sizeof(typename G::StrideScale));
    take(t.dout, sizeof(typename G::StrideOut));
    return at;
  }
};

// One thread per expert: its weights, rows, scales, zero terms and outputs, and the (equal) strides.
template <class G>
__global__ void woq_sm90_group_arrays(GroupArrays<G> a, const uint8_t* w, const typename G::Element* rows,
                                      const typename G::Element* scales, const typename G::Element* zeros,
                                      typename G::Element* out, const int64_t* offsets, int experts, int n, int k,
                                      int groups) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= experts) return;
  const int64_t w_bytes = static_cast<int64_t>(n) * k * cutlass::sizeof_bits<typename G::Quant>::value / 8;
  a.w[e] = reinterpret_cast<const typename G::Quant*>(w + e * w_bytes);
  a.rows[e] = rows + offsets[e] * k;
  a.scales[e] = scales + static_cast<int64_t>(e) * groups * n;
  a.zeros[e] = zeros ? zeros + static_cast<int64_t>(e) * groups * n : nullptr;
  a.out[e] = out + offsets[e] * n;
  typename G::StrideW dw{};
  cute::get<0>(dw) = k;
  typename G::StrideRows drows{};
  cute::get<0>(drows) = k;
  typename G::StrideScale dscale{};
  cute::get<1>(dscale) = n;
  typename G::StrideOut dout{};
  if constexpr (G::kStore) cute::get<1>(dout) = n;  // the gated epilogue addresses its output itself
  a.dw[e] = dw;
  a.drows[e] = drows;
  a.dscale[e] = dscale;
  a.dout[e] = dout;
}

// The store epilogue's arguments: C^T through the per-group output pointers and strides.
template <class G>
typename G::Epilogue::Arguments woq_store_arguments(const GroupArrays<G>& a) {
  typename G::Epilogue::Arguments epi{{}, nullptr, nullptr, a.out, a.dout};
  epi.thread.alpha = 1.0f;
  epi.thread.beta = 0.0f;
  return epi;
}

template <class G>
typename G::Gemm::Arguments woq_sm90_args(const GroupArrays<G>& a, const int64_t* offsets, int experts, int n, int k,
                                          int chunk, int sm_count, const typename G::Epilogue::Arguments& epi) {
  cutlass::KernelHardwareInfo hw{};
  cudaGetDevice(&hw.device_id);
  hw.sm_count = sm_count;
  using Args = typename G::Mainloop::Arguments;
  // int8's scale-only mode types its (unused, null) zero pointer as void
  Args mainloop{a.w, a.dw, a.rows, a.drows, a.scales, a.dscale, chunk,
                reinterpret_cast<decltype(Args::ptr_Z)>(a.zeros)};
  typename G::Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGrouped,
                                   {experts, offsets, n, k},
                                   mainloop,
                                   epi,
                                   hw};
  return args;
}

// The workspace: CUTLASS's own part (rounded to 16 bytes), then the group arrays; `total` bytes in all.
struct WoqSm90Workspace {
  size_t cutlass_bytes, total;
};

template <class G>
WoqSm90Workspace woq_sm90_workspace(int experts, int sm_count) {
  const size_t cutlass_bytes = GroupArrays<G>::round16(G::Gemm::get_workspace_size(
      woq_sm90_args<G>(GroupArrays<G>{}, nullptr, experts, 128, 128, 128, sm_count, {})));
  return {cutlass_bytes, cutlass_bytes + GroupArrays<G>::carve(nullptr, experts, nullptr)};
}

// Runs G on p; epilogue(arrays) gives its epilogue's arguments (woq_store_arguments, or the gated ones).
template <class G, class EpiArgs>
mb_status run_woq_sm90(const WoqSm90Params& p, EpiArgs&& epilogue, void* workspace, size_t workspace_bytes,
                       cudaStream_t stream) {
  const int sm_count = mb::device_attribute(cudaDevAttrMultiProcessorCount);
  const WoqSm90Workspace need = woq_sm90_workspace<G>(p.num_experts, sm_count);
  if (!workspace || workspace_bytes < need.total)
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm woq sm90: workspace %zu bytes < %zu needed", workspace_bytes,
                need.total);
  GroupArrays<G> a{};
  GroupArrays<G>::carve(static_cast<char*>(workspace) + need.cutlass_bytes, p.num_experts, &a);
  using E = typename G::Element;
  const int groups = p.group ? p.k / p.group : 1;
  woq_sm90_group_arrays<G><<<(p.num_experts + 127) / 128, 128, 0, stream>>>(
      a, static_cast<const uint8_t*>(p.B), static_cast<const E*>(p.A), static_cast<const E*>(p.scales),
      static_cast<const E*>(p.zeros), static_cast<E*>(p.C), p.offsets, p.num_experts, p.n, p.k, groups);
  MB_TRY(mb::check_launch("woq_sm90_group_arrays"));
  typename G::Gemm gemm;
  auto args = woq_sm90_args<G>(a, p.offsets, p.num_experts, p.n, p.k, p.group ? p.group : p.k, sm_count,
                               epilogue(a));
  cutlass::Status st = gemm.initialize(args, workspace, stream);
  if (st == cutlass::Status::kSuccess) st = gemm.run(stream);
  const cudaError_t err = cudaGetLastError();
  if (st != cutlass::Status::kSuccess || err != cudaSuccess)
    return fail(MB_ERR_CUDA, "grouped gemm woq sm90: %s / %s", cutlassGetStatusString(st), cudaGetErrorString(err));
  return MB_OK;
}

// Every (dtype, kind, tile) an entry point has, as the tactic and the arguments name it, with the epilogue Epi.
template <class Epi, class F>
mb_status dispatch_woq_sm90(int dtype, int kind, int tile, F&& f) {
  auto by_tile = [&](auto tag, auto kind_tag) {
    using T = decltype(tag);
    constexpr int K = decltype(kind_tag)::value;
    switch (tile) {
      case MB_TILE_WOQ_128x16: return f(WoqWgmma<T, K, 16, 1, Epi>{});
      case MB_TILE_WOQ_128x32: return f(WoqWgmma<T, K, 32, 1, Epi>{});
      case MB_TILE_WOQ_128x64: return f(WoqWgmma<T, K, 64, 1, Epi>{});
      case MB_TILE_WOQ_128x160: return f(WoqWgmma<T, K, 160, 1, Epi>{});
      case MB_TILE_WOQ_128x192: return f(WoqWgmma<T, K, 192, 1, Epi>{});
      case MB_TILE_WOQ_128x224: return f(WoqWgmma<T, K, 224, 1, Epi>{});
      case MB_TILE_WOQ_128x256: return f(WoqWgmma<T, K, 256, 1, Epi>{});
      case MB_TILE_WOQ_128x320_C2: return f(WoqWgmma<T, K, 320, 2, Epi>{});
      default: return f(WoqWgmma<T, K, 128, 1, Epi>{});  // MB_TILE_WOQ_128x128
    }
  };
  auto by_kind = [&](auto tag) -> mb_status {
    if constexpr (std::is_same_v<Epi, WoqGatedFp8>) {  // W4AFP8's weights are int4
      if (kind != MB_WOQ_INT4)
        return fail(MB_ERR_UNSUPPORTED, "grouped gemm woq sm90: the e4m3-dequantized gated epilogue takes int4 "
                    "weights (W4AFP8), not kind %d", kind);
      return by_tile(tag, std::integral_constant<int, MB_WOQ_INT4>{});
    } else if (kind == MB_WOQ_E5M2) {  // MXFP4's re-encoding, exact under bf16 scales only
      if constexpr (std::is_same_v<decltype(tag), __nv_bfloat16>) {
        return by_tile(tag, std::integral_constant<int, MB_WOQ_E5M2>{});
      } else {
        return fail(MB_ERR_UNSUPPORTED, "grouped gemm woq sm90: e5m2 weights (kind %d) take dtype bf16 (%d)", kind,
                    MB_BF16);
      }
    } else {
      return kind == MB_WOQ_INT4 ? by_tile(tag, std::integral_constant<int, MB_WOQ_INT4>{})
                                 : by_tile(tag, std::integral_constant<int, MB_WOQ_INT8>{});
    }
  };
  return dtype == MB_BF16 ? by_kind(__nv_bfloat16{}) : by_kind(__half{});
}

// Every tile dispatch_woq_sm90 has: the tactics it takes and the kernels whose workspace it sizes.
constexpr int kWoqTiles[] = {MB_TILE_WOQ_128x16,  MB_TILE_WOQ_128x32,  MB_TILE_WOQ_128x64,
                             MB_TILE_WOQ_128x128, MB_TILE_WOQ_128x160, MB_TILE_WOQ_128x192,
                             MB_TILE_WOQ_128x224, MB_TILE_WOQ_128x256, MB_TILE_WOQ_128x320_C2};

// The most workspace any kernel of epilogue Epi takes for `experts` experts (every dtype, kind and tile): what its
// entry point's workspace query answers.
template <class Epi>
size_t woq_sm90_max_workspace(int experts, int sm_count) {
  size_t bytes = 0;
  for (int dtype : {MB_BF16, MB_FP16})
    for (int kind : {MB_WOQ_INT4, MB_WOQ_INT8, MB_WOQ_E5M2})
      for (int tile : kWoqTiles) {
        if (std::is_same_v<Epi, WoqGatedFp8> && kind != MB_WOQ_INT4) continue;  // int4 only
        if (kind == MB_WOQ_E5M2 && dtype != MB_BF16) continue;                  // bf16 only
        dispatch_woq_sm90<Epi>(dtype, kind, tile, [&](auto g) {
          bytes = std::max(bytes, woq_sm90_workspace<decltype(g)>(experts, sm_count).total);
          return MB_OK;
        });
      }
  return bytes;
}

bool woq_sm90_tactic_ok(const mb_gemm_tactic& t) {
  const bool woq_tile = std::find(std::begin(kWoqTiles), std::end(kWoqTiles), t.tile) != std::end(kWoqTiles);
  return t.kernel == MB_GEMM_WGMMA && woq_tile &&
         t.k_split == 0 && t.launch == MB_LAUNCH_PLAIN && t.output_l2 == MB_OUTPUT_L2_PLAIN;
}

mb_status check_woq_sm90(const WoqSm90Params& p, int64_t max_rows, int dtype, const mb_gemm_tactic& t,
                         const char* who = "grouped gemm woq sm90") {
  if (mb::device_attribute(cudaDevAttrComputeCapabilityMajor) != 9 ||
      mb::device_attribute(cudaDevAttrComputeCapabilityMinor) != 0)
    return fail(MB_ERR_UNSUPPORTED, "%s: needs a compute capability 9.0 device", who);
  if (dtype != MB_BF16 && dtype != MB_FP16)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: dtype %d is not bf16 (%d) or fp16 (%d)", who, dtype, MB_BF16, MB_FP16);
  if (p.kind != MB_WOQ_INT4 && p.kind != MB_WOQ_INT8 && p.kind != MB_WOQ_E5M2)
    return fail(MB_ERR_UNSUPPORTED, "%s: kind %d is not int4 (%d), int8 (%d) or e5m2 (%d)", who, p.kind, MB_WOQ_INT4,
                MB_WOQ_INT8, MB_WOQ_E5M2);
  if (p.kind == MB_WOQ_E5M2 && dtype != MB_BF16)
    return fail(MB_ERR_UNSUPPORTED, "%s: e5m2 weights (kind %d) take dtype bf16 (%d), not %d", who, p.kind, MB_BF16,
                dtype);
  if (!p.A || !p.B || !p.C || !p.scales || !p.offsets || p.num_experts <= 0 || max_rows < 0 || p.n <= 0 || p.k <= 0)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: null pointer or non-positive size", who);
  if ((p.kind == MB_WOQ_INT4) != (p.zeros != nullptr))
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: int4 weights take their zero terms (and only they)", who);
  // n: the output's and the scales' 16-byte TMA rows (8 elements); a last 128-row weight tile past n reads TMA's zero
  // fill and its rows are not stored. k: whole 64-k tiles.
  if (p.n % 8 != 0 || p.k % 64 != 0)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: n (%d) must be a multiple of 8 and k (%d) of 64", who, p.n, p.k);
  if (!(p.group == 0 || ((p.group == 64 || p.group == 128) && p.k % p.group == 0)))
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: group %d with k %d (0, or 64 or 128 dividing k)", who, p.group, p.k);
  if (!aligned16(p.A) || !aligned16(p.B) || !aligned16(p.C) || !aligned16(p.scales) ||
      (p.zeros && !aligned16(p.zeros)))
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: A, B, C, scales and zeros must be 16-byte aligned", who);
  if (!woq_sm90_tactic_ok(t))
    return fail(MB_ERR_UNSUPPORTED, "%s: no kernel for tactic %s %s (k_split %d, launch %d, output_l2 %d): the wgmma "
                "kernel on a woq tile (woq128x16, woq128x32, woq128x64, woq128x128, woq128x160, woq128x192, "
                "woq128x224, woq128x256, woq128x320c2), "
                "launched plainly, with plain outputs", who,
                kernel_name(t.kernel), tile_name(t.tile), t.k_split, t.launch, t.output_l2);
  // The 2x1 clusters' weight tiles in pairs: with an odd count of 128-row weight tiles the outputs were wrong on the
  // H200 (n 2880 and 5760 at k 2880; int4 at n 128), every even count right.
  if (t.tile == MB_TILE_WOQ_128x320_C2 && (p.n + 127) / 128 % 2 != 0)
    return fail(MB_ERR_UNSUPPORTED, "%s: tile woq128x320c2 runs in 2x1 clusters and takes an even count of 128-row "
                "weight tiles (n %d makes %d)", who, p.n, (p.n + 127) / 128);
  return MB_OK;
}

}  // namespace

// The gated and finalize kernels' workspace bytes (gemm/woq_sm90_gated.cu, gemm/woq_sm90_finalize.cu), which
// mb_grouped_gemm_woq_sm90_workspace covers too.
size_t woq_sm90_gated_workspace(int num_experts, int sm_count);
size_t woq_sm90_finalize_workspace(int num_experts, int sm_count);

}  // namespace mbk
