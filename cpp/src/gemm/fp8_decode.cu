// FP8 decode grouped GEMM (mb_grouped_gemm_fp8, tactic kernel MB_GEMM_DECODE; sm_89 and later): few token
// rows per expert, so the GEMM is a stream of e4m3 weights and the kernel's job is to keep HBM busy, as
// the 16-bit decode kernel (gemm/decode.cu) does, whose layout this follows.
//
// Swap-AB mma.sync m16n8k32 e4m3 (fp32 accumulators): weights are the 16-row "A" operand, tokens the
// 8-column "B" operand. Each lane loads 16 consecutive k (16 bytes) of its two weight rows and the same
// 16 k of its token row; a dot product does not care in which order k is summed, so bytes 0-3 / 4-7
// fill the lane's k slots {4q..4q+3} / {16+4q..16+4q+3} of one mma and bytes 8-15 those of a second,
// identically for weights and tokens. Four lanes cover 64 consecutive k per step; four steps per load
// batch give 256-byte contiguous reads per weight row, and a register double buffer keeps a whole batch
// (and its scales) in flight.
//
// Scales (gemm/fp8.cuh): ROWWISE multiplies the fp32 sums by sa[row] * sb[expert, column] at the end;
// BLOCK128 sums each 128-k block (two steps) into a partial that is scaled by sa[row, kb] *
// sb[expert, column / 128, kb] and added to the accumulator (a warp's 16 weight rows lie in one
// 128-row block; gated on stacked W1, its 8 gate rows in one and its 8 up rows in one, each lane loading
// both), so no block's sum is rounded before its scale, as the block-scaled reference does.
//
// Epilogues (p.epilogue): the plain store; the finalize (as gemm/decode.cu's): each output pair times its
// row's routing weight, added with one packed 2-element atomic into the token's output row; or the gated
// activation: each warp's 16 weight rows are 8 gate rows and their 8 up rows (lane g's rows g and g + 8), so each
// output feature pair finds its gate and up sums in the CTA's shared partials. With rowwise scales W1 comes
// interleaved in blocks of 8 (CTA row r is W1 row col0 + r); with block-128 scales it comes stacked as the
// checkpoint stores it (gate row f, up row inter + f: the 128-row scale blocks stay whole), so each lane loads the
// scales of its gate row's block and of its up row's (gated_w1_row). With a static scale (p.c_static_scale,
// fc2_input_quant=gemm1) each pair is rounded to T and written as two e4m3 bytes, the quantize step's bytes, and each
// row's scale by the thread of its first feature.
//
// Quantizing (QA; mb_grouped_gemm_fp8_quantizing_finalize, the plan's fc2_input_quant=gemm2): A is the 16-bit rows
// GEMM1's gated epilogue wrote, and each CTA quantizes its chunk's rows into shared memory after it waits for them
// (quantize_chunk_rows: per row, or with block-128 scales per 128-column group), with fp8_quantize.cuh's unit
// functions, so they hold the bytes and scales the quantize step would have written; the mainloop then reads its
// token rows (and group scales) there. Each CTA of a chunk repeats that work before its first product, so it pays
// where GEMM2's CTAs are few (the planner's rule fc2_quant_gemm2_waves); there it saves the quantize kernel (or the
// block-128 layers' activation kernel) between the GEMMs, 2-5 us of a 1-token layer.
//
// CTA = 8 warps = one (expert, chunk of up to 8 token rows, 128 / WK weight rows) unit; WK warps split K
// into slices of whole 128-k blocks; partial sums meet in shared memory and are reduced in fixed warp
// order (bit-reproducible). The grid is sized from host-known bounds and each CTA finds its chunk with
// cta_find_tile: no host sync, CUDA-graph capturable.
#include "common/fp8_quantize.cuh"
#include "gemm/decode_launch.cuh"
#include "gemm/fp8.cuh"
#include "gemm/loads.cuh"
#include "gemm/mma.cuh"

