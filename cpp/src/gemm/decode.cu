// Decode grouped GEMM (tactic kernel MB_GEMM_DECODE, both entry points): few token rows per expert, so a
// GEMM is a stream of expert weights and the kernel's job is to keep HBM busy.
//
// Swap-AB mma.sync: weights are the 16-row "A" operand, tokens the 8-column "B" operand, so one
// m16n8k16 uses all of its 8 columns for up to 8 tokens instead of padding tokens to 16+ rows.
// Weights go from HBM straight into registers (16-byte no-L1 loads, no shared-memory staging): a
// dot product does not care in which order k is summed, so each lane loads 8 consecutive k of
// its two weight rows and the same 8 k of its token row, and those 8 values fill the lane's
// fragment slots of two mmas (slots {2q, 2q+1, 2q+8, 2q+9} take k = 8q + {0..3}, then 8q + {4..7}).
// Four lanes cover 32 consecutive k of a row per step; four steps per load batch give 256-byte
// contiguous reads per weight row, and a register double buffer keeps a whole batch in flight.
// Weights in MB_WEIGHTS_BLOCKED64's 64 x 64 blocks (sm90 entry points) are read the same way, each
// lane's 8 k at its block's address (weight_row_offset / weight_col_offset): 128-byte runs per row,
// whose neighbours in the block (the next rows) other lanes read.
//
// CTA = 8 warps = one (expert, chunk of up to 8 token rows, 128 / WK weight rows) unit, WK being the
// tactic's k_split: WK warps split K into contiguous slices, 8 / WK row groups of 16 rows each;
// partial sums meet in shared memory and are reduced in fixed warp order (bit-reproducible). The grid
// is sized from host-known bounds (chunks <= ceil(max_rows / 8) + min(E, max_rows)) and each CTA finds
// its chunk with find_tile, so no host sync and CUDA-graph capturable; CTAs past the real chunk count
// exit at once. Experts with more than 8 rows take several chunks (their weights then come from L2).
// Epilogues as the mma.sync kernel: STORE (bias + activation), GATED (8 gate + the matching 8 up
// rows per warp, act(gate) * up), FINALIZE (w * (acc + bias) atomically added to the token row).
#include "gemm/decode_launch.cuh"
#include "gemm/loads.cuh"
#include "gemm/mma.cuh"

