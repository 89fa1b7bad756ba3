// Weight-only grouped GEMM, decode kernel (tactic kernel MB_GEMM_DECODE; the operation, the stored forms and the
// launch are gemm/woq.cuh's and gemm/woq_abi.cu's): for the few rows per expert of decode.
//   MB_WOQ_INT4 : B uint8 [E, n, k/2], two 4-bit codes u per byte (low nibble the even column);
//                 w = (u - z) * s, s fp32 [E, n, k/group] (group 0: [E, n, 1]), z uint8 of the same shape, or
//                 8 when zeros is NULL (symmetric int4 stored as q + 8);
//   MB_WOQ_INT8 : B int8 [E, n, k]; w = q * s;
//   MB_WOQ_MXFP4: B uint8 [E, n, k/2] e2m1 codes, scales uint8 e8m0 [E, n, k/32]; w = e2m1(u) * 2^(e - 127).
// The dequantized weight is rounded once to A's type before the mma (gemm/woq.cuh's dequantization, shared with
// gemm/woq_mma.cu: int4 through the magic-number conversion and the split scale, within one unit in the last
// place of the rounded fp32 product; MXFP4 by a 16-bit multiply by a power of two, exact, or in fp32 for a batch
// where a warp's scale exceeds 2^1; int8 in fp32).
//
// The layout of gemm/decode.cu (swap-AB: weights are the 16-row A operand, up to 8 token rows the B
// operand; CTA = 8 warps = (expert, chunk of <= 8 rows, 128 / WK weight rows); WK warps split K; partial
// sums reduced in fixed warp order), with one difference in how a lane walks k: a lane takes 32
// consecutive k of its two weight rows per batch (16 bytes of int4 or MXFP4, 32 of int8: whole sectors),
// spent over the batch's four k32 steps as k = 32q + 8u + {0..7} for step u. The dot product does not care
// which physical k fills which fragment slot as long as a lane's weights and tokens agree, and the lane's
// token row is read at the same k. A lane's 32 k lie in one scale group (groups are 32, 64 or 128 and the
// batches start on multiples of 128), so a batch needs one scale (and zero) per weight row.
//
// Weights stream from HBM once, so the kernel is built to keep bytes in flight: 128 bytes of weights per lane
// (with their scales and zeros) sit in a register ring of kStages batches, each slot refilled with the batch
// kStages ahead as soon as its batch is spent: an int4 / MXFP4 lane has 3-4 batches of 32 bytes requested at any
// time (96-128 bytes, against 32 with a double buffer), at 2 CTAs per SM (launch bounds: <= 128 registers) 48-64
// KB per SM, what ~4 TB/s needs at HBM's loaded latency of ~1.5 us (~45 KB per SM); int8's 64-byte batches fit
// two slots in the same registers (64-128 bytes). The tokens (L1/L2-resident, read by every warp of the CTA) are
// only double-buffered, one batch ahead.
//
// e4m3 tokens (A8, W4AFP8): a lane's 32 k of its token row are 32 bytes, two 16-byte loads per batch (half the
// registers of 16-bit tokens), turned into T step by step just before the mma (gemm/woq.cuh, e4m3_pairs); the
// token row's scale multiplies the summed partials before the bias.
#include <cstdint>

#include "gemm/decode_launch.cuh"
#include "gemm/loads.cuh"
#include "gemm/mma.cuh"
#include "gemm/woq.cuh"

