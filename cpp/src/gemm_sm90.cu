// Hopper (sm_90a) grouped GEMM over expert segments: CUTLASS 3 ptr-array TMA warp-specialized
// kernels (wgmma, grouped problem shapes read from the expert offsets) whose loads run on fixed TMA
// descriptors over all experts' rows and weights (gemm_sm90_static_maps.cuh), with our own no-smem
// epilogue that does a plain store (+bias), GEMM1's gated activation (act(gate, up) of an
// interleaved W1, written at half width), or the MoE finalize (unpermute + top-k weight + bias,
// atomically reduced into the token's output row).
//
// No host sync and no setup launch: CUTLASS's grouped problem shape is read on the device straight
// from expert_first_token_offset (OffsetsProblemShape), the loads find each group's rows and weights
// from the same offsets, and CUTLASS is given no host copy of the shapes (it then sizes a persistent
// grid from the SM count), so a call is one CUDA-graph capturable launch. Up to 64 rows per expert the
// finalize GEMM is launched after a trigger (programmatic dependent launch, run_wgmma): it sets up under
// GEMM1's last tiles.
//
// Path rule (inside each entry point): average rows per expert = ceil(max_rows / E).
//   <= 8 : the decode kernel of gemm_decode.cu (swap-AB mma.sync, weights streamed straight into
//          registers). Decode shapes are weight-bandwidth bound; a 128-row wgmma tile mostly
//          multiplies padding. Measured on the H200 (bf16, bench/decode_probe.py, L2 flushed):
//          1 token of Mixtral/Qwen3/DeepSeek-V2-Lite GEMM1 121-125 / 20 / 25 us against 148 / 25
//          / 29 us for the mma.sync tiles of gemm_common.cuh (which it replaced) and 140 / 35 / 38
//          us for wgmma; 16 tokens within +-3% of mma.sync except Qwen3 (10% faster).
//   else : the CUTLASS wgmma kernel: for the plain store, pingpong 64x128 tiles up to 32 average
//          rows per expert, else pingpong 64x256 in 2x1 clusters (run as paired units,
//          gemm_sm90_pairs.cuh; 64x192 where narrow_columns_fit and the weights are row-major, since
//          its 96-row multicast slices do not tile MB_WEIGHTS_BLOCKED64); the gated epilogue the same but
//          single-CTA pingpong 64x256 from 33 to 1024 rows; the finalize epilogue pingpong 64x128 up
//          to 64 rows, else 64x256 (measurements at WgmmaTile below).
// MB_SM90_GEMM_PATH=decode|mma|wgmma and
// MB_SM90_WGMMA_TILE=coop128x256|pingpong64x256|pingpong64x128|pingpong64x256c2|pingpong64x192c2 in the
// environment force a path / tile (bench/gemm_bench.py --paths and the tests use them; mma is the
// Ampere tile kernel, kept reachable as the baseline the decode kernel is measured against);
// MB_SM90_LAUNCH=plain launches every wgmma GEMM plainly and =unplaced never by placement (launch_kind).
// MB_SM90_OUTPUT_L2=plain writes the gated and finalize outputs without their L2 evict_last policy
// (outputs_evict_last).
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <string.h>

#include "gemm_common.cuh"

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/detail.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "gemm_sm90_pairs.cuh"
#include "gemm_sm90_placement.cuh"
#include "gemm_sm90_static_maps.cuh"

namespace mbk {
namespace {

// CUTLASS's grouped problem shape (the interface of cutlass::gemm::GroupProblemShape) computed from
// the expert offsets: group g is (offsets[g + 1] - offsets[g]) x n x k. CUTLASS's GroupProblemShape
// reads a per-group shape array, which a one-block kernel had to write before every GEMM (a graph
// node of its own, ~1.5 us with its gap, twice per layer), along with pointer arrays from which the
// producer warp derived each group's first row (a dependent load and a 64-bit division per new group);
// the scheduler reads these two offsets instead, and StaticMapMainloop the first. The GEMMs alone, this
// against the array version (bench/gemm_rate_probe.py --gated, 4096 tokens, H200, two processes of each
// alternated), gained more than the launch: DeepSeek-V2-Lite GEMM1 / GEMM2 452-453 / 251-257 us vs 470 /
// 275-276, Qwen3-30B-A3B 360-368 / 227-228 vs 382-383 / 243-247, GPT-OSS-20B 847-860 / 452-462 vs 871-874 /
// 468-481 (docs/measured/group_arrays_ab_4096.json; whole layers of both libraries bit-identical at 256
// and 4096 tokens, one process). Which part accounts for it was not isolated; caching the offsets across
// the producer warp (a shuffle instead of a load per new group) changed nothing and was not kept.
struct OffsetsProblemShape {
  using UnderlyingProblemShape = cute::Shape<int, int, int>;
  int32_t num_groups = 1;
  const int64_t* offsets = nullptr;  // device, [num_groups + 1]
  int n = 0, k = 0;

  CUTLASS_HOST_DEVICE int32_t groups() const { return num_groups; }
  CUTLASS_DEVICE UnderlyingProblemShape const get_problem_shape(int32_t g) const {
    return {static_cast<int>(offsets[g + 1] - offsets[g]), n, k};
  }
  // No host copy: CUTLASS then sizes a persistent grid and skips its host-side shape checks.
  CUTLASS_HOST_DEVICE UnderlyingProblemShape const get_host_problem_shape(int32_t = 0) const { return {}; }
  CUTLASS_HOST_DEVICE bool is_host_problem_shape_available() const { return false; }
};
using ProblemShape = OffsetsProblemShape;
using InternalStrideD = cute::remove_pointer_t<cutlass::detail::TagToStrideC_t<cutlass::layout::RowMajor*>>;

template <typename T> struct CutlassType;
template <> struct CutlassType<__nv_bfloat16> { using type = cutlass::bfloat16_t; };
template <> struct CutlassType<__half> { using type = cutlass::half_t; };

// 4x4 transpose across a lane quad: lane q holds v[s] (s = 0..3); afterwards it holds v[p] = lane
// p's former v[q]. Two butterfly rounds (partner q ^ 2, then q ^ 1), each trading two values chosen by
// the lane's own bit, so every step is a shuffle or a select: no value is indexed at run time. (The
// earlier version picked v[k] for run-time k through chains of compares that nvcc compiled into
// branches, ~140 instructions per 16-byte group, which left the finalize epilogue longer than the
// other warpgroup's mainloop on short-K GEMMs.)
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
// An L2 policy under which the written lines are evicted after the others (evict_last) in the whole L2.
__device__ __forceinline__ uint64_t l2_evict_last() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// Operator-style epilogue run by CUTLASS's Sm90TmaWarpSpecializedAdapter (the same hook as its
// DefaultEpilogueArray): each consumer thread gets its wgmma accumulator fragment and the
// fragment's (row, column) coordinates in the current group, and writes them itself.
template <typename T, int kEpi>
class MoeEpilogue {
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