namespace mbk {
namespace {

// Output columns of one CTA: 16 features per row group (GATED: 8 gate + their 8 up rows).
constexpr int decode_out_cols(int epilogue, int wk) {
  return (epilogue == EPI_GATED ? 8 : 16) * (kDecodeWarps / wk);
}

// WK warps of a CTA split K (each a contiguous slice), the other 8 / WK row groups each own 16
// weight rows, so a CTA covers R = 128 / WK rows: with WK = 1 every warp streams whole rows front to
// back, a larger WK makes more CTAs of a grid with few (expert, row block) units.
// A warp's 16 rows: STORE/FINALIZE 16 output features; GATED 8 gate features (fragment rows 0-7)
// and the same 8 up features (rows 8-15).
template <typename T, int EPI, int WK, bool BLOCKED>
__global__ void __launch_bounds__(kDecodeThreads) grouped_decode_kernel(GemmParams p) {
  constexpr int R = 16 * (kDecodeWarps / WK);                  // weight rows per CTA
  constexpr int OUT_COLS = decode_out_cols(EPI, WK);
  constexpr int FEATS = EPI == EPI_GATED ? 8 : 16;             // output features per warp
  constexpr int U = 4;                                          // k32 steps per load batch
  __shared__ float s_part[WK][R][kDecodeTokens + 1];

  const TileRows tile = cta_find_tile<kDecodeTokens>(p.offsets, p.num_experts);
  const int expert = tile.expert;
  if (expert < 0) return;
  const int64_t row_begin = tile.begin;
  const int rows = (int)(tile.end - row_begin);
  const int N = p.n, K = p.k;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int q = lane & 3, g = lane >> 2;
  const int rg = warp / WK, ks = warp % WK;
  const int col0 = blockIdx.y * OUT_COLS;  // first output column of this CTA

  const T* B = static_cast<const T*>(p.B) + (int64_t)expert * (EPI == EPI_GATED ? 2 : 1) * N * K;
  // The expert's rows start on a 64-row block boundary in the blocked layout too (NB * N % 64 == 0),
  // so only the offsets inside the expert depend on the layout; a lane's 8 k never cross a block. The
  // layout is a template parameter: the row-major loads stay the plain row + k.
  const T* wrow[2];
  bool wok[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int feat = col0 + rg * FEATS + (EPI == EPI_GATED ? g : h * 8 + g);
    const int64_t brow = EPI == EPI_GATED ? gated_row(feat, h, N, p.gate_up_interleaved) : feat;
    wok[h] = feat < N;
    wrow[h] = B + weight_row_offset(wok[h] ? brow : 0, K, BLOCKED);
  }
  const bool aok = g < rows;
  const T* arow = static_cast<const T*>(p.A) + (row_begin + (aok ? g : 0)) * K;

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  // This warp's K slice: a multiple of 128 elements (slices start on 256-byte boundaries of the
  // row, matching the L2::256B reads), the last one shorter (K % 8 == 0, so a lane's 8-element
  // load is either wholly inside or wholly outside).
  const int kslice = decode_k_slice(K, WK);
  const int kb = ks * kslice, ke = min(K, kb + kslice);
  // Register double buffer: batch i + 1 is loaded before batch i's mmas, so a batch's loads are
  // in flight together whatever order ptxas picks inside an iteration (left to itself it sinks
  // each load next to its mma: one load in flight per warp).
  uint4 w[2][U][2], a[2][U];
  auto load_weights = [&](int buf, int k0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = k0 + u * 32 + q * 8;
      const bool kin = k < ke;
      const int64_t kc = weight_col_offset(k, BLOCKED);
      w[buf][u][0] = ld_weights(wrow[0] + kc, kin && wok[0]);
      w[buf][u][1] = ld_weights(wrow[1] + kc, kin && wok[1]);
    }
  };
  auto load_tokens = [&](int buf, int k0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = k0 + u * 32 + q * 8;
      a[buf][u] = ld_tokens(arow + k, k < ke && aok);
    }
  };
  auto load = [&](int buf, int k0) {
    load_weights(buf, k0);
    load_tokens(buf, k0);
  };
  auto compute = [&](int buf) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint32_t lo[4] = {w[buf][u][0].x, w[buf][u][1].x, w[buf][u][0].y, w[buf][u][1].y};
      const uint32_t hi[4] = {w[buf][u][0].z, w[buf][u][1].z, w[buf][u][0].w, w[buf][u][1].w};
      mma16816<MmaName<T>::kBf16>(acc, lo, a[buf][u].x, a[buf][u].y);
      mma16816<MmaName<T>::kBf16>(acc, hi, a[buf][u].z, a[buf][u].w);
    }
  };
  // Launched after a trigger (launch_after_trigger), this CTA may run while the previous kernel
  // (the expansion, or GEMM1) still writes A: the expert offsets it found its tile with were
  // written before that kernel started and the weights by nobody, so the first weight batch is
  // loaded before waiting and only the token rows after.
  if (kb < ke) load_weights(0, kb);
  mb::wait_for_predecessor();
  mb::let_dependents_start();
  if (kb < ke) load_tokens(0, kb);
  for (int k0 = kb; k0 < ke; k0 += 2 * 32 * U) {
    load(1, k0 + 32 * U);  // predicated off past the slice
    compute(0);
    if (k0 + 2 * 32 * U < ke) load(0, k0 + 2 * 32 * U);
    compute(1);
  }
  // Accumulator: fragment rows g and g + 8, tokens 2q and 2q + 1 -> shared.
