// The mma.sync grouped GEMM over expert segments (tactic kernel MB_GEMM_MMA, launched by gemm/sm80.cu for
// both entry points), and what every grouped GEMM shares: its parameters, the expert lookup, the argument
// checks and the launchers' declarations.
//
// One CTA computes a BM x BN tile of one expert's segment. The grid is sized from host-known
// bounds only (ceil(max_rows / BM) + min(E, max_rows) row tiles, every column tile), and each CTA finds its
// expert on device with a warp scan over expert_first_token_offset, so a call never syncs with
// the host and is CUDA-graph capturable; CTAs past the real tile count exit at once.
//
// Operand path: cp.async 16-byte copies into a 64-wide XOR-swizzled shared tile (conflict-free
// ldmatrix), STAGES deep, ldmatrix.x4 fragments, mma.sync m16n8k16 with fp32 accumulators.
// Epilogues: STORE (bias + activation), GATED (act(gate) * up from B rows [n0, ..) and
// [N + n0, ..) accumulated in the same CTA), FINALIZE (w[p] * (acc + bias) atomically added to
// the token row of p; packed 2-element atomics, so with top_k <= 2 into a zeroed output the
// result is order-independent and bit-reproducible).

#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/act_math.cuh"
#include "common/common.cuh"  // mb::fail: the error capture behind mb_last_error()
#include "moe_build_kernels.h"

namespace mbk {

enum EpilogueKind { EPI_STORE = 0, EPI_GATED = 1, EPI_FINALIZE = 2 };

struct GemmParams {
  const void* A;        // [rows, K] permuted activations
  const void* B;        // [E, NB * N, K]; GATED: gate and up rows as gated_row() places them
  const void* bias;     // [E, NB * N] or nullptr (GATED: the same order as B's rows)
  void* C;              // STORE/GATED: [rows, N]; FINALIZE: [tokens, N]
  const int64_t* offsets;  // [E + 1]
  const int32_t* permuted_to_unpermuted;  // FINALIZE only
  const float* permuted_weights;          // FINALIZE only
  int num_experts;
  int n;
  int k;
  int top_k;
  int activation;
  float swiglu_alpha;
  float swiglu_limit;
  int gate_up_interleaved;  // GATED: W1 interleaved in blocks of 8 (see gated_row)
  int weights_blocked;      // B in MB_WEIGHTS_BLOCKED64's 64 x 64 blocks (sm90 entry points only)
  int32_t* placement;       // sm90 gated / finalize: the caller's claim region, or null (gemm/sm90_placement.cuh)
};

// Offset of column c of row r (of one expert's [NB * N, K] rows, or of all experts' stacked rows) in B's
// layout: row-major, or MB_WEIGHTS_BLOCKED64 (64 x 64 blocks, each contiguous, K % 64 == 0). Split into
// a row part and a column part so that a kernel walking one row adds only the column part per load.
__host__ __device__ __forceinline__ int64_t weight_row_offset(int64_t r, int K, bool blocked) {
  return blocked ? (r >> 6) * (K >> 6) * 4096 + (r & 63) * 64 : r * K;
}
__host__ __device__ __forceinline__ int64_t weight_col_offset(int c, bool blocked) {
  return blocked ? (int64_t)(c >> 6) * 4096 + (c & 63) : c;
}

// Row of an expert's W1 (and index into its b1) holding output feature f's gate (half 0) or up
// (half 1) projection. Stacked: [gate; up], N rows each (the checkpoint order). Interleaved: blocks
// of 16 rows, gate features 8b..8b+7 then up features 8b..8b+7, so that GEMM1 columns c and c + 8
// (c % 16 < 8) are one feature's gate and up: the layout the sm90 wgmma epilogue needs, where each
// thread holds columns c and c + 8 of its rows (moe_build/runner/experts.py interleaves W1 once).
__host__ __device__ __forceinline__ int64_t gated_row(int f, int half, int N, bool interleaved) {
  return interleaved ? (int64_t)(f >> 3) * 16 + half * 8 + (f & 7) : (int64_t)half * N + f;
}

// The fields every entry point sets; callers add the finalize maps / swiglu constants they use.
inline GemmParams gemm_params(const void* A, const void* B, const void* bias, void* C, const int64_t* offsets,
                              int num_experts, int n, int k, int activation) {
  GemmParams p{};
  p.A = A;
  p.B = B;
  p.bias = bias;
  p.C = C;
  p.offsets = offsets;
  p.num_experts = num_experts;
  p.n = n;
  p.k = k;
  p.activation = activation;
  return p;
}

template <typename T> struct MmaName;
template <> struct MmaName<__nv_bfloat16> {
  static constexpr bool kBf16 = true;
};
template <> struct MmaName<__half> {
  static constexpr bool kBf16 = false;
};

template <typename T> struct Pair;
template <> struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ type make(float a, float b) { return __floats2bfloat162_rn(a, b); }
  static __device__ __forceinline__ float2 to_float2(type v) { return __bfloat1622float2(v); }
};
template <> struct Pair<__half> {
  using type = __half2;
  static __device__ __forceinline__ type make(float a, float b) { return __floats2half2_rn(a, b); }
  static __device__ __forceinline__ float2 to_float2(type v) { return __half22float2(v); }
};