  struct Arguments {
    const T* bias = nullptr;        // [E, N] or null
    T* out = nullptr;               // plain: [rows, N]; finalize: [tokens, N], zeroed by the caller
    const int64_t* offsets = nullptr;
    const int32_t* permuted_to_unpermuted = nullptr;
    const float* permuted_weights = nullptr;
    int top_k = 1;
    int activation = MB_ACT_SWIGLU;  // gated epilogue: act(gate, up), gate_up_interleaved W1 (gated_row)
    float swiglu_alpha = 1.f;
    float swiglu_limit = 0.f;
    bool evict_last = false;  // the gated stores and finalize atomics under L2 evict_last (outputs_evict_last)
  };
  using Params = Arguments;

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

  CUTLASS_HOST_DEVICE MoeEpilogue(Params const& params) : params_(params) {}

  CUTLASS_DEVICE bool is_source_needed() { return false; }

  // The accumulator layout every mode relies on (CUTLASS's wgmma CLayout_64xN, as partitioned for a
  // thread of any of the tiles here): value i = v0 + 2*v1 + 4*j (v0, v1 in {0, 1}, j < size(acc) / 4) is
  // element (m0 + 8*v1, n0 + v0 + 8*j) of the tile, (m0, n0) being the thread's first element. So a
  // thread has two rows (h = v1) and, per row, one column pair in each 8-column group j, with n0 even.
  // The modes below address everything from (m0, n0) with compile-time offsets and test rows and
  // columns with predicates, not branches: one pingpong warpgroup's epilogue must fit under the other's
  // mainloop, and with one warp per scheduler nothing hides its latency. Before, per-element
  // coordinates (CuTe's identity-tensor partition: a 64-bit address and a branch per column pair) and a
  // branchy transpose made the finalize epilogue longer than a short-K mainloop: Qwen3-30B-A3B's GEMM2
  // at 4096 tokens took 323 us with it, 202 us after, 172 us with no epilogue at all (H200, L2 flushed,
  // pingpong 64x256, old and new library interleaved in one process; scratch probe); DeepSeek-V2-Lite
  // 286 -> 239 (216 with none). The gated GEMM1 gained 2-3% (Qwen3 366 -> 358, DeepSeek 452 -> 438,
  // GPT-OSS-20B 871 -> 852, Mixtral-8x7B 3014 -> 2936 us).
  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_mnk,
                                 BlockCoordMNKL blk_coord_mnkl, cute::Tensor<FrgEngine, FrgLayout> const& acc,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char*) {
    using namespace cute;
    static_assert(decltype(size(acc))::value % 16 == 0, "accumulator fragment holds groups of four 8-column pairs");
    const int M = get<0>(problem_shape_mnkl);
    const int N = get<1>(problem_shape_mnkl);
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord_mnkl;
    Tensor coords = local_tile(make_identity_tensor(make_shape(M, N)), take<0, 2>(blk_shape_mnk),
                               make_coord(m_coord & ~kSplitTileFlag, n_coord));
    Tensor tc = tiled_mma.get_thread_slice(thread_idx).partition_C(coords);
    const Frag f{get<0>(tc(0)), get<1>(tc(0)), M, N, params_.offsets[l_coord]};
    const T* bias = params_.bias ? params_.bias + (int64_t)l_coord * N : nullptr;
    // One branch per tile, not per element, for the bias and the activation.
    if constexpr (kEpi == EPI_FINALIZE) {
      return bias ? finalize_tile<true>(acc, f, bias) : finalize_tile<false>(acc, f, bias);
    } else if constexpr (kEpi == EPI_GATED) {
      switch (params_.activation) {
        case MB_ACT_GEGLU: return bias ? gated_tile<MB_ACT_GEGLU, true>(acc, f, bias)
                                       : gated_tile<MB_ACT_GEGLU, false>(acc, f, bias);
        case MB_ACT_SWIGLU_CLAMP: return bias ? gated_tile<MB_ACT_SWIGLU_CLAMP, true>(acc, f, bias)
                                              : gated_tile<MB_ACT_SWIGLU_CLAMP, false>(acc, f, bias);
        default: return bias ? gated_tile<MB_ACT_SWIGLU, true>(acc, f, bias)
                             : gated_tile<MB_ACT_SWIGLU, false>(acc, f, bias);
      }
    } else {
      return bias ? store_tile<true>(acc, f, bias) : store_tile<false>(acc, f, bias);
    }
  }

 private:
  // A thread's place in the tile: its first element (m0, n0), the group's M x N and first permuted row.
  struct Frag {
    int m0, n0, M, N;
    int64_t row0;
    __device__ __forceinline__ bool row_in(int h) const { return m0 + 8 * h < M; }
    __device__ __forceinline__ bool col_in(int j) const { return n0 + 8 * j < N; }  // N even: n + 1 fits too
    // Lane q's whole 8-column group of block g after quad_group (N is a multiple of 8).
    __device__ __forceinline__ bool group_in(int g, int q) const { return n0 + 6 * q + 32 * g < N; }
  };

  // (acc(i) + bias, acc(i + 1) + bias) for the column pair at n of group j, as floats (the bias read
  // only for columns in range).
  template <bool kBias, class Acc>
  CUTLASS_DEVICE static float2 biased(Acc const& acc, int i, const T* bias, Frag const& f, int j) {
    float2 v{acc(i), acc(i + 1)};
    const int n = f.n0 + 8 * j;
    if (kBias && f.col_in(j)) {
      const float2 b = Pair<T>::to_float2(*reinterpret_cast<const typename Pair<T>::type*>(bias + n));
      v.x += b.x;
      v.y += b.y;
    }
    return v;
  }

  // Row h's column pairs of the four 8-column groups 4g..4g+3 ((acc + bias), times `scale` if kScaled),
  // packed, then transposed across the lane quad: afterwards lane q holds group 4g + q whole, columns
  // n0 - 2q + 8q + 32g = n0 + 6q + 32g onwards (values 4 * (4g + s) + 2h are row h's pairs in those
  // groups, and a quad holds the four groups whole). Every lane of the quad must call it, in range or not.
  template <bool kBias, bool kScaled, class Acc>
  CUTLASS_DEVICE static void quad_group(Acc const& acc, Frag const& f, const T* bias, int g, int h, float scale,
                                        uint32_t (&v)[4]) {
    using P2 = Pair<T>;
    CUTLASS_PRAGMA_UNROLL
    for (int s = 0; s < 4; ++s) {
      const int j = 4 * g + s;
      float2 x = biased<kBias>(acc, 4 * j + 2 * h, bias, f, j);
      if constexpr (kScaled) x = {scale * x.x, scale * x.y};
      const typename P2::type packed = P2::make(x.x, x.y);
      v[s] = *reinterpret_cast<const uint32_t*>(&packed);
    }
    quad_transpose(v, threadIdx.x & 3);
  }