namespace mbk {
namespace {

// Batches of weights in the register ring: 128 bytes of weights per lane, 4 batches of int4 / MXFP4 or 2 of int8.
template <int KIND>
constexpr int kStages = KIND == MB_WOQ_INT8 ? 2 : 4;

template <typename T, int KIND, int WK, bool A8>
__global__ void __launch_bounds__(kDecodeThreads, 2) grouped_woq_decode_kernel(WoqGemmParams p) {
  constexpr int R = 16 * (kDecodeWarps / WK);  // weight rows per CTA (= output columns)
  constexpr int U = 4;                       // k32 steps per batch (128 k)
  constexpr int S = kStages<KIND>;
  static_assert(S % 2 == 0, "the token double buffer is indexed by the ring slot's parity");
  constexpr int RAW = KIND == MB_WOQ_INT8 ? 2 : 1;  // 16-byte weight loads per row per batch
  __shared__ float s_part[WK][R][kDecodeTokens + 1];
  using P2 = Pair<T>;

  const TileRows tile = cta_find_tile<kDecodeTokens>(p.offsets, p.num_experts);
  const int expert = tile.expert;
  if (expert < 0) return;
  const int64_t row_begin = tile.begin;
  const int rows = static_cast<int>(tile.end - row_begin);
  const int N = p.n, K = p.k;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int q = lane & 3, g = lane >> 2;
  const int rg = warp / WK, ks = warp % WK;
  const int col0 = blockIdx.y * R;
  // A lane's k to its scale group: k >> shift (MXFP4's 32, or the group), or group 0's one scale per row.
  const int group_shift = KIND == MB_WOQ_MXFP4 || p.group == 32 ? 5 : p.group == 64 ? 6 : 7;
  const int group_mask = KIND == MB_WOQ_MXFP4 || p.group ? -1 : 0;
  const int groups = KIND == MB_WOQ_MXFP4 ? K / kMxfp4Group : (p.group ? K / p.group : 1);

  const uint8_t* wptr[2];  // the lane's two weight rows, their scale (and zero) rows
  int64_t srow[2];
  bool wok[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int feat = col0 + rg * 16 + h * 8 + g;
    wok[h] = feat < N;
    const int64_t wrow = static_cast<int64_t>(expert) * N + (wok[h] ? feat : 0);
    wptr[h] = p.B + wrow * (KIND == MB_WOQ_INT8 ? K : K / 2);
    srow[h] = wrow * groups;
  }
  const bool aok = g < rows;
  const int64_t arow_index = row_begin + (aok ? g : 0);
  const T* arow = static_cast<const T*>(p.A) + arow_index * K;
  const uint8_t* arow8 = static_cast<const uint8_t*>(p.A) + arow_index * K;  // A8: the token row's bytes

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  const int kslice = ((K + WK * 128 - 1) / (WK * 128)) * 128;
  const int kb = ks * kslice, ke = min(K, kb + kslice);

  constexpr int AU = A8 ? 2 : U;  // 16-byte token loads per batch: 32 e4m3 bytes, or four steps of 8 T
  uint4 w[S][2][RAW], a[2][AU];
  uint32_t sv[S][2], zv[S][2];  // the stored scale and zero of each slot's rows
  auto load_weights = [&](int slot, int k0) {
    const int k = k0 + 32 * q;  // this lane's 32 k
    const bool kin = k < ke;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const bool ok = kin && wok[h];
      const uint8_t* src = wptr[h] + (KIND == MB_WOQ_INT8 ? k : k / 2);
#pragma unroll
      for (int r = 0; r < RAW; ++r) w[slot][h][r] = ld_weights(src + 16 * r, ok);
      const int64_t si = srow[h] + ((k >> group_shift) & group_mask);
      sv[slot][h] = KIND == MB_WOQ_MXFP4 ? ld_u8(static_cast<const uint8_t*>(p.scales) + si, ok)
                                         : ld_b32(static_cast<const float*>(p.scales) + si, ok);
      zv[slot][h] = KIND == MB_WOQ_INT4 && p.zeros ? ld_u8(p.zeros + si, ok) : 8u;
    }
  };
  auto load_tokens = [&](int buf, int k0) {
    const int k = k0 + 32 * q;
    if constexpr (A8) {
#pragma unroll
      for (int j = 0; j < AU; ++j) a[buf][j] = ld_tokens(arow8 + k + 16 * j, k < ke && aok);
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) a[buf][u] = ld_tokens(arow + k + 8 * u, k < ke && aok);
    }
  };
  auto compute = [&](int slot, int buf) {
    RowConsts rc[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) rc[h] = row_consts<KIND>(woq_consts<T, KIND>(sv[slot][h], zv[slot][h]));
    auto run = [&](auto fast_tag) {
      constexpr bool kFast = decltype(fast_tag)::value;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        uint32_t frag[2][4];  // k 8u + 0..3 and 8u + 4..7: {row g, row g + 8, row g, row g + 8}
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint4& r = w[slot][h][KIND == MB_WOQ_INT8 ? u >> 1 : 0];
          const uint32_t words[4] = {r.x, r.y, r.z, r.w};
          uint32_t pairs[4];
          dequant_step<T, KIND, kFast>(words[u], make_uint2(words[(u & 1) * 2], words[(u & 1) * 2 + 1]), rc[h],
                                       pairs);
          frag[0][h] = pairs[0];
          frag[0][2 + h] = pairs[1];
          frag[1][h] = pairs[2];
          frag[1][2 + h] = pairs[3];
        }
        uint4 tok;  // the token row's 8 T at step u's k
        if constexpr (A8) {
          const uint4& r8 = a[buf][u >> 1];
          tok = u & 1 ? e4m3_pairs<T>(r8.z, r8.w) : e4m3_pairs<T>(r8.x, r8.y);
        } else {
          tok = a[buf][u];
        }
        mma16816<MmaName<T>::kBf16>(acc, frag[0], tok.x, tok.y);
        mma16816<MmaName<T>::kBf16>(acc, frag[1], tok.z, tok.w);
      }
    };
    if constexpr (KIND == MB_WOQ_MXFP4) {
      if (__all_sync(0xffffffffu, rc[0].a && rc[1].a)) {
        run(std::true_type{});
      } else {
        run(std::false_type{});
      }
    } else {
      run(std::true_type{});
    }
  };
  // Weights and their constants (nothing upstream writes them) are requested before waiting for the kernel that
  // writes A; loads past the slice are predicated off.