namespace mbk {
namespace {

constexpr int kStepK = 64;  // k per step: 4 lanes x 16 bytes
constexpr int kSteps = 4;   // steps per load batch: 256 bytes of each weight row

__device__ __forceinline__ void mma_e4m3(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // never launched: the entry point refuses devices below compute capability 8.9
#endif
}

__device__ __forceinline__ float ld_scale(const float* p, bool valid) { return valid ? __ldg(p) : 0.f; }

// Bytes between a chunk's quantized rows in shared memory (QA): k rounded up to 128, plus 64, so that the two rows
// whose 64 bytes a quarter warp's 16-byte loads read (lanes of tokens g and g + 1) fall on different banks.
__host__ __device__ constexpr int quantized_row_stride(int k) { return (k + 127) / 128 * 128 + 64; }

// The chunk's `rows` (1 to 8) 16-bit rows of k elements at src, quantized into dst's rows (stride bytes apart) and
// their scales into row_scale, as mb_quantize_fp8 quantizes a row (static_scale, or the row's own amax; kGroups: each
// 128-column group's own amax, its scale at row_scale[row * fp8_k_blocks(k) + group]): the same unit functions of
// common/fp8_quantize.cuh, so the same bytes. A row takes 256 / rows' power of two threads, so that one or two rows,
// the usual chunk at decode, are read by the whole CTA at once; per row, the first kB units of each thread stay in
// registers from the amax pass to the quantizing pass, the rest are read again (an L1 hit); per group, a group's 16
// units are 16 adjacent lanes of one warp (a 4-step shuffle), so each unit is read once.
// Every thread of the CTA calls it; the caller synchronizes before reading dst.
template <typename T, bool kGroups>
__device__ __forceinline__ void quantize_chunk_rows(const T* src, const float* static_scale, int rows, int k,
                                                    uint8_t* dst, int stride, float* row_scale) {
  namespace fp8 = mb::fp8;
  constexpr int kB = 4;  // units (8 elements) in flight per thread
  __shared__ float warp_amax[kDecodeWarps];
  int rows2 = 1;  // rows rounded up to a power of two
  while (rows2 < rows) rows2 *= 2;
  const int group = kDecodeThreads / rows2;  // threads per row: 32 to 256
  const int row = threadIdx.x / group, t = threadIdx.x % group;
  const bool mine = row < rows;
  const T* in = src + static_cast<int64_t>(mine ? row : 0) * k;
  const int units = k / fp8::kVec;
  const float ones[fp8::kVec] = {1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f};
  auto load = [&](int u) { return mine && u < units ? *reinterpret_cast<const uint4*>(in + u * fp8::kVec)
                                                    : uint4{0u, 0u, 0u, 0u}; };
  auto load_batch = [&](int u0, uint4 (&x)[kB]) {  // the thread's kB units of the pass's tile at u0, kB loads in flight
#pragma unroll
    for (int i = 0; i < kB; ++i) x[i] = load(u0 + i * group + t);
  };
  if constexpr (kGroups) {
    static_assert(fp8::kGroupLanes == 16, "a 128-column group is 16 units");
    const int kbn = fp8_k_blocks(k);
    for (int u0 = 0; u0 < units; u0 += kB * group) {  // the same bounds in every thread: all reach the shuffles
      uint4 x[kB];
      load_batch(u0, x);
#pragma unroll
      for (int i = 0; i < kB; ++i) {
        const int u = u0 + i * group + t;  // group and u0 are multiples of 16: lanes t..t+15 hold one group
        float m = fp8::unit_amax_packed<T>(x[i]);
#pragma unroll
        for (int lanes = 1; lanes < fp8::kGroupLanes; lanes *= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, lanes));
        const float s = fp8::dynamic_scale(m);
        if (mine && u < units) {
          *reinterpret_cast<fp8::Bytes*>(dst + row * stride + u * fp8::kVec) =
              fp8::quantize_unit_by<T>(x[i], s, __frcp_rn(s));
          if (u % fp8::kGroupLanes == 0) row_scale[row * kbn + u / fp8::kGroupLanes] = s;
        }
      }
    }
    return;
  }
  uint4 keep[kB];
  float s;
  if (static_scale != nullptr) {
    s = __ldg(static_scale);
  } else {
    float amax = 0.f;
    for (int u0 = 0; u0 < units; u0 += kB * group) {  // the same bounds in every thread: all reach the shuffles
      uint4 x[kB];
      load_batch(u0, x);
#pragma unroll
      for (int i = 0; i < kB; ++i) {
        amax = fmaxf(amax, fp8::unit_amax<T>(x[i], ones));
        if (u0 == 0) keep[i] = x[i];
      }
    }
    amax = mb::lanes_max(amax);
    if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
    __syncthreads();
    float m = 0.f;
    for (int w = row * group / 32; w < (row + 1) * group / 32; ++w) m = fmaxf(m, warp_amax[w]);
    s = fp8::dynamic_scale(m);
  }
  if (!mine) return;
  for (int u0 = 0; u0 < units; u0 += kB * group) {
#pragma unroll
    for (int i = 0; i < kB; ++i) {
      const int u = u0 + i * group + t;
      if (u >= units) continue;
      const uint4 x = u0 == 0 && static_scale == nullptr ? keep[i] : load(u);
      *reinterpret_cast<fp8::Bytes*>(dst + row * stride + u * fp8::kVec) = fp8::quantize_unit<T>(x, s, ones);
    }
  }
  if (t == 0) row_scale[row] = s;
}

// The W1 row of CTA row r (the CTA's first output column col0) under the gated epilogue: interleaved in blocks of 8,
// col0 + r; stacked (block-128 scales), gate feature f = col0 / 2 + 8 (r / 16) + r % 8 at row f, its up row at
// inter + f.
template <bool kStacked>
__device__ __forceinline__ int gated_w1_row(int col0, int r, int inter) {
  if constexpr (!kStacked) return col0 + r;
  const int f = col0 / 2 + 8 * (r / 16) + r % 8;
  return r % 16 < 8 ? f : inter + f;
}

// The kernels' body (below it the two kernels: the plain one and the quantizing one, QA).
template <typename T, int SCALING, int WK, int EPI, bool QA>
__device__ __forceinline__ void fp8_decode_body(const Fp8GemmParams& p) {
  constexpr int R = 16 * (kDecodeWarps / WK);  // weight rows (output columns) per CTA
  constexpr bool kBlock = SCALING == MB_FP8_BLOCK128;
  constexpr bool kStacked = kBlock && EPI == EPI_GATED;  // W1 stacked: a lane's two rows in two scale blocks
  static_assert(!kStacked || !QA, "the quantizing kernel is GEMM2's");
  __shared__ float s_part[WK][R][kDecodeTokens + 1];
  // QA: the chunk's rows quantized, quantized_row_stride(k) apart, then (block-128) their group scales
  extern __shared__ __align__(16) uint8_t s_rows[];
  __shared__ float s_row_scale[kDecodeTokens];  // QA, rowwise: the rows' scales

  const TileRows tile = cta_find_tile<kDecodeTokens>(p.offsets, p.num_experts);
  const int expert = tile.expert;
  if (expert < 0) return;
  const int64_t row_begin = tile.begin;
  const int rows = (int)(tile.end - row_begin);
  const int N = p.n, K = p.k, kbn = fp8_k_blocks(K);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int q = lane & 3, g = lane >> 2;
  const int rg = warp / WK, ks = warp % WK;
  const int col0 = blockIdx.y * R;  // first output column of this CTA
  const int inter = N / 2;          // gated: the features
  // The lane's weight rows: W1 rows w0 and w0 + 8 (interleaved or ungated), or gate row w0 and up row w1 (stacked).
  const int w0 = kStacked ? gated_w1_row<true>(col0, rg * 16 + g, inter) : col0 + rg * 16 + g;
  const int w1 = kStacked ? w0 + inter : w0 + 8;
  const bool wok0 = kStacked ? w0 < inter : w0 < N, wok1 = kStacked ? wok0 : w1 < N;
  const uint8_t* B = p.B + (int64_t)expert * N * K;
  const uint8_t* wrow0 = B + (int64_t)(wok0 ? w0 : 0) * K;
  const uint8_t* wrow1 = B + (int64_t)(wok1 ? w1 : 0) * K;
  const bool aok = g < rows;
  const uint8_t* arow = p.A + (row_begin + (aok ? g : 0)) * K;
  // BLOCK128: the lane's weight-scale rows (its two rows share a 128-row block unless stacked) and token-scale rows.
  const float* sb_row0 = p.scale_b + ((int64_t)expert * fp8_k_blocks(N) + min(w0, N - 1) / kFp8Block) * kbn;
  const float* sb_row1 = p.scale_b + ((int64_t)expert * fp8_k_blocks(N) + min(w1, N - 1) / kFp8Block) * kbn;
  // The lane's two token-scale rows 2q and 2q + 1 (adjacent: one pointer and a stride; QA: in shared memory).
  const bool tok_ok0 = 2 * q < rows, tok_ok1 = 2 * q + 1 < rows;
  const int a_stride = quantized_row_stride(K);
  float* s_group_scale = reinterpret_cast<float*>(s_rows + kDecodeTokens * a_stride);  // QA, block-128
  const float* sa_row = QA ? s_group_scale + (tok_ok0 ? 2 * q : 0) * kbn
                           : p.scale_a + (row_begin + (tok_ok0 ? 2 * q : 0)) * (kBlock ? kbn : 1);

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  // This warp's K slice: whole 128-k blocks (the last slice shorter; K % 16 == 0, so a lane's 16-byte
  // load is wholly inside or wholly outside).
  static_assert(kFp8Block == 128, "decode_k_slice cuts whole 128-k blocks");
  const int kslice = decode_k_slice(K, WK);
  const int kb = ks * kslice, ke = min(K, kb + kslice);
  uint4 w[2][kSteps][2], a[2][kSteps];
  constexpr int kScaleRows = kStacked ? 2 : 1;  // weight-scale rows a lane reads: its rows' blocks
  float sb[2][2][kScaleRows], sa[2][2][2];  // [buffer][128-k block of the batch][weight row / token]
  auto load_weights = [&](int buf, int k0) {
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      const int k = k0 + u * kStepK + q * 16;
      w[buf][u][0] = ld_weights(wrow0 + k, k < ke && wok0);
      w[buf][u][1] = ld_weights(wrow1 + k, k < ke && wok1);
    }
    if constexpr (kBlock) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        sb[buf][h][0] = ld_scale(sb_row0 + k0 / kFp8Block + h, k0 + h * kFp8Block < ke);
        if constexpr (kStacked) sb[buf][h][1] = ld_scale(sb_row1 + k0 / kFp8Block + h, k0 + h * kFp8Block < ke);
      }
    }
  };
  auto load_tokens = [&](int buf, int k0) {
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      const int k = k0 + u * kStepK + q * 16;
      if constexpr (QA)
        a[buf][u] = k < ke && aok ? *reinterpret_cast<const uint4*>(s_rows + g * a_stride + k) : uint4{0u, 0u, 0u, 0u};
      else
        a[buf][u] = ld_tokens(arow + k, k < ke && aok);
    }
    if constexpr (kBlock) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool kin = k0 + h * kFp8Block < ke;
        if constexpr (QA) {  // the group scales quantize_chunk_rows wrote
          sa[buf][h][0] = kin && tok_ok0 ? sa_row[k0 / kFp8Block + h] : 0.f;
          sa[buf][h][1] = kin && tok_ok1 ? sa_row[kbn + k0 / kFp8Block + h] : 0.f;
        } else {
          sa[buf][h][0] = ld_scale(sa_row + k0 / kFp8Block + h, kin && tok_ok0);
          sa[buf][h][1] = ld_scale(sa_row + kbn + k0 / kFp8Block + h, kin && tok_ok1);
        }
      }
    }
  };
  auto compute = [&](int buf) {
    float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      const uint32_t lo[4] = {w[buf][u][0].x, w[buf][u][1].x, w[buf][u][0].y, w[buf][u][1].y};
      const uint32_t hi[4] = {w[buf][u][0].z, w[buf][u][1].z, w[buf][u][0].w, w[buf][u][1].w};
      if constexpr (kBlock) {
        mma_e4m3(part, lo, a[buf][u].x, a[buf][u].y);
        mma_e4m3(part, hi, a[buf][u].z, a[buf][u].w);
        if (u & 1) {  // a 128-k block is complete: scale it into the accumulator
          const int h = u >> 1;
#pragma unroll
          for (int c = 0; c < 4; ++c) {  // c >> 1: the lane's weight row (g or g + 8), c & 1: its token
            acc[c] += part[c] * sb[buf][h][kStacked ? c >> 1 : 0] * sa[buf][h][c & 1];
            part[c] = 0.f;
          }
        }
      } else {
        mma_e4m3(acc, lo, a[buf][u].x, a[buf][u].y);
        mma_e4m3(acc, hi, a[buf][u].z, a[buf][u].w);
      }
    }
  };
  // Launched after a trigger, this CTA may run while the previous kernel still writes A and its scales:
  // the weights and their scales are loaded before waiting, the token rows after.
  // QA: the second batch's weights too, so that both are in flight while the rows are quantized (which the CTAs of
  // an SM, alike and started together, do at about the same time).
  constexpr int kBatch = kSteps * kStepK;
  if (kb < ke) load_weights(0, kb);
  if constexpr (QA) {
    if (kb + kBatch < ke) load_weights(1, kb + kBatch);
  }
  mb::wait_for_predecessor();
  mb::let_dependents_start();
  if constexpr (QA) {
    quantize_chunk_rows<T, kBlock>(static_cast<const T*>(p.a16) + row_begin * K, p.a16_static_scale, rows, K, s_rows,
                                   a_stride, kBlock ? s_group_scale : s_row_scale);
    __syncthreads();
  }
  if (kb < ke) load_tokens(0, kb);
  for (int k0 = kb; k0 < ke; k0 += 2 * kBatch) {
    if (k0 + kBatch < ke) {
      if (!QA || k0 != kb) load_weights(1, k0 + kBatch);
      load_tokens(1, k0 + kBatch);
    }
    compute(0);
    if (k0 + kBatch >= ke) break;
    if (k0 + 2 * kBatch < ke) {
      load_weights(0, k0 + 2 * kBatch);
      load_tokens(0, k0 + 2 * kBatch);
    }
    compute(1);
  }
  // Accumulator: fragment rows g and g + 8, tokens 2q and 2q + 1 -> shared.