  // The plain store: out[row0 + m, n] = acc (+ bias), each lane's whole 8-column group (quad_group)
  // written with one 16-byte store. Against one 4-byte store per pair, GEMM2 alone at 4096
  // tokens (H200, L2 flushed, interleaved; scratch probe): Qwen3-30B-A3B 201.6 vs 226.8 us, DeepSeek-
  // V2-Lite 240.8 vs 252.5, GPT-OSS-20B 473.6 vs 482.4, Mixtral-8x7B 1464.8 vs 1473.1. (With the earlier
  // transpose, whose run-time indexing compiled into branches, it had been 40% slower on Qwen3.)
  template <bool kBias, class Acc>
  CUTLASS_DEVICE void store_tile(Acc const& acc, Frag const& f, const T* bias) {
    const int q = threadIdx.x & 3;
    T* row[2];
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) row[h] = params_.out + (f.row0 + f.m0 + 8 * h) * f.N + f.n0 + 6 * q;
    CUTLASS_PRAGMA_UNROLL
    for (int g = 0; g < cute::size(acc) / 16; ++g) {
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        uint32_t v[4];
        quad_group<kBias, false>(acc, f, bias, g, h, 1.f, v);
        if (f.row_in(h) && f.group_in(g, q))
          store_16B(row[h] + 32 * g, v, false, 0);
      }
    }
  }

  // The finalize epilogue: each row's (acc + bias) * routing weight, atomically added into its
  // token's output row, each lane's whole 8-column group (quad_group) with one 16-byte vector atomic
  // instead of four 4-byte ones.
  // Each row's weight and output row are read once per tile, before the column loop. Read inside it
  // (once per 8-column group, after each atomic, whose memory clobber forbade reusing the loads) they
  // put two dependent global loads in front of every atomic: Qwen3-30B-A3B's GEMM2 at 4096 tokens took
  // 397 us with them and 323 without (scratch probe, GEMM2 alone, L2 flushed, H200, pingpong 64x256).
  template <bool kBias, class Acc>
  CUTLASS_DEVICE void finalize_tile(Acc const& acc, Frag const& f, const T* bias) {
    const int q = threadIdx.x & 3;
    float w[2];
    T* dst[2];
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      w[h] = 0.f;
      dst[h] = nullptr;
      if (f.row_in(h)) {
        const int64_t p = f.row0 + f.m0 + 8 * h;
        w[h] = params_.permuted_weights[p];
        dst[h] = params_.out + (int64_t)(params_.permuted_to_unpermuted[p] / params_.top_k) * f.N + f.n0 + 6 * q;
      }
    }
    const uint64_t policy = params_.evict_last ? l2_evict_last() : 0;
    CUTLASS_PRAGMA_UNROLL
    for (int g = 0; g < cute::size(acc) / 16; ++g) {
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        uint32_t v[4];
        quad_group<kBias, true>(acc, f, bias, g, h, w[h], v);
        if (dst[h] != nullptr && f.group_in(g, q)) red_add_16B<T>(dst[h] + 32 * g, v, params_.evict_last, policy);
      }
    }
  }

  // The gated epilogue: W1 interleaved in blocks of 8 rows (gated_row), so GEMM column c with
  // c % 16 < 8 is feature (c / 16) * 8 + c % 8's gate and column c + 8 its up projection. Tiles start
  // at multiples of 16 columns (the tile widths are 128, 192 and 256) and n0 % 16 = 2 * (lane % 4) < 8,
  // so for even j the pair at n0 + 8j is a gate pair and group j + 1 (values 4 further on) holds its up
  // pair: each thread has both halves of its features. A lane quad's act(gate, up) pairs of gate group j
  // are 8 consecutive features of the [rows, N / 2] activation; four gate groups' pairs are transposed
  // across the quad (quad_transpose), so each lane writes one group whole with one 16-byte store.
  // Against one 4-byte store per pair (each filling half of a 32-byte sector), GEMM1 alone at 4096 tokens
  // (H200, bench/lib_ab_probe.py, outputs bit-identical): Qwen3-30B-A3B 386.7 -> 383.7 us, DeepSeek-V2-
  // Lite 452.7 -> 451.0, GPT-OSS-20B 834.2 -> 834.6, Mixtral-8x7B 2910.0 -> 2939.9: ~1% where any, so the
  // stores' share of this epilogue (README: 364.7 us with them, 341.7 without) is not the half sectors.
  // Nor the DRAM writes, and staging the tile in shared memory for one bulk copy per row (tried
  // 2026-11-22: bit-identical, 0-1% slower) did not take it back; README, "The gated epilogue's share".
  template <int ACT, bool kBias, class Acc>
  CUTLASS_DEVICE void gated_tile(Acc const& acc, Frag const& f, const T* bias) {
    using P2 = Pair<T>;
    static_assert(decltype(cute::size(acc))::value % 32 == 0, "blocks of four gate groups");
    const int inter = f.N / 2;
    const float alpha = params_.swiglu_alpha, limit = params_.swiglu_limit;
    const int q = threadIdx.x & 3;
    const int nq = f.n0 - 2 * q;  // the quad's first column, a multiple of 16; its first feature is nq / 2
    const uint64_t policy = params_.evict_last ? l2_evict_last() : 0;
    T* row[2];
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) row[h] = params_.out + (f.row0 + f.m0 + 8 * h) * inter + nq / 2 + 8 * q;
    CUTLASS_PRAGMA_UNROLL
    for (int g = 0; g < cute::size(acc) / 32; ++g) {  // gate groups j = 8g + 2s, s < 4
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        uint32_t v[4];
        CUTLASS_PRAGMA_UNROLL
        for (int s = 0; s < 4; ++s) {
          const int j = 8 * g + 2 * s, i = 4 * j + 2 * h;
          const float2 gate = biased<kBias>(acc, i, bias, f, j);
          const float2 up = biased<kBias>(acc, i + 4, bias, f, j + 1);
          const typename P2::type packed =
              P2::make(mb::act_apply<ACT>(gate.x, up.x, alpha, limit), mb::act_apply<ACT>(gate.y, up.y, alpha, limit));
          v[s] = *reinterpret_cast<const uint32_t*>(&packed);
        }
        quad_transpose(v, q);
        // Lane q now holds gate group 8g + 2q whole: features nq / 2 + 32g + 8q onwards, from columns
        // nq + 64g + 16q (N is a multiple of 16: its up columns are in range too).
        if (f.row_in(h) && nq + 64 * g + 16 * q < f.N) store_16B(row[h] + 32 * g, v, params_.evict_last, policy);
      }
    }
  }

  Params params_;
};

