// mb_grouped_gemm_woq_sm90_gated (issue 47; sm_90a): the weight-only GEMM1 on the mixed-input wgmma kernel of
// gemm/woq_sm90.cuh with the gated activation in its epilogue (WoqGatedEpilogue), so the [rows, 2 inter] product is
// never written and no activation step reads it back; 16-bit layers and FP8 ones have the same fusion
// (gemm/sm90_epilogue.cuh's EPI_GATED), in the untransposed orientation.
#include "gemm/woq_sm90.cuh"  // first: it sets NDEBUG and CuTe's extended wgmma shapes before CUTLASS is included

#include "common/act_math.cuh"
#include "common/fp8_quantize.cuh"  // fp8::dequantized: W4AFP8's GEMM2 input by its static scale

namespace mbk {
namespace {

// The gated epilogue of the transposed GEMM, run by CUTLASS's Sm90TmaWarpSpecializedAdapter as MoeEpilogue is (each
// consumer thread writes its own accumulator fragment; no shared memory). M is W1's rows (2 inter), N the expert's
// token rows. W1 is interleaved in blocks of 8 features (gemm/mma.cuh gated_row): rows 16b..16b+7 the gates of
// features 8b..8b+7, rows 16b+8..16b+15 their up projections. A thread's fragment (CUTLASS's wgmma CLayout_64xN, as
// MoeEpilogue describes it) holds, in each 64-row slab and wgmma column tile, rows m0 and m0 + 8 at columns n0 + 8j and
// n0 + 8j + 1, values 4j + {0, 1} and 4j + {2, 3}; m0 % 16 = lane / 4 < 8 (the slabs start at multiples of 16), so
// row m0 is the gate and row m0 + 8 the up projection of one feature f = 8 (m0 / 16) + m0 % 16, for 2 tokens a j.
// One shuffle with the lane holding feature f ^ 1 (lane ^ 4) pairs two features of one token: even-feature lanes
// keep column n0 + 8j and odd ones n0 + 8j + 1, each then writing two adjacent features with one 4-byte store.
template <typename T>
struct WoqGatedArguments {
  const T* bias = nullptr;            // b1 [E, 2 inter], interleaved as W1, or null
  const float* prequant = nullptr;    // AWQ's FC2 pre-quant scale [inter], or null
  const float* fp8_scale = nullptr;   // WoqGatedFp8: GEMM2's static input scale (a device scalar)
  T* out = nullptr;                   // [rows, inter]
  const int64_t* offsets = nullptr;   // the experts' first permuted rows
  int activation = MB_ACT_SWIGLU;     // a gated one
  float swiglu_alpha = 1.f;
  float swiglu_limit = 0.f;
};

// kFp8 (WoqGatedFp8, W4AFP8 with a static GEMM2 input scale): each value stored as mb_fc1_activation_fp8_dequantized
// stores it, the activation rounded to T, times the pre-quant scale in fp32, its e4m3 quantization by fp8_scale times
// fp8_scale (fp8::dequantized), rounded to T: GEMM2's e4m3 input in the values W4A16's GEMM2 reads. A kernel of its own,
// so that W4A16's and W8A16's gated kernels stay as they were.
template <typename T, bool kFp8>
class WoqGatedEpilogue : public WoqOwnStoresEpilogue<WoqGatedEpilogue<T, kFp8>, T, WoqGatedArguments<T>> {
  using Base = WoqOwnStoresEpilogue<WoqGatedEpilogue<T, kFp8>, T, WoqGatedArguments<T>>;
  using Base::params_;
  using typename Base::Frag;

 public:
  CUTLASS_HOST_DEVICE WoqGatedEpilogue(typename Base::Params const& params) : Base(params) {}

