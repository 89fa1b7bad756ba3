// mb_grouped_gemm_woq_sm90_finalize (issue 47; sm_90a): the weight-only GEMM2 on the mixed-input wgmma kernel of
// gemm/woq_sm90.cuh with the MoE finalize in its epilogue (WoqFinalizeEpilogue): each permuted row's product (+ b2),
// times its top-k weight, atomically added into its token's output row, so the [rows, n] product is never written and
// no finalize step reads it back. 16-bit and FP8 layers have the same fusion (gemm/sm90_epilogue.cuh's EPI_FINALIZE) in
// the untransposed orientation, and the weight-only decode kernel its own (mb_grouped_gemm_woq_finalize).
#include "gemm/woq_sm90.cuh"  // first: it sets NDEBUG and CuTe's extended wgmma shapes before CUTLASS is included

namespace mbk {
namespace {

template <typename T>
struct WoqFinalizeArguments {
  const T* bias = nullptr;                          // b2 [E, n], or null
  T* out = nullptr;                                 // [tokens, n], zeroed by the caller
  const int64_t* offsets = nullptr;                 // the experts' first permuted rows
  const int32_t* permuted_to_unpermuted = nullptr;  // [rows]: token * top_k + slot
  const float* permuted_weights = nullptr;          // [rows]
  int top_k = 1;
};

// An 8 x 8 transpose across the 8 lanes of a warp that share lane % 4 (r = lane / 4): lane r holds v[k] (k < 8);
// afterwards it holds v[f] = lane f's former v[r]. Three butterfly rounds (partner r ^ 4, r ^ 2, r ^ 1), each trading
// the four values whose index differs from r in the round's bit; every step a shuffle or a select, no value indexed at
// run time (as quad_transpose, gemm/sm90_epilogue.cuh).
__device__ __forceinline__ void octet_transpose(float (&v)[8], int r) {
  CUTLASS_PRAGMA_UNROLL
  for (int d = 4; d >= 1; d >>= 1) {
    const bool hi = r & d;
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < 8; ++k) {
      if (k & d) continue;
      const float got = __shfl_xor_sync(0xffffffffu, hi ? v[k] : v[k | d], d << 2);
      v[k] = hi ? got : v[k];
      v[k | d] = hi ? v[k | d] : got;
    }
  }
}

// The finalize epilogue of the transposed GEMM (M = n output features, N the expert's token rows), run by CUTLASS's
// Sm90TmaWarpSpecializedAdapter as MoeEpilogue is. A thread's fragment (CUTLASS's wgmma CLayout_64xN, as MoeEpilogue
// describes it) holds, in each 64-row slab and wgmma column tile, features m0 and m0 + 8 (h = 0, 1) at tokens n0 + 8j
// and n0 + 8j + 1, values 4j + 2h + {0, 1}, where m0 = m8 + r: the 8 lanes of one lane % 4 hold features m8..m8 + 7 of
// the same tokens (m8 a multiple of 16). For each block of four 8-column groups j those lanes transpose their 8 values
// of feature row h (octet_transpose), so that each holds one token's 8 consecutive features and adds them with one
// 16-byte atomic: an atomic per 8 outputs, as the untransposed epilogue's, where adding each thread's own pairs of
// tokens would take 4-byte atomics, one per 2 outputs. A column tile of two groups (the 16-row token tile) fills half
// a block; the lanes of its missing tokens add nothing.
template <typename T>
class WoqFinalizeEpilogue : public WoqOwnStoresEpilogue<WoqFinalizeEpilogue<T>, T, WoqFinalizeArguments<T>> {
  using Base = WoqOwnStoresEpilogue<WoqFinalizeEpilogue<T>, T, WoqFinalizeArguments<T>>;
  using Base::params_;
  using typename Base::Frag;

 public:
  CUTLASS_HOST_DEVICE WoqFinalizeEpilogue(typename Base::Params const& params) : Base(params) {}

  // The base's walk hands each slab here (one branch per slab for the bias).
  template <class Acc>
  CUTLASS_DEVICE void slab(Acc const& acc, Frag const& f, const T* bias) {
    bias ? finalize_slab<true>(acc, f, bias) : finalize_slab<false>(acc, f, bias);
  }