// Mainloop tiles. Measured on the H200 (bench/gemm_bench.py --paths, 256 and 4096 tokens of the
// four bench shapes) against cooperative 128x128 and pingpong 128x128, which were dropped (pingpong
// 128x128 retimed on the H100 in whole layers, 2026-11-27: ahead only at points no rule separates; README).
//   coop 128x256    : two consumer warpgroups share one 128x256 tile; the most FLOPs per byte
//                     loaded into shared memory. No rule picks it now; it stays reachable through
//                     MB_SM90_WGMMA_TILE as the probes' baseline (README, "What bounds the 4096-token GEMMs").
//                     Tried and dropped (2026-11-22): in a tile whose upper 64 rows lie past the expert's
//                     rows, that warpgroup skipped its wgmma (still waiting for and releasing every stage;
//                     the scheduler's valid_warpgroup_in_work_tile hook recorded each tile for the
//                     consumer), so an expert would cost the MMA of 64-row tiles with its weights loaded
//                     once per 128 rows. Outputs unchanged; on Qwen3-30B-A3B at 4096 tokens the gated
//                     GEMM1 slowed to 403-404 us from 370-372 (auto 348-352) while the finalize GEMM2
//                     gained (223-225 from 243; auto 204-210); DeepSeek-V2-Lite even (bench/gemm_rate_probe.py
//                     --gated --finalize, H200, libraries alternated twice). Neither beat the rule's tiles.
//   pingpong 64x256 : each consumer warpgroup owns a 64-row tile and one's epilogue runs under the
//                     other's mainloop. Half the row padding per expert of a 128-row tile (a random-
//                     routing expert with ~256 rows pads ~1/5 at 128-row tiles, ~1/9 at 64) and a hidden
//                     epilogue. The finalize epilogue runs it past 64 rows (kFinalizeNarrowMaxAvgRows):
//                     with its row loads hoisted (finalize_tile) it beat cooperative 128x256 at 1024 and
//                     4096 tokens on DeepSeek-V2-Lite, GPT-OSS-20B and Mixtral (GEMM2 alone, L2 flushed,
//                     H200, 4096 tokens: 278 vs 309 us, 444 vs 537, 1427 vs 1488) and trailed it on
//                     Qwen3-30B-A3B (323 vs 314); with the lean epilogue (MoeEpilogue) Qwen3 runs it in
//                     202 us. (Before the hoisting, cooperative looked better, 350 vs 397 us on Qwen3.)
//                     Its 2x1-cluster form, retimed with the lean epilogue, stays behind (Qwen3 212 vs
//                     205 us, DeepSeek-V2-Lite 251 vs 250, Mixtral 1466 vs 1450).
//   ... in 2x1 clusters (pingpong64x256c2): the two CTAs of a cluster take neighbouring row tiles of
//                     one expert and TMA-multicast the weight tile they share, so each pulls half of
//                     it from L2 (every row tile of an expert re-reads the expert's weights; the gain
//                     grows with the row tiles per expert, which fits L2 traffic being the bound, but
//                     that was not profiled). Timed interleaved against the single-CTA tiles
//                     (bench/gemm_rate_probe.py, L2 flushed; docs/measured/gemm_rate_probe_*.json),
//                     plain store, 4096 tokens, vs the better of 64x256 / coop 128x256: DeepSeek-V2-Lite
//                     GEMM1 557 vs 590 us and GEMM2 299 vs 324, GPT-OSS GEMM1 989 vs 1054, Mixtral GEMM1
//                     2979 vs 3217; even on GPT-OSS GEMM2 (523 vs 516) and Qwen3 (455 vs 461, 278 vs 280).
//                     256 tokens: Mixtral GEMM1 even, GEMM2 249 vs 293 (64 rows per expert), and 2-8%
//                     slower than 64x128 at 16-32 rows. So the plain store uses it past 32 rows per
//                     expert. Cooperative 128x256 in 2x1 clusters lost 10-23% at 4096 tokens (an earlier
//                     interleaved run). For the finalize epilogue it gave no clear gain (Mixtral, whole
//                     layer, two runs: 784 vs 786 us at 256 tokens, 5098 vs 5164 at 4096; after its row
//                     loads were hoisted, GEMM2 alone at 4096 tokens 0.5-3% slower than single-CTA 64x256
//                     on all four shapes, e.g. Qwen3 333 vs 323 us), so that keeps its tile. CUTLASS's
//                     group scheduler rounds each expert's row tiles up to whole clusters, so an expert
//                     with an odd tile count computes one empty tile (routed vs evenly split rows:
//                     GPT-OSS GEMM1 957 vs 855 us). Moving each odd last tile into a
//                     second, single-CTA launch lost 5-12% at 4096 tokens (Qwen3 GEMM1 535 vs 476 us):
//                     that launch's two or three waves cost more than the empty tiles. Not kept. Instead
//                     PairedTileScheduler (gemm_sm90_pairs.cuh) runs an odd last row tile as a split unit
//                     (the pair's two CTAs on two column tiles, no multicast), so no tile is empty unless
//                     the column-tile count is odd too. Library with / without it, alternated twice
//                     (bench/gemm_rate_probe.py, 4096 tokens, plain store, this tile): Mixtral GEMM1 2870
//                     vs 2914-2986 us and GEMM2 1525 vs 1541-1563, GPT-OSS GEMM1 939-943 vs 950-962,
//                     Qwen3 GEMM1 468-470 vs 466-482 and GEMM2 279-280 vs 286, DeepSeek-V2-Lite even
//                     (GEMM2 297-303 vs 291-298); 8192 tokens, gated epilogue: GPT-OSS 1778-1786 vs
//                     1826-1852, Qwen3 738-744 vs 764-787, DeepSeek-V2-Lite 910-933 vs 932-995, but Qwen3
//                     GEMM2 (plain, K = 768) 513-519 vs 495-501. Whole layers at 4096 tokens (graph
//                     replay, two processes each of python -m moe_build.bench --tokens 4096 --variants
//                     ours --iters 30): GPT-OSS 1544-1551 vs 1575-1602 us, Mixtral 4639-4657
//                     vs 4809-4833, Qwen3 741-750 vs 751-755, DeepSeek-V2-Lite 833-856 vs 839-861.
//                     Wider clusters lost too (bench/gemm_rate_probe.py, 4096 tokens, plain store, vs this
//                     tile): pingpong 64x256 in 1x2 clusters (the A tile multicast over two column tiles;
//                     2026-11-22, --gated / --finalize against the rule's tiles, outputs correct) 25-52%
//                     (Qwen3 gated GEMM1 488 vs 352 us, finalize GEMM2 256-259 vs 206; DeepSeek-V2-Lite and
//                     Mixtral alike), in 2x2 clusters 5-12% (Qwen3 GEMM1 504 vs 459 us), cooperative
//                     128x256 in 1x2 clusters (the A tile multicast instead) 0-11%, in 2x2 clusters 12-28%;
//                     pingpong 64x192 in 2x1 clusters, which tiles GPT-OSS's N = 2880 without padding, won
//                     only there (GEMM2 583 vs 600 us) and lost 4-44% elsewhere; it runs only where
//                     narrow_columns_fit (below).
//                     CUTLASS's group scheduler order was left at its default (along M, no swizzle): along N
//                     lost 3-46% on the gated GEMM1 (GPT-OSS 1024 tokens 551 vs 378 us) and swizzle 2 or 4
//                     moved GEMM1 / GEMM2 by under 2% either way (4096 and 1024 tokens, all four shapes).
//   pingpong 64x128 : twice the tiles of 64x256. With few rows per expert a GEMM streams the weights
//                     once and is bandwidth-bound, and more, smaller tiles even out the last wave:
//                     256 tokens (16-32 rows per expert) of Qwen3 / DeepSeek-V2-Lite / GPT-OSS run
//                     GEMM1 2-3% and GEMM2 1-2% faster than 64x256 (bench/decode_probe.py --tokens
//                     256 --variants wgmma:tile=..., L2 flushed, docs/measured/wgmma_tile_probe.txt;
//                     e.g. Qwen3 GEMM1 217.6 vs 218.9-224.5 us). Whole layers, graph-replayed in
//                     alternation with 64x256 forced (bench/kernel_profile.py): DeepSeek-V2-Lite 4 us and
//                     GPT-OSS 5 us faster, Qwen3 even. At 64 rows (Mixtral 256) it loses GEMM1 by 20%, at
//                     4096 tokens by 25-45%. The finalize epilogue takes it up to 64 rows (kFinalizeNarrowMaxAvgRows).
// Tried and dropped: a weights x tokens tile (64 weight rows on wgmma's M, each tile's tokens on N at a
// run-time width), bit-identical but 34% slower at full width and slower still with short tail tiles
// (H200, Qwen3-30B-A3B GEMM1, 256 rows per expert: 443 vs 330 us; README, "the swapped tile"; branch
// swap-ab-experiment).
enum WgmmaTile {
  WG_COOP_128x256 = 0,
  WG_PINGPONG_64x256 = 1,
  WG_PINGPONG_64x128 = 2,
  WG_PINGPONG_64x256_C2 = 3,
  WG_PINGPONG_64x192_C2 = 4
};
constexpr int64_t kNarrowMaxAvgRows = 32;             // plain store: pingpong 64x128, else 64x256 cluster 2x1
// The finalize epilogue runs pingpong 64x128 up to this many average rows per expert, else 64x256. With
// an expert's rows in one or two row tiles the GEMM streams the weights about once, and twice the column
// tiles fill the SMs better where there are few experts: Mixtral-8x7B at 256 tokens (64 rows per expert,
// 8 x 16 tiles of 64x256 for 132 SMs) ran the finalize GEMM2 in 259.4 us against 276.4, while the other
// bench shapes at 256-1024 tokens with at most 64 rows per expert moved by -1.8 to +1.6 us; from 96 rows
// the wider tile wins (Mixtral 512 tokens 299.7 vs 313.3 us, GPT-OSS-20B 1024 tokens 176.6 vs 198.2; 4096
// tokens 16-26%). H200, bench/gemm_rate_probe.py --finalize --tiles auto,pingpong64x128,pingpong64x256c2,
// L2 flushed, interleaved; the 2x1 cluster was within 3 us of 64x128 at <= 64 rows but lost 13% at Mixtral
// 512 tokens.
constexpr int64_t kFinalizeNarrowMaxAvgRows = 64;
// The finalize GEMM is launched after a trigger (its CTAs set up under GEMM1's last tiles) up to this many
// average rows per expert, else plainly. Measured both ways (bench/kernel_profile.py graph replay, one
// library with a run-time switch, alternated processes, 2-3 rounds): at 256 tokens (16-64 rows) the early
// launch gains 3-7 us on the H200 (Qwen3-30B-A3B 306.0-306.8 vs 310.0-310.3, GPT-OSS-20B 393.9-394.6 vs
// 401.0-401.5) and 1-4 on the H100; at 4096 tokens it is even to 1-2% behind on the H200 (Qwen3 613.3-624.8
// vs 614.4-615.2, Mixtral-8x7B 4462-4596 vs 4441-4498, GPT-OSS 1426-1456 vs 1419-1442) and far behind on the
// H100 (Qwen3 779.3-787.2 vs 710.8-716.0, GPT-OSS 1751-1772 vs 1620-1679, Mixtral 5914-6028 vs 5566-5585):
// its tiles lost the plain launch's placement (gemm_sm90_placement.cuh). Where the tiles go by placement
// (launch_kind) both GEMMs launch early at any size; this bound is for the launches without it. Also
// launching it early past 64 rows with per-64-row-block readiness counters from GEMM1's epilogue (so it
// runs under GEMM1's last wave) was tried and dropped: correct, not faster (README, "GEMM2 under GEMM1's
// last wave").
constexpr int64_t kFinalizeEarlyLaunchMaxAvgRows = 64;
// The gated epilogue (GEMM1 + act(gate, up)) from 33 to this many average rows per expert runs pingpong
// 64x256 without a cluster, else as the plain store. Timed interleaved against the 2x1 cluster on the
// four bench shapes at 1024-8192 tokens (scratch probe, L2 flushed, one H200 run each): single-CTA won at
// 64-384 rows in 11 of 12 cases (Qwen3 4096 tokens, 256 rows: 435 vs 490 us; DeepSeek-V2-Lite 2048,
// 192 rows: 317 vs 363; GPT-OSS 1024, 128 rows: 376 vs 429; one even), and split past that: GPT-OSS 512
// and 1024 rows (1089 vs 1041, 2202 vs 1976) and DeepSeek-V2-Lite 768 rows (1074 vs 1057) keep the
// cluster, Qwen3 512 rows (806 vs 834) and Mixtral 1024 / 2048 rows (3022 vs 3250, 6057 vs 6191) lose by it.
// Re-timed with the paired cluster units (bench/gemm_rate_probe.py --gated, one H200 run): single-CTA
// still wins at 128-384 rows (Qwen3 4096 tokens 437 vs 451 us, DeepSeek-V2-Lite 507 vs 527) and the
// cluster past them on GPT-OSS (512 rows 955 vs 1030, 1024 rows 1778-1786 vs 1969-1988) and DeepSeek-V2-
// Lite (768 rows 910-933 vs 926-946); Qwen3 at 512 rows is even, Mixtral still prefers single-CTA by
// 0.2-2.5% (512-2048 rows). The bound stayed at 384 then. With the fixed TMA descriptors
// (gemm_sm90_static_maps.cuh) the cluster lost its lead at 512-1024 rows (bench/gemm_rate_probe.py
// --gated --tiles auto,pingpong64x256, one H200 call, single-CTA vs 2x1 cluster): GPT-OSS 512 rows
// 905.0 vs 927.3 us and 1024 rows 1699.3 vs 1709.5, Qwen3 512 rows 726.7 vs 738.4, Mixtral 512 and 1024
// rows 1532.4 vs 1579.2 and 2893.3 vs 2967.6; against it DeepSeek-V2-Lite 768 rows 968.4 vs 953.4 and
// Mixtral 2048 rows 5845.9 vs 5812.5. So the bound is now 1024.
constexpr int64_t kGatedSingleCtaMaxAvgRows = 1024;
// Where the 2x1-cluster tile is chosen, its 192-column variant replaces the 256-column one when 256-wide
// tiles would pad more than 1/16 of the N columns and 192-wide ones pad none: among the bench shapes
// only GPT-OSS's N = 2880 (12 tiles of 256 = 3072 columns, 15 of 192). Timed interleaved with paired
// units (bench/gemm_rate_probe.py, plain and --gated runs, one H200 call): GPT-OSS GEMM2 515.6-517.1 vs
// 532.1-533.7 us at 4096 tokens and 924.1-929.6 vs 954.1-957.5 at 8192; GPT-OSS GEMM1 (N = 5760, which
// 256-wide tiles pad by 2.2%) 979 vs 933-954 at 4096, even at 8192; the other shapes, with no padding
// to save, lose 2-45% (each 64x192 tile re-reads its A rows for fewer columns).
bool narrow_columns_fit(int n) {
  const int pad256 = (256 - n % 256) % 256;
  return n % 192 == 0 && pad256 * 16 > n;
}