  // The base's walk hands each slab here (one branch per slab for the activation and the bias).
  template <class Acc>
  CUTLASS_DEVICE void slab(Acc const& acc, Frag const& f, const T* bias) {
    switch (params_.activation) {
      case MB_ACT_GEGLU: return bias ? gated_slab<MB_ACT_GEGLU, true>(acc, f, bias)
                                     : gated_slab<MB_ACT_GEGLU, false>(acc, f, bias);
      case MB_ACT_SWIGLU_CLAMP: return bias ? gated_slab<MB_ACT_SWIGLU_CLAMP, true>(acc, f, bias)
                                            : gated_slab<MB_ACT_SWIGLU_CLAMP, false>(acc, f, bias);
      default: return bias ? gated_slab<MB_ACT_SWIGLU, true>(acc, f, bias)
                           : gated_slab<MB_ACT_SWIGLU, false>(acc, f, bias);
    }
  }

 private:
  // act(gate + bg, up + bu) (* the pre-quant scale) in fp32 for every token of the slab, rounded to T once; the bias
  // added only where b1 is given (adding a zero would turn a -0 into +0), as mb_fc1_activation computes it.
  template <int ACT, bool kBias, class Acc>
  CUTLASS_DEVICE void gated_slab(Acc const& acc, Frag const& f, const T* bias) {
    using P2 = Pair<T>;
    const int inter = f.M / 2;
    const bool odd = (threadIdx.x >> 2) & 1;  // lane / 4 odd: the feature's partner is f - 1
    const int feature = (f.m0 >> 4) * 8 + (f.m0 & 7);
    const bool in = f.m0 < f.M;  // M is a multiple of 16: the partner lane's feature is in range too
    float bg = 0.f, bu = 0.f, scale = 1.f;
    if (in) {
      if constexpr (kBias) {
        bg = mb::to_f32(bias[f.m0]);
        bu = mb::to_f32(bias[f.m0 + 8]);
      }
      if (params_.prequant) scale = __ldg(params_.prequant + feature);
    }
    const float alpha = params_.swiglu_alpha, limit = params_.swiglu_limit;
    float q = 1.f, y = 1.f;  // kFp8: the static scale and its correctly rounded reciprocal
    if constexpr (kFp8) {
      q = *params_.fp8_scale;
      y = __frcp_rn(q);
    }
    T* out = params_.out + f.row0 * inter + (feature & ~1);
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < cute::size(acc) / 4; ++j) {
      float g0 = acc(4 * j), g1 = acc(4 * j + 1), u0 = acc(4 * j + 2), u1 = acc(4 * j + 3);
      if constexpr (kBias) {
        g0 += bg;
        g1 += bg;
        u0 += bu;
        u1 += bu;
      }
      float a0, a1;  // tokens n0 + 8j and n0 + 8j + 1
      if constexpr (kFp8) {
        a0 = mb::fp8::dequantized(__fmul_rn(rounded(mb::act_apply<ACT>(g0, u0, alpha, limit)), scale), q, y);
        a1 = mb::fp8::dequantized(__fmul_rn(rounded(mb::act_apply<ACT>(g1, u1, alpha, limit)), scale), q, y);
      } else {
        a0 = mb::act_apply<ACT>(g0, u0, alpha, limit) * scale;
        a1 = mb::act_apply<ACT>(g1, u1, alpha, limit) * scale;
      }
      const float got = __shfl_xor_sync(0xffffffffu, odd ? a0 : a1, 4);
      const int token = f.n0 + 8 * j + (odd ? 1 : 0);
      const typename P2::type pair = odd ? P2::make(got, a1) : P2::make(a0, got);
      if (in && token < f.N) *reinterpret_cast<typename P2::type*>(out + static_cast<int64_t>(token) * inter) = pair;
    }
  }

  // v rounded to T and back (kFp8: the activation as the 16-bit activation step would store it).
  CUTLASS_DEVICE static float rounded(float v) { return mb::to_f32(mb::from_f32<T>(v)); }
};

template <typename T, class TileShape, class ClusterShape>
struct WoqEpilogueOf<WoqGated, T, TileShape, ClusterShape> {
  using type = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<WoqGatedEpilogue<T, false>>;
};
template <typename T, class TileShape, class ClusterShape>
struct WoqEpilogueOf<WoqGatedFp8, T, TileShape, ClusterShape> {
  using type = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<WoqGatedEpilogue<T, true>>;
};

// The entry point's kernels with the epilogue Epi (WoqGated or WoqGatedFp8).
template <class Epi>
mb_status run_gated(const WoqSm90Params& p, int dtype, const mb_gemm_tactic& tactic,
                    const WoqGatedArguments<void>& args, void* workspace, size_t workspace_bytes,
                    cudaStream_t stream) {
  return dispatch_woq_sm90<Epi>(dtype, p.kind, tactic.tile, [&](auto g) {
    using G = decltype(g);
    using T = typename G::Value;
    const typename G::Epilogue::Arguments epi{static_cast<const T*>(args.bias), args.prequant, args.fp8_scale,
                                              static_cast<T*>(args.out), args.offsets, args.activation,
                                              args.swiglu_alpha, args.swiglu_limit};
    return run_woq_sm90<G>(p, [&](const GroupArrays<G>&) { return epi; }, workspace, workspace_bytes, stream);
  });
}

}  // namespace

