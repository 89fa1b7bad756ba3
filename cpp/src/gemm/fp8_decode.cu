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
// 128-row block), so no block's sum is rounded before its scale, as the block-scaled reference does.
//
// Epilogues (p.epilogue): the plain store; the finalize (as gemm/decode.cu's): each output pair times its
// row's routing weight, added with one packed 2-element atomic into the token's output row; or the gated
// activation of an interleaved W1 (rowwise scales): a CTA's weight rows are whole 16-row blocks, 8 gate rows then
// their 8 up rows, so each output feature pair finds its gate and up sums in the CTA's shared partials; with a
// static scale (p.c_static_scale, fc2_input_quant=gemm1) each pair is rounded to T and written as two e4m3 bytes,
// the quantize step's bytes, and each row's scale by the thread of its first feature.
//
// Quantizing (QA; mb_grouped_gemm_fp8_quantizing_finalize, the plan's fc2_input_quant=gemm2): A is the 16-bit rows
// GEMM1's gated epilogue wrote, and each CTA quantizes its chunk's rows into shared memory after it waits for them
// (quantize_chunk_rows), with fp8_quantize.cuh's unit functions, so they hold the bytes and scales the quantize step
// would have written; the mainloop then reads its token rows there. Each CTA of a chunk repeats that work before its
// first product, so it pays where GEMM2's CTAs are few (the planner's rule fc2_quant_gemm2_waves); there it saves
// the quantize kernel between the GEMMs, 2-5 us of a 1-token layer.
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
// their scales into row_scale, as mb_quantize_fp8 quantizes a row (static_scale, or the row's own amax): the same
// unit functions of common/fp8_quantize.cuh, so the same bytes. A row takes 256 / rows' power of two threads, so
// that one or two rows, the usual chunk at decode, are read by the whole CTA at once; the first kB units of each
// thread stay in registers from the amax pass to the quantizing pass, the rest are read again (an L1 hit).
// Every thread of the CTA calls it; the caller synchronizes before reading dst.
template <typename T>
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
  uint4 keep[kB];
  float s;
  if (static_scale != nullptr) {
    s = __ldg(static_scale);
  } else {
    float amax = 0.f;
    for (int u0 = 0; u0 < units; u0 += kB * group) {  // the same bounds in every thread: all reach the shuffles
      uint4 x[kB];
#pragma unroll
      for (int i = 0; i < kB; ++i) x[i] = load(u0 + i * group + t);
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

// The kernels' body (below it the two kernels: the plain one and the quantizing one, QA).
template <typename T, int SCALING, int WK, int EPI, bool QA>
__device__ __forceinline__ void fp8_decode_body(const Fp8GemmParams& p) {
  constexpr int R = 16 * (kDecodeWarps / WK);  // weight rows (output columns) per CTA
  constexpr bool kBlock = SCALING == MB_FP8_BLOCK128;
  static_assert(!QA || !kBlock, "the quantizing kernel takes rowwise scales");
  __shared__ float s_part[WK][R][kDecodeTokens + 1];
  extern __shared__ __align__(16) uint8_t s_rows[];  // QA: the chunk's rows quantized, quantized_row_stride(k) apart
  __shared__ float s_row_scale[kDecodeTokens];       // QA: their scales

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
  const int r0 = col0 + rg * 16 + g;  // the lane's weight rows r0 and r0 + 8
  const bool wok0 = r0 < N, wok1 = r0 + 8 < N;
  const uint8_t* B = p.B + (int64_t)expert * N * K;
  const uint8_t* wrow0 = B + (int64_t)(wok0 ? r0 : 0) * K;
  const uint8_t* wrow1 = wrow0 + 8 * K;  // read only where wok1 (then wok0 too)
  const bool aok = g < rows;
  const uint8_t* arow = p.A + (row_begin + (aok ? g : 0)) * K;
  // BLOCK128: the lane's weight-scale row (its two rows share a 128-row block) and token-scale rows.
  const float* sb_row = p.scale_b + ((int64_t)expert * fp8_k_blocks(N) + min(r0, N - 1) / kFp8Block) * kbn;
  // The lane's two token-scale rows 2q and 2q + 1 (adjacent: one pointer and a stride).
  const bool tok_ok0 = 2 * q < rows, tok_ok1 = 2 * q + 1 < rows;
  const float* sa_row = p.scale_a + (row_begin + (tok_ok0 ? 2 * q : 0)) * (kBlock ? kbn : 1);

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  // This warp's K slice: whole 128-k blocks (the last slice shorter; K % 16 == 0, so a lane's 16-byte
  // load is wholly inside or wholly outside).
  static_assert(kFp8Block == 128, "decode_k_slice cuts whole 128-k blocks");
  const int kslice = decode_k_slice(K, WK);
  const int kb = ks * kslice, ke = min(K, kb + kslice);
  uint4 w[2][kSteps][2], a[2][kSteps];
  float sb[2][2], sa[2][2][2];  // [buffer][128-k block of the batch][token]
  auto load_weights = [&](int buf, int k0) {
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      const int k = k0 + u * kStepK + q * 16;
      w[buf][u][0] = ld_weights(wrow0 + k, k < ke && wok0);
      w[buf][u][1] = ld_weights(wrow1 + k, k < ke && wok1);
    }
    if constexpr (kBlock) {
#pragma unroll
      for (int h = 0; h < 2; ++h) sb[buf][h] = ld_scale(sb_row + k0 / kFp8Block + h, k0 + h * kFp8Block < ke);
    }
  };
  const int a_stride = quantized_row_stride(K);
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
        sa[buf][h][0] = ld_scale(sa_row + k0 / kFp8Block + h, kin && tok_ok0);
        sa[buf][h][1] = ld_scale(sa_row + kbn + k0 / kFp8Block + h, kin && tok_ok1);
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
          for (int c = 0; c < 4; ++c) {
            acc[c] += part[c] * sb[buf][h] * sa[buf][h][c & 1];
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
    quantize_chunk_rows<T>(static_cast<const T*>(p.a16) + row_begin * K, p.a16_static_scale, rows, K, s_rows,
                           a_stride, s_row_scale);
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
    if constexpr (QA) s *= s_row_scale[t] * p.scale_b[(int64_t)expert * N + col0 + r];
    else if constexpr (!kBlock) s *= p.scale_a[prow] * p.scale_b[(int64_t)expert * N + col0 + r];
    return s;
  };
  auto biased = [&](float2 v, int col) {
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
    const int inter = N / 2;
    for (int idx = threadIdx.x; idx < kDecodeTokens * (R / 4); idx += kDecodeThreads) {
      const int t = idx / (R / 4), f = 2 * (idx % (R / 4));
      const int r = (f / 8) * 16 + f % 8;
      if (t >= rows || col0 + r >= N) continue;  // N is a multiple of 16: the up rows are in range too
      const int64_t prow = row_begin + t;
      const float2 gate = biased({column(r, t, prow), column(r + 1, t, prow)}, col0 + r);
      const float2 up = biased({column(r + 8, t, prow), column(r + 9, t, prow)}, col0 + r + 8);
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

template <typename T, int SCALING, int WK, int EPI>
__global__ void __launch_bounds__(kDecodeThreads) fp8_decode_kernel(Fp8GemmParams p) {
  fp8_decode_body<T, SCALING, WK, EPI, false>(p);
}

// The quantizing kernel asks for two CTAs an SM: its second weight batch in flight would take WK = 8 past 128
// registers. (The plain kernel is left to ptxas's own count: a minimum of one CTA an SM lets it take 154-158
// registers where it takes 124-126 unasked, and run one CTA an SM.)
template <typename T, int WK>
__global__ void __launch_bounds__(kDecodeThreads, 2) fp8_quantizing_decode_kernel(Fp8GemmParams p) {
  fp8_decode_body<T, MB_FP8_ROWWISE, WK, EPI_FINALIZE, true>(p);
}

template <typename T, int SCALING, int EPI, bool QA = false>
mb_status launch_epilogue(const Fp8GemmParams& p, int64_t chunks, int k_split, bool after_trigger,
                          cudaStream_t stream) {
  const size_t smem = QA ? static_cast<size_t>(kDecodeTokens) * quantized_row_stride(p.k) : 0;
  return by_k_split(k_split, [&](auto wk) {
    constexpr int WK = decltype(wk)::value;
    if constexpr (QA)
      return launch_decode(fp8_quantizing_decode_kernel<T, WK>, p, p.n, 16 * (kDecodeWarps / WK), chunks,
                           after_trigger, stream, "grouped gemm fp8 quantizing decode", smem);
    else
      return launch_decode(fp8_decode_kernel<T, SCALING, WK, EPI>, p, p.n, 16 * (kDecodeWarps / WK), chunks,
                           after_trigger, stream, "grouped gemm fp8 decode", smem);
  });
}

template <typename T, int SCALING>
mb_status launch_scaling(const Fp8GemmParams& p, int64_t chunks, int k_split, bool after_trigger,
                         cudaStream_t stream) {
  if (p.a16 != nullptr) {  // the quantizing GEMM2: rowwise scales and the finalize (its entry point's checks)
    if constexpr (SCALING == MB_FP8_ROWWISE)
      if (p.epilogue == EPI_FINALIZE)
        return launch_epilogue<T, SCALING, EPI_FINALIZE, true>(p, chunks, k_split, after_trigger, stream);
    return fail(MB_ERR_UNSUPPORTED, "grouped gemm fp8 decode: 16-bit rows are quantized with rowwise scales and "
                                    "the finalize epilogue only");
  }
  switch (p.epilogue) {
    case EPI_FINALIZE: return launch_epilogue<T, SCALING, EPI_FINALIZE>(p, chunks, k_split, after_trigger, stream);
    case EPI_GATED:  // rowwise scales only (mb_grouped_gemm_fp8_gated refuses block-128 before this)
      if constexpr (SCALING == MB_FP8_ROWWISE)
        return launch_epilogue<T, SCALING, EPI_GATED>(p, chunks, k_split, after_trigger, stream);
      else
        return fail(MB_ERR_UNSUPPORTED, "grouped gemm fp8 decode: the gated epilogue takes rowwise scales only");
    default: return launch_epilogue<T, SCALING, EPI_STORE>(p, chunks, k_split, after_trigger, stream);
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
    const auto kernel = fp8_decode_kernel<__nv_bfloat16, MB_FP8_ROWWISE, 1, EPI_STORE>;
    version = cudaFuncGetAttributes(&attr, kernel) == cudaSuccess ? attr.binaryVersion : 0;
    device = current;
  }
  return version;
}

}  // namespace

mb_status launch_fp8_decode(const Fp8GemmParams& p, int64_t max_rows, int dtype, int k_split, bool after_trigger,
                            cudaStream_t stream) {
  const int binary = fp8_decode_binary_version();
  if (binary < 89)
    return fail(MB_ERR_UNSUPPORTED, "grouped gemm fp8 decode: this library has no sm_89+ code for this GPU (it runs "
                                    "the sm_%d image); build it with `moe-build kernels --arch 80,89,90a`", binary);
  if (max_rows == 0) return MB_OK;
  const int64_t chunks = decode_chunks(max_rows, p.num_experts);
  return dispatch_16bit(dtype, [&](auto tag) {
    using T = decltype(tag);
    return p.scaling == MB_FP8_BLOCK128 ? launch_scaling<T, MB_FP8_BLOCK128>(p, chunks, k_split, after_trigger, stream)
                                        : launch_scaling<T, MB_FP8_ROWWISE>(p, chunks, k_split, after_trigger, stream);
  });
}

}  // namespace mbk