template <int kTile> struct WgmmaTileTraits;
template <> struct WgmmaTileTraits<WG_COOP_128x256> {
  using Shape = cute::Shape<cute::_128, cute::_256, cute::_64>;
  using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Schedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
};
template <> struct WgmmaTileTraits<WG_PINGPONG_64x256> {
  using Shape = cute::Shape<cute::_64, cute::_256, cute::_64>;
  using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Schedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
};
template <> struct WgmmaTileTraits<WG_PINGPONG_64x256_C2> : WgmmaTileTraits<WG_PINGPONG_64x256> {
  using Cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
};
template <> struct WgmmaTileTraits<WG_PINGPONG_64x192_C2> : WgmmaTileTraits<WG_PINGPONG_64x256_C2> {
  using Shape = cute::Shape<cute::_64, cute::_192, cute::_64>;
};
template <> struct WgmmaTileTraits<WG_PINGPONG_64x128> {
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
  // Fixed TMA descriptors over all experts' rows and weights (gemm_sm90_static_maps.cuh). The 2x1-cluster
  // tile runs PairedTileScheduler's units (gemm_sm90_pairs.cuh), whose split units need PairedMainloop's loads.
  static constexpr bool kPaired = cute::size<0>(ClusterShape{}) == 2;
  using StaticMainloop = StaticMapMainloop<BuiltMainloop>;
  using Mainloop = std::conditional_t<kPaired, PairedMainloop<StaticMainloop>, StaticMainloop>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  // One-CTA 64-row tiles take their tiles by placement (gemm_sm90_placement.cuh), so they may launch early.
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
  return std::max({cutlass_workspace_bytes<T, kEpi, WG_COOP_128x256>(num_experts, sm_count),
                   cutlass_workspace_bytes<T, kEpi, WG_PINGPONG_64x256>(num_experts, sm_count),
                   cutlass_workspace_bytes<T, kEpi, WG_PINGPONG_64x128>(num_experts, sm_count),
                   cutlass_workspace_bytes<T, kEpi, WG_PINGPONG_64x256_C2>(num_experts, sm_count),
                   cutlass_workspace_bytes<T, kEpi, WG_PINGPONG_64x192_C2>(num_experts, sm_count)});
}