__device__ __forceinline__ float apply_act(int act, float x) { return mb::act_apply_rt(act, x, 0.f, 0.f, 0.f); }
__device__ __forceinline__ float apply_gated(int act, float gate, float up, float alpha, float limit) {
  return mb::act_apply_rt(act, gate, up, alpha, limit);
}

__device__ __forceinline__ void cp_async16(uint32_t smem, const void* gmem, bool valid) {
  // src-size 0 zero-fills the 16 bytes: out-of-range rows/columns/K tail read as zeros.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <bool kBf16>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Maps a global row-tile index to (expert, first row, end row) with one warp: scan the
// per-expert tile counts 32 experts at a time. Returns false for tiles past the real count.
// The offsets of the first kFindPrefetch * 32 experts are loaded before any scan step, so
// E <= 256 costs one memory round trip instead of one per 32 experts (a decode-sized GEMM CTA
// lives a few microseconds).
constexpr int kFindPrefetch = 8;

template <int BM>
__device__ __forceinline__ bool find_tile(const int64_t* offsets, int num_experts, int tile, int* expert,
                                          int64_t* row_begin, int64_t* row_end) {
  const int lane = threadIdx.x & 31;
  int64_t his[kFindPrefetch];
#pragma unroll
  for (int c = 0; c < kFindPrefetch; ++c) {
    const int x = c * 32 + lane;
    his[c] = x < num_experts ? offsets[x + 1] : 0;
  }
  int64_t prev_hi = offsets[0];  // end of the expert before this chunk's lane 0
  int before = 0;
  // One chunk of 32 experts [base, base + 32) with their end offsets `hi`; true when found.
  auto scan = [&](int base, int64_t hi) -> bool {
    const int x = base + lane;
    int64_t lo = __shfl_up_sync(0xffffffffu, hi, 1);
    if (lane == 0) lo = prev_hi;
    const int tiles = x < num_experts ? (int)((hi - lo + BM - 1) / BM) : 0;
    int incl = tiles;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += v;
    }
    const unsigned hit = __ballot_sync(0xffffffffu, tile < before + incl && tiles > 0 && tile >= before + incl - tiles);
    if (hit) {
      const int src = __ffs(hit) - 1;
      const int local = __shfl_sync(0xffffffffu, tile - (before + incl - tiles), src);
      lo = __shfl_sync(0xffffffffu, lo, src);
      hi = __shfl_sync(0xffffffffu, hi, src);
      *expert = base + src;
      *row_begin = lo + (int64_t)local * BM;
      *row_end = min(hi, *row_begin + BM);
      return true;
    }
    before += __shfl_sync(0xffffffffu, incl, 31);
    prev_hi = __shfl_sync(0xffffffffu, hi, 31);
    return false;
  };
#pragma unroll
  for (int c = 0; c < kFindPrefetch; ++c)
    if (c * 32 < num_experts && scan(c * 32, his[c])) return true;
  for (int base = kFindPrefetch * 32; base < num_experts; base += 32) {
    const int x = base + lane;
    if (scan(base, x < num_experts ? offsets[x + 1] : 0)) return true;
  }
  return false;
}