#pragma unroll
  for (int c = 0; c < 4; ++c) s_part[ks][rg * 16 + g + (c >> 1) * 8][2 * q + (c & 1)] = acc[c];
  __syncthreads();

  using P2 = Pair<T>;
  const T* bias = p.bias ? static_cast<const T*>(p.bias) + (int64_t)expert * N : nullptr;
  // The scaled sum (+ bias) of CTA weight row r (output column col0 + r) for token t, warp-slice partials summed
  // in fixed order.
  auto column = [&](int r, int t, int64_t prow) {
    float s = 0.f;
#pragma unroll
    for (int wi = 0; wi < WK; ++wi) s += s_part[wi][r][t];
    if constexpr (QA && !kBlock) s *= s_row_scale[t] * p.scale_b[(int64_t)expert * N + col0 + r];
    else if constexpr (!kBlock) s *= p.scale_a[prow] * p.scale_b[(int64_t)expert * N + col0 + r];
    return s;
  };
  auto biased = [&](float2 v, int col) {  // col, col + 1: the two sums' W1 (or W2) rows
    if (bias) {
      const float2 b = P2::to_float2(*reinterpret_cast<const typename P2::type*>(bias + col));
      v.x += b.x;
      v.y += b.y;
    }
    return v;
  };
  if constexpr (EPI == EPI_GATED) {
    // One thread per (token, output feature pair): the CTA's R rows hold R / 2 features, feature f (even) of
    // block f / 8 has its gate rows at 16 (f / 8) + f % 8 (+1) and its up rows 8 further.
    for (int idx = threadIdx.x; idx < kDecodeTokens * (R / 4); idx += kDecodeThreads) {
      const int t = idx / (R / 4), f = 2 * (idx % (R / 4));
      const int r = (f / 8) * 16 + f % 8;
      if (t >= rows || col0 / 2 + f >= inter) continue;  // inter is a multiple of 8: feature f + 1 is in range too
      const int64_t prow = row_begin + t;
      const float2 gate = biased({column(r, t, prow), column(r + 1, t, prow)}, gated_w1_row<kStacked>(col0, r, inter));
      const float2 up = biased({column(r + 8, t, prow), column(r + 9, t, prow)},
                               gated_w1_row<kStacked>(col0, r + 8, inter));
      const typename P2::type packed = P2::make(apply_gated(p.activation, gate.x, up.x, p.swiglu_alpha, p.swiglu_limit),
                                                apply_gated(p.activation, gate.y, up.y, p.swiglu_alpha, p.swiglu_limit));
      const int64_t at = prow * inter + col0 / 2 + f;
      if (p.c_static_scale != nullptr) {  // quantized: the pair rounded to T, then to e4m3 by the static scale
        const float s = *p.c_static_scale, y = __frcp_rn(s);
        static_cast<__nv_fp8x2_storage_t*>(p.C)[at / 2] = mb::fp8::quantize_pair(P2::to_float2(packed), s, y);
        if (col0 == 0 && f == 0) p.c_scales[prow] = s;
      } else {
        *reinterpret_cast<typename P2::type*>(static_cast<T*>(p.C) + at) = packed;
      }
    }
    return;
  }
  // One thread per (token, output column pair).
  for (int idx = threadIdx.x; idx < kDecodeTokens * (R / 2); idx += kDecodeThreads) {
    const int t = idx / (R / 2), c = 2 * (idx % (R / 2));
    const int col = col0 + c;
    if (t >= rows || col >= N) continue;  // N and col are even: col + 1 < N too
    const int64_t prow = row_begin + t;
    const float2 v = biased({column(c, t, prow), column(c + 1, t, prow)}, col);
    if constexpr (EPI == EPI_FINALIZE) {
      finalize_add_pair<T>(p.C, p.permuted_to_unpermuted, p.permuted_weights, p.top_k, prow, N, col, v.x, v.y);
    } else {
      *reinterpret_cast<typename P2::type*>(static_cast<T*>(p.C) + prow * N + col) = P2::make(v.x, v.y);
    }
  }
}