bool device_is_sm90() {
  // sm_90a code runs on 9.0 only (arch-specific features are not forward compatible).
  return mb::device_attribute(cudaDevAttrComputeCapabilityMajor) == 9 &&
         mb::device_attribute(cudaDevAttrComputeCapabilityMinor) == 0;
}

int wgmma_tile(int64_t max_rows, int num_experts, int n, int epilogue, bool weights_blocked) {
  const char* force = getenv("MB_SM90_WGMMA_TILE");
  if (force && strcmp(force, "coop128x256") == 0) return WG_COOP_128x256;
  if (force && strcmp(force, "pingpong64x256") == 0) return WG_PINGPONG_64x256;
  if (force && strcmp(force, "pingpong64x128") == 0) return WG_PINGPONG_64x128;
  if (force && strcmp(force, "pingpong64x256c2") == 0) return WG_PINGPONG_64x256_C2;
  if (force && strcmp(force, "pingpong64x192c2") == 0) return WG_PINGPONG_64x192_C2;
  const int64_t avg_rows = avg_rows_per_expert(max_rows, num_experts);
  if (epilogue == EPI_FINALIZE)
    return avg_rows <= kFinalizeNarrowMaxAvgRows ? WG_PINGPONG_64x128 : WG_PINGPONG_64x256;
  if (avg_rows <= kNarrowMaxAvgRows) return WG_PINGPONG_64x128;
  if (epilogue == EPI_GATED && avg_rows <= kGatedSingleCtaMaxAvgRows) return WG_PINGPONG_64x256;
  // 64x192 in 2x1 clusters multicasts 96-row weight slices, which blocked weights do not tile.
  return narrow_columns_fit(n) && !weights_blocked ? WG_PINGPONG_64x192_C2 : WG_PINGPONG_64x256_C2;
}

// Whether the gated and finalize epilogues write under L2 evict_last (MoeEpilogue::Arguments::evict_last).
// Both write outputs that are read again soon: the finalize GEMM adds top_k rows into each token's output
// row, rows that come from experts spread over the whole GEMM, and the gated GEMM1 writes the rows GEMM2
// reads next. Under plain writes the weights streaming through L2 (Qwen3-30B-A3B: 805 + 402 MB at 4096 tokens,
// against 16 MB of output and a 50 MB L2) most likely evict those lines between their uses; not profiled.
// Whole layers, graph replay, interleaved in one process, three rounds each (bench/env_ab_probe.py, H100,
// 2026-11-27; docs/measured/l2_evict_last_ab_h100.json), both hints against neither: Qwen3 at 4096 tokens
// 671.2-673.2 us vs 690.8-691.4, DeepSeek-V2-Lite 782.0-786.3 vs 794.3-804.3, GPT-OSS-20B 1402.7-1471.9 vs
// 1488.6-1528.3, Mixtral-8x7B 4556.1-4717.2 vs 4782.0-5482.6; at 1024 tokens 12-30 us faster on all four, at
// 256 tokens 5-20 us, at 16 tokens (the decode kernel: no change) even. The finalize hint alone gave Qwen3
// 15 us at 4096 tokens and Qwen3, DeepSeek-V2-Lite and GPT-OSS-20B 12-22 us at 1024; the gated one 0-28 more
// (the most on Mixtral). evict_first on either was not ahead. evict_last on the expansion's stores and on the
// output's zeroing was even at 4096 tokens and within +-4 us elsewhere (docs/measured/
// l2_expand_zero_ab_h100.json), so those stay plain.
// MB_SM90_OUTPUT_L2=plain writes plainly (the probes' baseline).
bool outputs_evict_last() {
  const char* v = getenv("MB_SM90_OUTPUT_L2");
  return !(v && strcmp(v, "plain") == 0);
}

enum Sm90Path { PATH_DECODE = 0, PATH_MMA = 1, PATH_WGMMA = 2 };

int sm90_path(int64_t max_rows, int num_experts) {
  const char* force = getenv("MB_SM90_GEMM_PATH");
  if (force && strcmp(force, "decode") == 0) return PATH_DECODE;
  if (force && strcmp(force, "mma") == 0) return PATH_MMA;
  if (force && strcmp(force, "wgmma") == 0) return PATH_WGMMA;
  return decode_rows_fit(max_rows, num_experts) ? PATH_DECODE : PATH_WGMMA;
}