// The CTA's row tile blockIdx.x (warp 0 runs find_tile, the CTA reads the result from shared
// memory); expert < 0 for CTAs past the real tile count, which then exit.
struct TileRows {
  int expert;
  int64_t begin, end;
};

template <int BM>
__device__ __forceinline__ TileRows cta_find_tile(const int64_t* offsets, int num_experts) {
  __shared__ TileRows s_tile;
  if (threadIdx.x < 32) {
    TileRows t;
    const bool ok = find_tile<BM>(offsets, num_experts, blockIdx.x, &t.expert, &t.begin, &t.end);
    if (threadIdx.x == 0) {
      if (!ok) t.expert = -1;
      s_tile = t;
    }
  }
  __syncthreads();
  return s_tile;
}

template <int BM_, int BN_, int STAGES_, int WM_, int WN_>
struct TileConfig {
  static constexpr int BM = BM_, BN = BN_, BK = 64, STAGES = STAGES_, WM = WM_, WN = WN_;
  static constexpr int kThreads = WM * WN * 32;
  static constexpr int WTM = BM / WM, WTN = BN / WN;
  static constexpr int MI = WTM / 16, NI = WTN / 8;
  static_assert(WTM % 16 == 0 && WTN % 16 == 0, "warp tile must be whole ldmatrix.x4 blocks");
  template <int NB> static constexpr int smem_bytes() { return STAGES * (BM + NB * BN) * BK * 2; }
};

template <typename T, class Cfg, int EPI>
__global__ void __launch_bounds__(Cfg::kThreads) grouped_mma_kernel(GemmParams p) {
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES;
  constexpr int NB = EPI == EPI_GATED ? 2 : 1;  // B tiles per stage: gate and up for GATED
  constexpr int MI = Cfg::MI, NI = Cfg::NI;
  constexpr int A_ELEMS = BM * BK, B_ELEMS = BN * BK, STAGE_ELEMS = A_ELEMS + NB * B_ELEMS;
  extern __shared__ __align__(128) unsigned char smem_raw[];

  const TileRows tile = cta_find_tile<BM>(p.offsets, p.num_experts);
  const int expert = tile.expert;
  if (expert < 0) return;
  const int64_t row_begin = tile.begin, row_end = tile.end;
  const int N = p.n, K = p.k;
  const int n0 = blockIdx.y * BN;

  const T* A = static_cast<const T*>(p.A) + row_begin * K;
  const T* B = static_cast<const T*>(p.B) + (int64_t)expert * NB * N * K;
  const uint32_t smem_base = (uint32_t)__cvta_generic_to_shared(smem_raw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / Cfg::WN, wn = warp % Cfg::WN;
  const int rows = (int)(row_end - row_begin);
  const int ktiles = (K + BK - 1) / BK;
  auto load_stage = [&](int stage, int kt) {
    const uint32_t sA = smem_base + stage * STAGE_ELEMS * 2;
    const int k0 = kt * BK;
#pragma unroll
    for (int c = tid; c < BM * 8; c += Cfg::kThreads) {
      const int r = c >> 3, kc = c & 7;
      const bool ok = r < rows && k0 + kc * 8 < K;
      const T* src = ok ? A + (int64_t)r * K + k0 + kc * 8 : A;
      cp_async16(sA + (r * BK + ((kc ^ (r & 7)) << 3)) * 2, src, ok);
    }
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const uint32_t sB = sA + (A_ELEMS + b * B_ELEMS) * 2;
#pragma unroll
      for (int c = tid; c < BN * 8; c += Cfg::kThreads) {
        const int r = c >> 3, kc = c & 7;
        const int n = n0 + r;
        const bool ok = n < N && k0 + kc * 8 < K;
        const int64_t row = NB == 1 ? n : gated_row(n, b, N, p.gate_up_interleaved);
        const T* src = ok ? B + row * K + k0 + kc * 8 : B;
        cp_async16(sB + (r * BK + ((kc ^ (r & 7)) << 3)) * 2, src, ok);
      }
    }
  };

  float acc[NB][MI][NI][4];
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NI; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[b][i][j][q] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles) load_stage(s, s);
    cp_async_commit();
  }

  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage kt landed for every thread; stage kt-1 fully consumed
    const int pf = kt + STAGES - 1;
    if (pf < ktiles) load_stage(pf % STAGES, pf);
    cp_async_commit();

    const uint32_t sA = smem_base + (kt % STAGES) * STAGE_ELEMS * 2;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t af[MI][4];
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        const int r = wm * Cfg::WTM + i * 16 + (lane & 15);
        const int kc = kk * 2 + (lane >> 4);
        ldmatrix_x4(af[i], sA + (r * BK + ((kc ^ (r & 7)) << 3)) * 2);
      }
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const uint32_t sB = sA + (A_ELEMS + b * B_ELEMS) * 2;
#pragma unroll
        for (int j = 0; j < NI; j += 2) {
          uint32_t bf[4];
          const int r = wn * Cfg::WTN + j * 8 + (lane & 7) + ((lane >> 4) << 3);
          const int kc = kk * 2 + ((lane >> 3) & 1);
          ldmatrix_x4(bf, sB + (r * BK + ((kc ^ (r & 7)) << 3)) * 2);
#pragma unroll
          for (int i = 0; i < MI; ++i) {
            mma16816<MmaName<T>::kBf16>(acc[b][i][j], af[i], bf[0], bf[1]);
            mma16816<MmaName<T>::kBf16>(acc[b][i][j + 1], af[i], bf[2], bf[3]);
          }
        }
      }
    }
  }
  cp_async_wait<0>();

  using P2 = Pair<T>;
  const T* bias = p.bias ? static_cast<const T*>(p.bias) + (int64_t)expert * NB * N : nullptr;