#pragma unroll
  for (int c = 0; c < 4; ++c) s_part[ks][rg * 16 + g + (c >> 1) * 8][2 * q + (c & 1)] = acc[c];
  __syncthreads();

  using P2 = Pair<T>;
  const T* bias = p.bias ? static_cast<const T*>(p.bias) + (int64_t)expert * (EPI == EPI_GATED ? 2 : 1) * N
                         : nullptr;
  // One thread per (token, output column pair); warp-slice partials summed in fixed order.
  for (int idx = threadIdx.x; idx < kDecodeTokens * (OUT_COLS / 2); idx += kDecodeThreads) {
    const int t = idx / (OUT_COLS / 2), c = 2 * (idx % (OUT_COLS / 2));
    const int col = col0 + c;
    if (t >= rows || col >= N) continue;  // N and col are even: col + 1 < N too
    float v[2], up[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      // CTA row of output column c + j (GATED: its gate row; the up row is 8 further)
      const int r = EPI == EPI_GATED ? ((c + j) / 8) * 16 + (c + j) % 8 : c + j;
      float s = 0.f, su = 0.f;
#pragma unroll
      for (int wi = 0; wi < WK; ++wi) {
        s += s_part[wi][r][t];
        if constexpr (EPI == EPI_GATED) su += s_part[wi][r + 8][t];
      }
      v[j] = s;
      up[j] = su;
    }
    if (bias) {
      const bool il = EPI == EPI_GATED && p.gate_up_interleaved;
      const float2 b = P2::to_float2(*reinterpret_cast<const typename P2::type*>(bias + gated_row(col, 0, N, il)));
      v[0] += b.x;
      v[1] += b.y;
      if constexpr (EPI == EPI_GATED) {
        const float2 bu =
            P2::to_float2(*reinterpret_cast<const typename P2::type*>(bias + gated_row(col, 1, N, il)));
        up[0] += bu.x;
        up[1] += bu.y;
      }
    }
    const int64_t prow = row_begin + t;
    if constexpr (EPI == EPI_GATED) {
      v[0] = apply_gated(p.activation, v[0], up[0], p.swiglu_alpha, p.swiglu_limit);
      v[1] = apply_gated(p.activation, v[1], up[1], p.swiglu_alpha, p.swiglu_limit);
    } else if constexpr (EPI == EPI_STORE) {
      v[0] = apply_act(p.activation, v[0]);
      v[1] = apply_act(p.activation, v[1]);
    }
    if constexpr (EPI == EPI_FINALIZE) {
      finalize_add_pair<T>(p.C, p.permuted_to_unpermuted, p.permuted_weights, p.top_k, prow, N, col, v[0], v[1]);
    } else {
      *reinterpret_cast<typename P2::type*>(static_cast<T*>(p.C) + prow * N + col) = P2::make(v[0], v[1]);
    }
  }
}

// Launched after a trigger, the kernel loads its first weights under the previous kernel's tail (see the
// wait in the kernel); launched plainly, that wait returns at once.
template <typename T, int EPI, bool BLOCKED>
mb_status launch_layout(const GemmParams& p, int64_t max_rows, int k_split, bool after_trigger, cudaStream_t stream) {
  return by_k_split(k_split, [&](auto wk) {
    constexpr int WK = decltype(wk)::value;
    return launch_decode(grouped_decode_kernel<T, EPI, WK, BLOCKED>, p, p.n, decode_out_cols(EPI, WK),
                         decode_chunks(max_rows, p.num_experts), after_trigger, stream, "grouped gemm decode");
  });
}

template <typename T, int EPI>
mb_status launch_epi(const GemmParams& p, int64_t max_rows, int k_split, bool after_trigger, cudaStream_t stream) {
  return p.weights_blocked ? launch_layout<T, EPI, true>(p, max_rows, k_split, after_trigger, stream)
                           : launch_layout<T, EPI, false>(p, max_rows, k_split, after_trigger, stream);
}

}  // namespace

mb_status launch_grouped_decode(const GemmParams& p, int64_t max_rows, int dtype, int epilogue, int k_split,
                                bool after_trigger, cudaStream_t stream) {
  MB_TRY(check_grouped_args(p, max_rows, epilogue));
  if (max_rows == 0) return MB_OK;
  return dispatch_16bit(dtype, [&](auto tag) {
    using T = decltype(tag);
    switch (epilogue) {
      case EPI_GATED: return launch_epi<T, EPI_GATED>(p, max_rows, k_split, after_trigger, stream);
      case EPI_FINALIZE: return launch_epi<T, EPI_FINALIZE>(p, max_rows, k_split, after_trigger, stream);
      default: return launch_epi<T, EPI_STORE>(p, max_rows, k_split, after_trigger, stream);
    }
  });
}

}  // namespace mbk