size_t woq_sm90_gated_workspace(int num_experts, int sm_count) {
  return std::max(woq_sm90_max_workspace<WoqGated>(num_experts, sm_count),
                  woq_sm90_max_workspace<WoqGatedFp8>(num_experts, sm_count));
}

}  // namespace mbk

extern "C" mb_status mb_grouped_gemm_woq_sm90_gated(const void* A, const void* B, int kind, const void* scales,
                                                    const void* zeros, int group, const void* b1,
                                                    const float* prequant_scale, const float* fp8_scale,
                                                    int activation, float swiglu_alpha, float swiglu_limit, void* out,
                                                    const int64_t* expert_first_token_offset, int num_experts,
                                                    int64_t max_rows, int inter, int k, int dtype,
                                                    mb_gemm_tactic tactic, void* workspace, size_t workspace_bytes,
                                                    cudaStream_t stream) {
  const char* who = "grouped gemm woq sm90 gated";
  if (activation != MB_ACT_SWIGLU && activation != MB_ACT_GEGLU && activation != MB_ACT_SWIGLU_CLAMP)
    return mb::fail(MB_ERR_INVALID_ARGUMENT, "%s: activation %d is not a gated one (swiglu %d, geglu %d, "
                     "swiglu_clamp %d)", who, activation, MB_ACT_SWIGLU, MB_ACT_GEGLU, MB_ACT_SWIGLU_CLAMP);
  if (inter <= 0 || inter % 8 != 0)
    return mb::fail(MB_ERR_INVALID_ARGUMENT, "%s: inter %d must be a positive multiple of 8 (W1 interleaved in "
                     "blocks of 8 features)", who, inter);
  if (activation == MB_ACT_SWIGLU_CLAMP && !(swiglu_limit > 0.f))
    return mb::fail(MB_ERR_INVALID_ARGUMENT, "%s: swiglu_limit must be > 0 (inf for none), got %g", who,
                     swiglu_limit);
  if (reinterpret_cast<uintptr_t>(b1) % 2 != 0 || reinterpret_cast<uintptr_t>(prequant_scale) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(fp8_scale) % 4 != 0)
    return mb::fail(MB_ERR_INVALID_ARGUMENT, "%s: b1, prequant_scale and fp8_scale must be aligned to their elements",
                    who);
  if (fp8_scale != nullptr && kind != MB_WOQ_INT4)
    return mb::fail(MB_ERR_INVALID_ARGUMENT, "%s: fp8_scale (W4AFP8's GEMM2 input scale) takes int4 weights, not kind "
                    "%d", who, kind);
  const mbk::WoqSm90Params p{A, B, scales, zeros, out, expert_first_token_offset, num_experts, 2 * inter, k, group,
                             kind};
  MB_TRY(mbk::check_woq_sm90(p, max_rows, dtype, tactic, who));
  if (max_rows == 0) return MB_OK;
  const mbk::WoqGatedArguments<void> args{b1, prequant_scale, fp8_scale, out, expert_first_token_offset, activation,
                                          swiglu_alpha, swiglu_limit};
  return fp8_scale ? mbk::run_gated<mbk::WoqGatedFp8>(p, dtype, tactic, args, workspace, workspace_bytes, stream)
                   : mbk::run_gated<mbk::WoqGated>(p, dtype, tactic, args, workspace, workspace_bytes, stream);
}
