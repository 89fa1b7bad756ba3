// Weight-only grouped GEMM, decode kernel (tactic kernel MB_GEMM_DECODE; the operation, the stored forms and the
// launch are gemm/woq.cuh's and gemm/woq_abi.cu's): for the few rows per expert of decode.
//   MB_WOQ_INT4 : B uint8 [E, n, k/2], two 4-bit codes u per byte (low nibble the even column);
//                 w = (u - z) * s, s fp32 [E, n, k/group] (group 0: [E, n, 1]), z uint8 of the same shape, or
//                 8 when zeros is NULL (symmetric int4 stored as q + 8);
//   MB_WOQ_INT8 : B int8 [E, n, k]; w = q * s;
//   MB_WOQ_MXFP4: B uint8 [E, n, k/2] e2m1 codes, scales uint8 e8m0 [E, n, k/32]; w = e2m1(u) * 2^(e - 127).
// The dequantized weight is computed in fp32 and rounded once to A's type before the mma (as TensorRT-LLM's
// mixed-input GEMMs do).
//
// The layout of gemm/decode.cu (swap-AB: weights are the 16-row A operand, up to 8 token rows the B
// operand; CTA = 8 warps = (expert, chunk of <= 8 rows, 128 / WK weight rows); WK warps split K; partial
// sums reduced in fixed warp order), with one difference in how a lane walks k: a lane takes 32
// consecutive k of its two weight rows per batch (16 bytes of int4 or MXFP4, 32 of int8: whole sectors),
// spent over the batch's four k32 steps as k = 32q + 8u + {0..7} for step u. The dot product does not care
// which physical k fills which fragment slot as long as a lane's weights and tokens agree, and the lane's
// token row is read at the same k. A lane's 32 k lie in one scale group (groups are 32, 64 or 128 and the
// batches start on multiples of 128), so a batch needs one scale (and zero) per weight row.
#include <cstdint>

#include "gemm/decode_launch.cuh"
#include "gemm/loads.cuh"
#include "gemm/mma.cuh"
#include "gemm/woq.cuh"

namespace mbk {
namespace {

// The 8 weights of one step (physical k = 32q + 8u + i) of one row, dequantized to fp32.
template <int KIND>
__device__ __forceinline__ void dequant8(const uint4* raw, int u, float scale, float zero, float (&v)[8]) {
  if constexpr (KIND == MB_WOQ_INT8) {
    const uint4& r = raw[u >> 1];
    const uint32_t words[4] = {r.x, r.y, r.z, r.w};
    const uint32_t lo = words[(u & 1) * 2], hi = words[(u & 1) * 2 + 1];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t byte = ((i < 4 ? lo : hi) >> (8 * (i & 3))) & 0xffu;
      v[i] = static_cast<float>(static_cast<int8_t>(byte)) * scale;
    }
  } else {
    const uint32_t words[4] = {raw[0].x, raw[0].y, raw[0].z, raw[0].w};
    const uint32_t w = words[u];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t c = (w >> (4 * i)) & 0xfu;
      v[i] = KIND == MB_WOQ_MXFP4 ? e2m1(c) * scale : (static_cast<float>(c) - zero) * scale;
    }
  }
}