#pragma unroll
  for (int i = 0; i < MI; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm * Cfg::WTM + i * 16 + (lane >> 2) + h * 8;
      if (r >= rows) continue;
      const int64_t prow = row_begin + r;
      T* out_row;
      float w = 1.f;
      if constexpr (EPI == EPI_FINALIZE) {
        const int e = p.permuted_to_unpermuted[prow];
        w = p.permuted_weights[prow];
        out_row = static_cast<T*>(p.C) + (int64_t)(e / p.top_k) * N;
      } else {
        out_row = static_cast<T*>(p.C) + prow * N;
      }
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        const int col = n0 + wn * Cfg::WTN + j * 8 + (lane & 3) * 2;
        if (col >= N) continue;  // N is even and col is even, so col + 1 < N too
        float v0 = acc[0][i][j][h * 2], v1 = acc[0][i][j][h * 2 + 1];
        const bool il = EPI == EPI_GATED && p.gate_up_interleaved;
        if (bias) {
          const float2 bb = P2::to_float2(*reinterpret_cast<const typename P2::type*>(bias + gated_row(col, 0, N, il)));
          v0 += bb.x;
          v1 += bb.y;
        }
        if constexpr (EPI == EPI_GATED) {
          float u0 = acc[1][i][j][h * 2], u1 = acc[1][i][j][h * 2 + 1];
          if (bias) {
            const float2 bu =
                P2::to_float2(*reinterpret_cast<const typename P2::type*>(bias + gated_row(col, 1, N, il)));
            u0 += bu.x;
            u1 += bu.y;
          }
          v0 = apply_gated(p.activation, v0, u0, p.swiglu_alpha, p.swiglu_limit);
          v1 = apply_gated(p.activation, v1, u1, p.swiglu_alpha, p.swiglu_limit);
        } else {
          v0 = apply_act(p.activation, v0);
          v1 = apply_act(p.activation, v1);
        }
        auto* dst = reinterpret_cast<typename P2::type*>(out_row + col);
        if constexpr (EPI == EPI_FINALIZE) {
          atomicAdd(dst, P2::make(w * v0, w * v1));
        } else {
          *dst = P2::make(v0, v1);
        }
      }
    }
  }
}