// Whether run_wgmma launches a GEMM after a trigger (programmatic dependent launch): its CTAs then set up
// under the previous kernel's last CTAs, and its producer waits for that kernel before its first load
// (StaticMapMainloop::await_inputs). The gated GEMM1 (after the expansion) and the finalize GEMM2 (after
// GEMM1 or the activation kernel) do so where their CTAs start by placement: the caller gives a claim
// region, the tile is a one-CTA 64-row one and the device has a placement record (gemm_sm90_placement.cuh).
// Without placement the early launch scatters the tiles and lost far more than it saves at 4096 tokens
// (README, "Tiles by placement"). Only where one expert's weights of this GEMM fit in L2: Mixtral-8x7B's
// (117-235 MB) lost with it (whole layers against the unplaced launch, bench/env_ab_probe.py, three rounds:
// H200 1024 tokens +1.4 to +22 us, 4096 tokens +6 to +10; H100 4096 tokens +138 to +240), for a reason not
// found, while Qwen3-30B-A3B, DeepSeek-V2-Lite and GPT-OSS-20B (6-33 MB) gained at 1024 and 4096 tokens
// (H200: Qwen3 4096 tokens 580.9-581.2 vs 586.1-586.4 us). The finalize GEMM also launches early up to
// kFinalizeEarlyLaunchMaxAvgRows without placement. MB_SM90_LAUNCH=plain in the environment launches every
// GEMM plainly, MB_SM90_LAUNCH=unplaced never by placement (the probes' baselines).
// Below this many average rows per expert the launch by placement was 0.6-1.8 us behind the unplaced one
// (256 tokens of Qwen3-30B-A3B and DeepSeek-V2-Lite, 16 and 24 rows, H200 and H100, bench/env_ab_probe.py),
// from 32 rows even or ahead (GPT-OSS-20B at 256 tokens: H200 402.0-402.1 vs 406.0-406.8 us, H100 584.1-584.7
// vs 582.7-583.7; Mixtral-8x7B, 64 rows: 714.0-715.9 vs 752.7-753.7 and 1020.5-1021.1 vs 1022.5-1024.0).
constexpr int64_t kPlacedMinAvgRows = 32;

enum class Launch { kPlain, kAfterTrigger, kAfterTriggerPlaced };
template <int kEpi, bool kPlaced>
Launch launch_kind(int64_t avg_rows, int64_t expert_weight_bytes, const int32_t* claims, int sm_count,
                   cudaStream_t stream) {
  const char* force = getenv("MB_SM90_LAUNCH");
  if ((force && strcmp(force, "plain") == 0) || kEpi == EPI_STORE) return Launch::kPlain;
  const bool unplaced = force && strcmp(force, "unplaced") == 0;
  if (kPlaced && claims != nullptr && !unplaced && avg_rows >= kPlacedMinAvgRows &&
      expert_weight_bytes <= placement_l2_bytes(sm_count, stream))
    return Launch::kAfterTriggerPlaced;
  return kEpi == EPI_FINALIZE && avg_rows <= kFinalizeEarlyLaunchMaxAvgRows ? Launch::kAfterTrigger : Launch::kPlain;
}

template <typename T, int kEpi, int kTile>
mb_status run_wgmma(const void* A, const void* B, bool b_blocked, const typename MoeEpilogue<T, kEpi>::Arguments& epi,
                    const int64_t* offsets, int num_experts, int64_t max_rows, int n, int k, int32_t* claims,
                    void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  using G = WgmmaGemm<T, kEpi, kTile>;
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
  const Launch launch = launch_kind<kEpi, G::kPlaced>(avg_rows_per_expert(max_rows, num_experts),
                                                       int64_t(n) * k * int64_t(sizeof(T)), claims, sm_count, stream);
  typename G::Gemm gemm;
  auto args = make_args<T, kEpi, kTile>(
      offsets, num_experts, epi, sm_count,
      WholeOperands{A, max_rows, B, n, k, b_blocked, launch == Launch::kAfterTriggerPlaced ? claims : nullptr});
  cutlass::Status st = gemm.can_implement(args);
  if (st != cutlass::Status::kSuccess)
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm sm90: CUTLASS cannot implement (%s)",
                     cutlassGetStatusString(st));
  st = gemm.initialize(args, workspace, stream);
  if (st == cutlass::Status::kSuccess) st = gemm.run(stream, nullptr, launch != Launch::kPlain);
  const cudaError_t err = cudaGetLastError();
  if (st != cutlass::Status::kSuccess || err != cudaSuccess)
    return fail(MB_ERR_CUDA, "grouped gemm sm90: %s / %s", cutlassGetStatusString(st), cudaGetErrorString(err));
  return MB_OK;
}

// The wgmma kernel for the call `p` describes (the same GemmParams the decode and mma.sync paths take;
// for the gated epilogue p.n is the output width, the GEMM's columns are gate and up: 2 * p.n).
template <int kEpi>
mb_status dispatch_wgmma(const GemmParams& p, int64_t max_rows, int dtype, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream) {
  const int n = kEpi == EPI_GATED ? 2 * p.n : p.n;
  // Every epilogue writes (or atomically adds) 16-byte vectors; n % 8 keeps the rows aligned.
  if (reinterpret_cast<uintptr_t>(p.C) % 16 != 0)
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm sm90: the output pointer must be 16-byte aligned");
  auto go = [&](auto tag) {
    using T = decltype(tag);
    const typename MoeEpilogue<T, kEpi>::Arguments epi{
        static_cast<const T*>(p.bias), static_cast<T*>(p.C), p.offsets, p.permuted_to_unpermuted,
        p.permuted_weights, p.top_k, p.activation, p.swiglu_alpha, p.swiglu_limit, outputs_evict_last()};
    auto run = [&](auto tile) {
      return run_wgmma<T, kEpi, decltype(tile)::value>(p.A, p.B, p.weights_blocked != 0, epi, p.offsets,
                                                       p.num_experts, max_rows, n, p.k, p.placement, workspace,
                                                       workspace_bytes, stream);
    };
    switch (wgmma_tile(max_rows, p.num_experts, n, kEpi, p.weights_blocked != 0)) {
      case WG_PINGPONG_64x256: return run(std::integral_constant<int, WG_PINGPONG_64x256>{});
      case WG_PINGPONG_64x128: return run(std::integral_constant<int, WG_PINGPONG_64x128>{});
      case WG_PINGPONG_64x256_C2: return run(std::integral_constant<int, WG_PINGPONG_64x256_C2>{});
      case WG_PINGPONG_64x192_C2: return run(std::integral_constant<int, WG_PINGPONG_64x192_C2>{});
      default: return run(std::integral_constant<int, WG_COOP_128x256>{});
    }
  };
  return dtype == MB_BF16 ? go(__nv_bfloat16{}) : go(__half{});
}

// Every sm90 entry point, after its checks: the decode kernel, the mma.sync tiles (when forced) or
// the wgmma kernel, by sm90_path.
mb_status run_sm90(const GemmParams& p, int64_t max_rows, int dtype, int epilogue, void* workspace,
                   size_t workspace_bytes, cudaStream_t stream) {
  switch (sm90_path(max_rows, p.num_experts)) {
    case PATH_DECODE: return launch_grouped_decode(p, max_rows, dtype, epilogue, stream);
    case PATH_MMA:
      if (p.weights_blocked)
        return fail(MB_ERR_UNSUPPORTED, "grouped gemm sm90: the mma.sync path (MB_SM90_GEMM_PATH=mma) reads "
                                        "row-major weights only, not MB_WEIGHTS_BLOCKED64");
      return launch_grouped_mma(p, max_rows, dtype, epilogue, choose_tile(max_rows, p.num_experts), stream);
    default:
      switch (epilogue) {
        case EPI_GATED: return dispatch_wgmma<EPI_GATED>(p, max_rows, dtype, workspace, workspace_bytes, stream);
        case EPI_FINALIZE:
          return dispatch_wgmma<EPI_FINALIZE>(p, max_rows, dtype, workspace, workspace_bytes, stream);
        default: return dispatch_wgmma<EPI_STORE>(p, max_rows, dtype, workspace, workspace_bytes, stream);
      }
  }
}