template <typename T, int KIND, int WK>
__global__ void __launch_bounds__(kDecodeThreads) grouped_woq_decode_kernel(WoqGemmParams p) {
  constexpr int R = 16 * (kDecodeWarps / WK);  // weight rows per CTA (= output columns)
  constexpr int U = 4;                       // k32 steps per batch (128 k)
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
  // k per scale: MXFP4's fixed 32, or the group, or all of K (one scale per row)
  const int group = KIND == MB_WOQ_MXFP4 ? kMxfp4Group : (p.group ? p.group : K);
  const int groups = K / group;

  int64_t wrow[2];  // expert-wide row index of the lane's two weight rows
  bool wok[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int feat = col0 + rg * 16 + h * 8 + g;
    wok[h] = feat < N;
    wrow[h] = static_cast<int64_t>(expert) * N + (wok[h] ? feat : 0);
  }
  const bool aok = g < rows;
  const T* arow = static_cast<const T*>(p.A) + (row_begin + (aok ? g : 0)) * K;

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  const int kslice = ((K + WK * 128 - 1) / (WK * 128)) * 128;
  const int kb = ks * kslice, ke = min(K, kb + kslice);

  uint4 w[2][2][RAW], a[2][U];
  float sc[2][2], zr[2][2];
  auto load_weights = [&](int buf, int k0) {
    const int k = k0 + 32 * q;  // this lane's 32 k
    const bool kin = k < ke;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const bool ok = kin && wok[h];
      const int64_t byte = KIND == MB_WOQ_INT8 ? wrow[h] * K + k : (wrow[h] * K + k) / 2;
#pragma unroll
      for (int r = 0; r < RAW; ++r) w[buf][h][r] = ld_weights(p.B + byte + 16 * r, ok);
      const int64_t si = wrow[h] * groups + (ok ? k / group : 0);
      if constexpr (KIND == MB_WOQ_MXFP4) {
        const int e = ok ? static_cast<const uint8_t*>(p.scales)[si] : 127;
        sc[buf][h] = ldexpf(1.0f, e - 127);
        zr[buf][h] = 0.f;
      } else {
        sc[buf][h] = ok ? static_cast<const float*>(p.scales)[si] : 0.f;
        zr[buf][h] = KIND == MB_WOQ_INT4 ? (p.zeros && ok ? static_cast<float>(p.zeros[si]) : 8.f) : 0.f;
      }
    }
  };
  auto load_tokens = [&](int buf, int k0) {
    const int k = k0 + 32 * q;
#pragma unroll
    for (int u = 0; u < U; ++u) a[buf][u] = ld_tokens(arow + k + 8 * u, k < ke && aok);
  };
  auto compute = [&](int buf) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float v0[8], v1[8];
      dequant8<KIND>(w[buf][0], u, sc[buf][0], zr[buf][0], v0);
      dequant8<KIND>(w[buf][1], u, sc[buf][1], zr[buf][1], v1);
      auto pack = [](float x, float y) {
        const typename P2::type t = P2::make(x, y);
        return *reinterpret_cast<const uint32_t*>(&t);
      };
      const uint32_t lo[4] = {pack(v0[0], v0[1]), pack(v1[0], v1[1]), pack(v0[2], v0[3]), pack(v1[2], v1[3])};
      const uint32_t hi[4] = {pack(v0[4], v0[5]), pack(v1[4], v1[5]), pack(v0[6], v0[7]), pack(v1[6], v1[7])};
      mma16816<MmaName<T>::kBf16>(acc, lo, a[buf][u].x, a[buf][u].y);
      mma16816<MmaName<T>::kBf16>(acc, hi, a[buf][u].z, a[buf][u].w);
    }
  };
  if (kb < ke) load_weights(0, kb);
  mb::wait_for_predecessor();
  mb::let_dependents_start();
  if (kb < ke) load_tokens(0, kb);
  for (int k0 = kb; k0 < ke; k0 += 2 * 128) {
    load_weights(1, k0 + 128);  // predicated off past the slice
    load_tokens(1, k0 + 128);
    compute(0);
    if (k0 + 256 < ke) {
      load_weights(0, k0 + 256);
      load_tokens(0, k0 + 256);
    }
    compute(1);
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
    if (bias) {
      const float2 b = P2::to_float2(*reinterpret_cast<const typename P2::type*>(bias + col));
      v[0] += b.x;
      v[1] += b.y;
    }
    *reinterpret_cast<typename P2::type*>(static_cast<T*>(p.C) + (row_begin + t) * N + col) = P2::make(v[0], v[1]);
  }
}

template <typename T, int KIND>
mb_status launch_kind(const WoqGemmParams& p, int64_t max_rows, int k_split, bool after_trigger, cudaStream_t stream) {
  return by_k_split(k_split, [&](auto wk) {
    constexpr int WK = decltype(wk)::value;
    return launch_decode(grouped_woq_decode_kernel<T, KIND, WK>, p, p.n, 16 * (kDecodeWarps / WK),
                         decode_chunks(max_rows, p.num_experts), after_trigger, stream, "grouped gemm woq");
  });
}

}  // namespace

mb_status launch_woq_decode(const WoqGemmParams& p, int64_t max_rows, int dtype, int k_split, bool after_trigger,
                            cudaStream_t stream) {
  return dispatch_16bit(dtype, [&](auto tag) {
    using T = decltype(tag);
    switch (p.kind) {
      case MB_WOQ_INT8: return launch_kind<T, MB_WOQ_INT8>(p, max_rows, k_split, after_trigger, stream);
      case MB_WOQ_MXFP4: return launch_kind<T, MB_WOQ_MXFP4>(p, max_rows, k_split, after_trigger, stream);
      default: return launch_kind<T, MB_WOQ_INT4>(p, max_rows, k_split, after_trigger, stream);
    }
  });
}

}  // namespace mbk