// Registers: the plain kernel is left to ptxas's own count (a minimum of one CTA an SM lets the rowwise forms take
// 154-158 registers where they take 124-126 unasked: one CTA an SM instead of two); the block-128 forms take 166-182,
// one CTA an SM, or, held to two (TWO: the tactic's tile MB_TILE_DECODE_TWOCTA), 128 with 36-124 bytes of spills,
// which pays where the launch has more CTAs than SMs (tactics.fp8.fp8_block_decode_tile_rule). The rowwise quantizing
// kernel asks for two CTAs an SM: its second weight batch in flight would take WK = 8 past 128 registers.
template <typename T, int SCALING, int WK, int EPI, bool TWO>
__global__ void __launch_bounds__(kDecodeThreads, TWO ? 2 : 0) fp8_decode_kernel(Fp8GemmParams p) {
  fp8_decode_body<T, SCALING, WK, EPI, false>(p);
}

template <typename T, int SCALING, int WK, bool TWO>
__global__ void __launch_bounds__(kDecodeThreads, SCALING == MB_FP8_ROWWISE || TWO ? 2 : 1)
    fp8_quantizing_decode_kernel(Fp8GemmParams p) {
  fp8_decode_body<T, SCALING, WK, EPI_FINALIZE, true>(p);
}