mb_status check_common(const void* A, const void* B, const void* out, const int64_t* offsets, int num_experts,
                       int64_t max_rows, int n, int k, int dtype, int weight_layout) {
  if (!device_is_sm90())
    return fail(MB_ERR_UNSUPPORTED, "grouped gemm sm90: needs a compute capability 9.0 device");
  if (dtype == MB_FP32) return fail(MB_ERR_UNSUPPORTED, "grouped gemm sm90: fp32 is not implemented");
  if (dtype != MB_BF16 && dtype != MB_FP16)
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm sm90: unknown dtype %d", dtype);
  if (!A || !B || !out || !offsets || num_experts <= 0 || max_rows < 0 || n <= 0 || k <= 0)
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm sm90: null pointer or non-positive size");
  if (n % 8 != 0 || k % 8 != 0)
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm sm90: n (%d) and k (%d) must be multiples of 8", n, k);
  if (weight_layout != MB_WEIGHTS_ROW_MAJOR && weight_layout != MB_WEIGHTS_BLOCKED64)
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm sm90: weight_layout %d is not MB_WEIGHTS_ROW_MAJOR (%d) or "
                "MB_WEIGHTS_BLOCKED64 (%d)", weight_layout, MB_WEIGHTS_ROW_MAJOR, MB_WEIGHTS_BLOCKED64);
  if (weight_layout == MB_WEIGHTS_BLOCKED64 && (n % 64 != 0 || k % 64 != 0))
    return fail(MB_ERR_INVALID_ARGUMENT,
                "grouped gemm sm90: MB_WEIGHTS_BLOCKED64 needs the weight rows per expert (%d) and k (%d) to be "
                "multiples of 64", n, k);
  return MB_OK;
}

}  // namespace
}  // namespace mbk

extern "C" {

size_t mb_grouped_gemm_sm90_workspace(int num_experts, int64_t max_rows, int n, int k) {
  (void)max_rows;
  (void)n;
  (void)k;
  if (num_experts <= 0) return 0;
  const int sm = mb::device_attribute(cudaDevAttrMultiProcessorCount);
  size_t cw = 0;
  for (int epi : {mbk::EPI_STORE, mbk::EPI_GATED, mbk::EPI_FINALIZE}) {
    auto each = [&](auto tag) {
      using T = decltype(tag);
      switch (epi) {
        case mbk::EPI_STORE: return mbk::max_cutlass_workspace_bytes<T, mbk::EPI_STORE>(num_experts, sm);
        case mbk::EPI_GATED: return mbk::max_cutlass_workspace_bytes<T, mbk::EPI_GATED>(num_experts, sm);
        default: return mbk::max_cutlass_workspace_bytes<T, mbk::EPI_FINALIZE>(num_experts, sm);
      }
    };
    cw = std::max({cw, each(__nv_bfloat16{}), each(__half{})});
  }
  return cw;  // the decode and mma.sync paths need none
}

size_t mb_grouped_gemm_sm90_placement_ints(void) { return mbk::kPlacementInts; }

int mb_grouped_gemm_sm90_placement_recorded(void) { return mbk::placement_record_exists() ? 1 : 0; }

mb_status mb_grouped_gemm_sm90(const void* A, const void* B, const void* bias, void* C,
                               const int64_t* expert_first_token_offset, int num_experts, int64_t max_rows,
                               int n, int k, int dtype, int weight_layout, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream) {
  mb_status st =
      mbk::check_common(A, B, C, expert_first_token_offset, num_experts, max_rows, n, k, dtype, weight_layout);
  if (st != MB_OK || max_rows == 0) return st;
  mbk::GemmParams p = mbk::gemm_params(A, B, bias, C, expert_first_token_offset, num_experts, n, k, MB_ACT_IDENTITY);
  p.weights_blocked = weight_layout == MB_WEIGHTS_BLOCKED64;
  return mbk::run_sm90(p, max_rows, dtype, mbk::EPI_STORE, workspace, workspace_bytes, stream);
}

mb_status mb_grouped_gemm_sm90_finalize(const void* A, const void* B, const void* bias, void* out,
                                        const int64_t* expert_first_token_offset,
                                        const int32_t* permuted_to_unpermuted, const float* permuted_weights,
                                        int num_experts, int64_t max_rows, int num_tokens, int top_k, int n,
                                        int k, int dtype, int weight_layout, int32_t* placement, void* workspace,
                                        size_t workspace_bytes, cudaStream_t stream) {
  mb_status st =
      mbk::check_common(A, B, out, expert_first_token_offset, num_experts, max_rows, n, k, dtype, weight_layout);
  if (st != MB_OK) return st;
  if (!permuted_to_unpermuted || !permuted_weights || top_k <= 0 || num_tokens < 0)
    return mbk::fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm sm90 finalize: missing maps/weights or bad top_k");
  if (max_rows == 0) return MB_OK;
  mbk::GemmParams p = mbk::gemm_params(A, B, bias, out, expert_first_token_offset, num_experts, n, k, MB_ACT_IDENTITY);
  p.permuted_to_unpermuted = permuted_to_unpermuted;
  p.permuted_weights = permuted_weights;
  p.top_k = top_k;
  p.weights_blocked = weight_layout == MB_WEIGHTS_BLOCKED64;
  p.placement = placement;
  return mbk::run_sm90(p, max_rows, dtype, mbk::EPI_FINALIZE, workspace, workspace_bytes, stream);
}

mb_status mb_grouped_gemm_sm90_gated(const void* A, const void* B, const void* bias, void* C,
                                     const int64_t* expert_first_token_offset, int num_experts, int64_t max_rows,
                                     int inter, int k, int dtype, int activation, float swiglu_alpha,
                                     float swiglu_limit, int weight_layout, int32_t* placement, void* workspace,
                                     size_t workspace_bytes, cudaStream_t stream) {
  if (inter <= 0 || inter % 8 != 0)
    return mbk::fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm sm90 gated: inter (%d) must be a positive multiple of 8",
                     inter);
  if (activation != MB_ACT_SWIGLU && activation != MB_ACT_GEGLU && activation != MB_ACT_SWIGLU_CLAMP)
    return mbk::fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm sm90 gated: activation %d is not swiglu (%d), geglu (%d) "
                     "or swiglu_clamp (%d)", activation, MB_ACT_SWIGLU, MB_ACT_GEGLU, MB_ACT_SWIGLU_CLAMP);
  mb_status st = mbk::check_common(A, B, C, expert_first_token_offset, num_experts, max_rows, 2 * inter, k, dtype,
                                   weight_layout);
  if (st != MB_OK || max_rows == 0) return st;
  mbk::GemmParams p = mbk::gemm_params(A, B, bias, C, expert_first_token_offset, num_experts, inter, k, activation);
  p.swiglu_alpha = swiglu_alpha;
  p.swiglu_limit = swiglu_limit;
  p.gate_up_interleaved = 1;
  p.weights_blocked = weight_layout == MB_WEIGHTS_BLOCKED64;
  p.placement = placement;
  return mbk::run_sm90(p, max_rows, dtype, mbk::EPI_GATED, workspace, workspace_bytes, stream);
}

}  // extern "C"