#pragma unroll
  for (int s = 0; s < S; ++s) load_weights(s, kb + 128 * s);
  mb::wait_for_predecessor();
  mb::let_dependents_start();
  load_tokens(0, kb);
  for (int k0 = kb; k0 < ke; k0 += S * 128) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      const int kc = k0 + 128 * s;
      if (kc < ke) {  // warp-uniform
        load_tokens((s + 1) & 1, kc + 128);
        compute(s, s & 1);
        load_weights(s, kc + 128 * S);
      }
    }
  }
  // Accumulator: fragment rows g and g + 8, tokens 2q and 2q + 1 -> shared.
#pragma unroll
  for (int c = 0; c < 4; ++c) s_part[ks][rg * 16 + g + (c >> 1) * 8][2 * q + (c & 1)] = acc[c];
  __syncthreads();

  const T* bias = p.bias ? static_cast<const T*>(p.bias) + static_cast<int64_t>(expert) * N : nullptr;
  // One thread per (token, output column pair); the K slices' partials summed in fixed order.
  for (int idx = threadIdx.x; idx < kDecodeTokens * (R / 2); idx += kDecodeThreads) {
    const int t = idx / (R / 2), c = 2 * (idx % (R / 2));
    const int col = col0 + c;
    if (t >= rows || col >= N) continue;  // N even: col + 1 < N too
    float v[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float s = 0.f;
#pragma unroll
      for (int wi = 0; wi < WK; ++wi) s += s_part[wi][c + j][t];
      v[j] = s;
    }
    if constexpr (A8) {
      const float sa = p.scale_a[row_begin + t];
      v[0] *= sa;
      v[1] *= sa;
    }
    if (bias) {
      const float2 b = P2::to_float2(*reinterpret_cast<const typename P2::type*>(bias + col));
      v[0] += b.x;
      v[1] += b.y;
    }
    *reinterpret_cast<typename P2::type*>(static_cast<T*>(p.C) + (row_begin + t) * N + col) = P2::make(v[0], v[1]);
  }
}

template <typename T, int KIND, bool A8 = false>
mb_status launch_kind(const WoqGemmParams& p, int64_t max_rows, int k_split, bool after_trigger, cudaStream_t stream) {
  return by_k_split(k_split, [&](auto wk) {
    constexpr int WK = decltype(wk)::value;
    return launch_decode(grouped_woq_decode_kernel<T, KIND, WK, A8>, p, p.n, 16 * (kDecodeWarps / WK),
                         decode_chunks(max_rows, p.num_experts), after_trigger, stream, "grouped gemm woq");
  });
}

}  // namespace

mb_status launch_woq_decode(const WoqGemmParams& p, int64_t max_rows, int dtype, int k_split, bool after_trigger,
                            cudaStream_t stream) {
  return dispatch_16bit(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (p.scale_a) return launch_kind<T, MB_WOQ_INT4, true>(p, max_rows, k_split, after_trigger, stream);  // W4AFP8
    switch (p.kind) {
      case MB_WOQ_INT8: return launch_kind<T, MB_WOQ_INT8>(p, max_rows, k_split, after_trigger, stream);
      case MB_WOQ_MXFP4: return launch_kind<T, MB_WOQ_MXFP4>(p, max_rows, k_split, after_trigger, stream);
      default: return launch_kind<T, MB_WOQ_INT4>(p, max_rows, k_split, after_trigger, stream);
    }
  });
}

}  // namespace mbk