template <typename T, int SCALING, int EPI, bool QA, bool TWO>
mb_status launch_epilogue(const Fp8GemmParams& p, int64_t chunks, int k_split, bool after_trigger,
                          cudaStream_t stream) {
  // QA: the chunk's quantized rows, then (block-128) their group scales
  const size_t group_scales = SCALING == MB_FP8_BLOCK128 ? sizeof(float) * kDecodeTokens * fp8_k_blocks(p.k) : 0;
  const size_t smem = QA ? static_cast<size_t>(kDecodeTokens) * quantized_row_stride(p.k) + group_scales : 0;
  return by_k_split(k_split, [&](auto wk) {
    constexpr int WK = decltype(wk)::value;
    if constexpr (QA)
      return launch_decode(fp8_quantizing_decode_kernel<T, SCALING, WK, TWO>, p, p.n, 16 * (kDecodeWarps / WK),
                           chunks, after_trigger, stream, "grouped gemm fp8 quantizing decode", smem);
    else
      return launch_decode(fp8_decode_kernel<T, SCALING, WK, EPI, TWO>, p, p.n, 16 * (kDecodeWarps / WK), chunks,
                           after_trigger, stream, "grouped gemm fp8 decode", smem);
  });
}

template <typename T, int SCALING, bool TWO>
mb_status launch_scaling(const Fp8GemmParams& p, int64_t chunks, int k_split, bool after_trigger,
                         cudaStream_t stream) {
  if (p.a16 != nullptr) {  // the quantizing GEMM2: the finalize (its entry point's checks)
    if (p.epilogue == EPI_FINALIZE)
      return launch_epilogue<T, SCALING, EPI_FINALIZE, true, TWO>(p, chunks, k_split, after_trigger, stream);
    return fail(MB_ERR_UNSUPPORTED, "grouped gemm fp8 decode: 16-bit rows are quantized with the finalize epilogue "
                                    "only");
  }
  switch (p.epilogue) {
    case EPI_FINALIZE:
      return launch_epilogue<T, SCALING, EPI_FINALIZE, false, TWO>(p, chunks, k_split, after_trigger, stream);
    case EPI_GATED: return launch_epilogue<T, SCALING, EPI_GATED, false, TWO>(p, chunks, k_split, after_trigger, stream);
    default: return launch_epilogue<T, SCALING, EPI_STORE, false, TWO>(p, chunks, k_split, after_trigger, stream);
  }
}