 private:
  // (acc + b2) * the token's routing weight in fp32, rounded to T once and added into the token's output row; the bias
  // added only where b2 is given (one branch per slab). Each block's token, weight and output row are read before the
  // first atomic, so that no dependent global loads sit between the atomics.
  template <bool kBias, class Acc>
  CUTLASS_DEVICE void finalize_slab(Acc const& acc, Frag const& f, const T* bias) {
    using P2 = Pair<T>;
    constexpr int kGroups = decltype(cute::size(acc))::value / 4;  // 8-column groups j
    constexpr int kBlocks = (kGroups + 3) / 4;
    const int r = (threadIdx.x >> 2) & 7;
    const int m8 = f.m0 - r;  // the lanes' first feature
    float w[kBlocks];
    T* dst[kBlocks];  // this lane's token's output row at feature m8 after each block's transpose, or null
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < kBlocks; ++c) {
      const int j = 4 * c + (r >> 1);
      const int n = f.n0 + 8 * j + (r & 1);
      w[c] = 0.f;
      dst[c] = nullptr;
      if (j < kGroups && n < f.N && m8 < f.M) {
        const int64_t p = f.row0 + n;
        w[c] = __ldg(params_.permuted_weights + p);
        dst[c] = params_.out + static_cast<int64_t>(__ldg(params_.permuted_to_unpermuted + p) / params_.top_k) * f.M +
                 m8;
      }
    }
    float b[2] = {0.f, 0.f};
    if constexpr (kBias) {
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) b[h] = f.m0 + 8 * h < f.M ? mb::to_f32(bias[f.m0 + 8 * h]) : 0.f;
    }
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < kBlocks; ++c) {
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        float v[8];  // feature m0 + 8h at the block's 8 tokens: column n0 + 8 (4c + k / 2) + k % 2
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < 8; ++k) {
          const int j = 4 * c + (k >> 1);
          v[k] = j < kGroups ? acc(4 * j + 2 * h + (k & 1)) + b[h] : 0.f;
        }
        octet_transpose(v, r);  // now token n0 + 8 (4c + r / 2) + r % 2 at features m8 + 8h + 0..7
        uint32_t packed[4];
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < 4; ++i) {
          const typename P2::type pair = P2::make(w[c] * v[2 * i], w[c] * v[2 * i + 1]);
          packed[i] = *reinterpret_cast<const uint32_t*>(&pair);
        }
        if (dst[c] != nullptr && m8 + 8 * h < f.M) red_add_16B<T>(dst[c] + 8 * h, packed, false, 0);
      }
    }
  }
};

template <typename T, class TileShape, class ClusterShape>
struct WoqEpilogueOf<WoqFinalize, T, TileShape, ClusterShape> {
  using type = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<WoqFinalizeEpilogue<T>>;
};

}  // namespace

size_t woq_sm90_finalize_workspace(int num_experts, int sm_count) {
  return woq_sm90_max_workspace<WoqFinalize>(num_experts, sm_count);
}

}  // namespace mbk

extern "C" mb_status mb_grouped_gemm_woq_sm90_finalize(const void* A, const void* B, int kind, const void* scales,
                                                       const void* zeros, int group, const void* bias, void* out,
                                                       const int64_t* expert_first_token_offset,
                                                       const int32_t* permuted_to_unpermuted,
                                                       const float* permuted_weights, int num_experts,
                                                       int64_t max_rows, int num_tokens, int top_k, int n, int k,
                                                       int dtype, mb_gemm_tactic tactic, void* workspace,
                                                       size_t workspace_bytes, cudaStream_t stream) {
  const char* who = "grouped gemm woq sm90 finalize";
  if (!permuted_to_unpermuted || !permuted_weights || num_tokens < 0 || top_k < 1)
    return mb::fail(MB_ERR_INVALID_ARGUMENT, "%s: null finalize map or weights, num_tokens < 0 or top_k < 1", who);
  if (reinterpret_cast<uintptr_t>(bias) % 2 != 0)
    return mb::fail(MB_ERR_INVALID_ARGUMENT, "%s: bias must be aligned to its elements", who);
  const mbk::WoqSm90Params p{A, B, scales, zeros, out, expert_first_token_offset, num_experts, n, k, group, kind};
  MB_TRY(mbk::check_woq_sm90(p, max_rows, dtype, tactic, who));
  if (max_rows == 0 || num_tokens == 0) return MB_OK;
  return mbk::dispatch_woq_sm90<mbk::WoqFinalize>(dtype, kind, tactic.tile, [&](auto g) {
    using G = decltype(g);
    using T = typename G::Value;
    const typename G::Epilogue::Arguments epi{static_cast<const T*>(bias), static_cast<T*>(out),
                                              expert_first_token_offset, permuted_to_unpermuted, permuted_weights,
                                              top_k};
    return mbk::run_woq_sm90<G>(p, [&](const mbk::GroupArrays<G>&) { return epi; }, workspace, workspace_bytes,
                                stream);
  });
}