// The tile configs of the tactic tiles (BM x BN, B stages in flight, warps along M x N):
//   MB_TILE_MMA_16x64   : few rows, weight-bandwidth bound: 16-row tiles, 6 stages of B in flight
//   MB_TILE_MMA_64x128  : 64 x 128 tiles
//   MB_TILE_MMA_128x128 : 128 x 128 tiles (compute bound)
using CfgSmall = TileConfig<16, 64, 6, 1, 4>;
using CfgMid = TileConfig<64, 128, 4, 2, 2>;
using CfgLarge = TileConfig<128, 128, 3, 2, 4>;

// The argument checks every grouped-GEMM launcher makes. 16-byte row loads need K % 8 == 0 and
// the paired epilogue stores N even; N % 8 keeps every output/bias row 16-byte aligned as well.
inline mb_status check_grouped_args(const GemmParams& p, int64_t max_rows, int epilogue) {
  if (!p.A || !p.B || !p.C || !p.offsets || p.num_experts <= 0 || max_rows < 0 || p.n <= 0 || p.k <= 0)
    return ::mb::fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm: null pointer or non-positive size");
  if (p.k % 8 != 0 || p.n % 8 != 0)
    return ::mb::fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm: n (%d) and k (%d) must be multiples of 8", p.n, p.k);
  if (epilogue == EPI_FINALIZE && (!p.permuted_to_unpermuted || !p.permuted_weights || p.top_k <= 0))
    return ::mb::fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm finalize: missing maps/weights or top_k <= 0");
  return MB_OK;
}

// Whether a pointer allows 16-byte vector loads and TMA (the FP8 and weight-only GEMMs require it of A, B, C).
inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// Calls launch(T{}) with T the 16-bit type of `dtype`; the grouped GEMMs have no fp32 kernels.
template <typename Launch>
mb_status dispatch_16bit(int dtype, Launch&& launch) {
  switch (dtype) {
    case MB_BF16: return launch(__nv_bfloat16{});
    case MB_FP16: return launch(__half{});
    case MB_FP32: return ::mb::fail(MB_ERR_UNSUPPORTED, "grouped gemm: fp32 is not implemented (fp16/bf16 only)");
    default: return ::mb::fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm: unknown dtype %d", dtype);
  }
}

// Validates and launches the mma.sync tiles, `tile` an MB_TILE_MMA_* the caller has checked (a plain
// launch); defined in gemm/sm80.cu, used by both entry points.
mb_status launch_grouped_mma(const GemmParams& p, int64_t max_rows, int dtype, int epilogue, int tile,
                             cudaStream_t stream);

// Defined in gemm/decode.cu: the swap-AB, register-streaming kernel for few rows per expert
// (STORE, GATED and FINALIZE epilogues as above; no workspace), `k_split` (1, 2, 4 or 8, checked by the
// caller) warps per K, launched after a trigger (mb::launch_after_trigger) or plainly.
mb_status launch_grouped_decode(const GemmParams& p, int64_t max_rows, int dtype, int epilogue, int k_split,
                                bool after_trigger, cudaStream_t stream);
using ::mb::fail;

// The gated entry points' own arguments (mb_grouped_gemm_sm90_gated, mb_grouped_gemm_fp8_gated): W1's gate and up rows
// interleaved in blocks of 8 (gated_row) need inter a multiple of 8, and the epilogue computes the gated activations.
inline mb_status check_gated(const char* who, int inter, int activation) {
  if (inter <= 0 || inter % 8 != 0)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: inter (%d) must be a positive multiple of 8", who, inter);
  if (activation != MB_ACT_SWIGLU && activation != MB_ACT_GEGLU && activation != MB_ACT_SWIGLU_CLAMP)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: activation %d is not swiglu (%d), geglu (%d) or swiglu_clamp (%d)", who,
                activation, MB_ACT_SWIGLU, MB_ACT_GEGLU, MB_ACT_SWIGLU_CLAMP);
  return MB_OK;
}

}  // namespace mbk