// The SASS architecture the runtime picked for this kernel on the current device: a library built without
// sm_89 code runs its sm_80 image on an SM 8.9 GPU, where the e4m3 mma does not exist (the kernel body is
// compiled for 8.9 and later only). Cached per device.
int fp8_decode_binary_version() {
  thread_local int device = -1, version = 0;
  int current = 0;
  if (cudaGetDevice(&current) != cudaSuccess) return 0;
  if (current != device) {
    cudaFuncAttributes attr{};
    const auto kernel = fp8_decode_kernel<__nv_bfloat16, MB_FP8_ROWWISE, 1, EPI_STORE, false>;
    version = cudaFuncGetAttributes(&attr, kernel) == cudaSuccess ? attr.binaryVersion : 0;
    device = current;
  }
  return version;
}

}  // namespace

mb_status launch_fp8_decode(const Fp8GemmParams& p, int64_t max_rows, int dtype, int k_split, bool two_ctas,
                            bool after_trigger, cudaStream_t stream) {
  const int binary = fp8_decode_binary_version();
  if (binary < 89)
    return fail(MB_ERR_UNSUPPORTED, "grouped gemm fp8 decode: this library has no sm_89+ code for this GPU (it runs "
                                    "the sm_%d image); build it with `moe-build kernels --arch 80,89,90a`", binary);
  if (max_rows == 0) return MB_OK;
  const int64_t chunks = decode_chunks(max_rows, p.num_experts);
  return dispatch_16bit(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (p.scaling != MB_FP8_BLOCK128)  // two_ctas: block-128 only (run_fp8's tactic check)
      return launch_scaling<T, MB_FP8_ROWWISE, false>(p, chunks, k_split, after_trigger, stream);
    return two_ctas ? launch_scaling<T, MB_FP8_BLOCK128, true>(p, chunks, k_split, after_trigger, stream)
                    : launch_scaling<T, MB_FP8_BLOCK128, false>(p, chunks, k_split, after_trigger, stream);
  });
}

}  // namespace mbk
