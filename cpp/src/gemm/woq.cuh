// The weight-only grouped GEMM (mb_grouped_gemm_woq, issue 47): what its kernels share. C[p] = A[p] @ dequant(B[x])^T
// (+ bias[x]) for the permuted rows p of expert x, A and C in bf16/fp16, B in moe_build/weights/woq.py's packed
// forms (cpp/include/moe_build_kernels.h states them), dequantized in registers and rounded once to A's type
// before the mma; fp32 accumulation. gemm/woq_abi.cu checks the arguments and runs the tactic's kernel:
// gemm/woq_decode.cu (a few rows per expert) or gemm/woq_mma.cu (many).
//
// Both kernels feed mma.sync m16n8k16 with the weights as the 16-row A operand, a lane holding 32 consecutive k
// of its weight rows and spending them over four k32 steps as k = 32q + 8u + {0..7}; the dequantization below
// turns one step of one row into the four packed pairs of the A fragment. Per pair of consecutive k (one byte of
// int4 / MXFP4, both halves of one 32-bit register):
//   int4 : the two nibbles into the mantissas of 128 (bf16) / 1024 (fp16), minus 128 + z / 1024 + z (exact: a
//          small integer d = u - z, z a 4-bit zero point); w = fma(d, s_hi, d * s_lo), s_hi = s rounded to T and
//          s_lo = s - s_hi rounded to T: d * s carried to 2^-16 of itself (fp16: to s_lo's subnormal steps,
//          2^-25) and rounded once to T, at most one unit in the last place from rounding the fp32 product
//          (bf16: ~0.1% of weights; fp16: ~1.5% at s ~ 1e-2, more for smaller scales). Five instructions a pair
//          (byte permute, mask-or, three packed fma) against nine for the fp32 product and its conversion;
//   mxfp4: the code's bits placed into T as e2m1 * 2^-126 (bf16) / 2^-14 (fp16), then one multiply by a power of
//          two (exact, rounded once where the result is subnormal); where a warp's weights have a scale beyond 2^1
//          (e8m0 > 128, the multiplier would overflow T) the kernels compute e2m1 * 2^(e - 127) in fp32 instead
//          (the same value: both round the exact product once);
//   int8 : q * s in fp32 (q exact through the 2^23 magic number, no integer conversion), rounded once.
//
// W4AFP8 layers (int4 weights, FP8 activations) run these GEMMs on their FP8-quantized rows stored dequantized to 16
// bits (stages/expand_rows.cu, stages/fc1_activation.cu).
#pragma once

#include <cstdint>

#include "common/common.cuh"
#include "gemm/mma.cuh"
#include "moe_build_kernels.h"

namespace mbk {

constexpr int kMxfp4Group = 32;

struct WoqGemmParams {
  const void* A;           // [max_rows, k] in T, or the token digits (MB_INPUT_DIGITS)
  const uint8_t* B;        // as the kind says
  const void* scales;      // fp32, or uint8 e8m0 for MXFP4
  const uint8_t* zeros;    // INT4 only, or null
  const void* bias;        // [E, n] in T, or null
  void* C;                 // [max_rows, n] in T (the finalize epilogue adds into [tokens, n] instead)
  const int64_t* offsets;  // [E + 1]
  int num_experts;
  int n, k;
  int group;  // k per scale; 0: one scale per output row (INT4 / INT8)
  int kind;   // enum mb_woq_kind
  // The finalize epilogue (decode kernels only; null: the plain store): row p's sum (+ bias) times
  // permuted_weights[p], added into C's row permuted_to_unpermuted[p] / top_k.
  const int32_t* permuted_to_unpermuted;
  const float* permuted_weights;
  int top_k;
};

// What the dequantization needs of the 16-bit type T.
template <typename T> struct Woq16;
template <> struct Woq16<__nv_bfloat16> {
  static constexpr uint32_t kMagic = 0x43004300u;  // 128 in both halves: a nibble in its mantissa is 128 + u
  static constexpr uint32_t kOne = 0x3f803f80u;
  static constexpr int kE2m1Shift = 6;             // code bits 0-2 to the top mantissa bit, the exponent's low two
  static constexpr uint32_t kE2m1Mask = 0x01c001c0u;
  static constexpr int kE2m1Exp = 126;             // the placed code is e2m1 * 2^-126
  static constexpr int kMinExp = -133;             // the smallest power of two in T
  static __device__ __forceinline__ uint32_t bits(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
  static __device__ __forceinline__ float value(uint32_t b) {
    return __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(b)));
  }
};
template <> struct Woq16<__half> {
  static constexpr uint32_t kMagic = 0x64006400u;  // 1024
  static constexpr uint32_t kOne = 0x3c003c00u;
  static constexpr int kE2m1Shift = 9;
  static constexpr uint32_t kE2m1Mask = 0x0e000e00u;
  static constexpr int kE2m1Exp = 14;
  static constexpr int kMinExp = -24;
  static __device__ __forceinline__ uint32_t bits(float f) { return __half_as_ushort(__float2half_rn(f)); }
  static __device__ __forceinline__ float value(uint32_t b) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
  }
};

constexpr uint32_t kNegZero2 = 0x80008000u;  // -0 in both halves: fma(a, b, -0) is the product a * b

// a * b + c on two packed T, rounded once (fma.rn: the same on sm_80 and sm_90).
template <typename T>
__device__ __forceinline__ uint32_t fma2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  if constexpr (MmaName<T>::kBf16) {
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  } else {
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  }
  return d;
}

template <typename T>
__device__ __forceinline__ uint32_t pack_rn(float lo, float hi) {
  const typename Pair<T>::type t = Pair<T>::make(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&t);
}

// (a & kMask) | kOr as one LOP3: written plainly, the compiler spends an instruction per 32-bit constant.
template <uint32_t kMask, uint32_t kOr>
__device__ __forceinline__ uint32_t and_or(uint32_t a) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(d) : "r"(a), "n"(kMask), "n"(kOr));
  return d;
}

// Predicated 4-byte and 1-byte loads (0 where `valid` is false) as single asm statements, so that the constants
// of a later k step are requested with its weights and waited for only where they are used.
__device__ __forceinline__ uint32_t ld_b32(const void* ptr, bool valid) {
  uint32_t v;
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n mov.b32 %0, 0;\n @p ld.global.nc.b32 %0, [%1];\n}\n"
               : "=r"(v)
               : "l"(ptr), "r"((int)valid));
  return v;
}
__device__ __forceinline__ uint32_t ld_u8(const void* ptr, bool valid) {
  uint32_t v;
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n mov.b32 %0, 0;\n @p ld.global.nc.u8 %0, [%1];\n}\n"
               : "=r"(v)
               : "l"(ptr), "r"((int)valid));
  return v;
}

// The 8 bytes of one (weight row, scale group) the dequantization reads, from the stored scale s (fp32 bits, or
// the e8m0 byte) and zero z (0..15):
//   int4 : {s_hi | s_lo << 16, -(magic + z) in both halves};
//   int8 : {s, 0};
//   mxfp4: {2^(e - 127 + placement) in both halves, or 0 where that exceeds T (e > 128), 2^(e - 127) as fp32}.
// Powers of two are assembled as fp32 bits (2^x: (x + 127) << 23 for x >= -126; e8m0 0 is the fp32 subnormal
// 2^-127) and -(magic + z) as T's bits (z < 16 is the magic's low mantissa bits): no conversions from integers.
template <typename T, int KIND>
__device__ __forceinline__ uint2 woq_consts(uint32_t s, uint32_t z) {
  using H = Woq16<T>;
  if constexpr (KIND == MB_WOQ_INT4) {
    const float sf = __uint_as_float(s);
    const float lo = sf - H::value(H::bits(sf));  // exact difference (Sterbenz)
    return make_uint2(pack_rn<T>(sf, lo), (H::kMagic | kNegZero2) + z * 0x00010001u);
  } else if constexpr (KIND == MB_WOQ_INT8) {
    return make_uint2(s, 0u);
  } else {
    const int e = static_cast<int>(s);
    // A result below T's smallest subnormal rounds to zero either way: the multiplier is clamped there (fp16).
    const int x = max(e - 127 + H::kE2m1Exp, H::kMinExp);
    const uint32_t a = H::bits(__uint_as_float(static_cast<uint32_t>(x + 127) << 23));
    return make_uint2(e <= 128 ? a | (a << 16) : 0u, e ? s << 23 : 0x00400000u);
  }
}

// A weight row's constants as the dequantization reads them: int4 {s_hi pair, s_lo pair, -(magic + z) pair};
// int8 {fp32 s}; mxfp4 {multiplier pair, fp32 2^(e - 127)}.
struct RowConsts {
  uint32_t a, b, c;
};

template <int KIND>
__device__ __forceinline__ RowConsts row_consts(uint2 v) {
  if constexpr (KIND == MB_WOQ_INT4) {
    return RowConsts{__byte_perm(v.x, 0u, 0x1010u), __byte_perm(v.x, 0u, 0x3232u), v.y};
  } else {
    return RowConsts{v.x, v.y, 0u};
  }
}

// The four packed pairs (k = 8u + {0,1}, {2,3}, {4,5}, {6,7} of the lane's 32) of one weight row at step u: `w` is
// the row's 32-bit word of the step (int4 / MXFP4: 8 codes, low nibble first), `w8` the int8 row's two words of it.
// kFast: MXFP4's 16-bit multiply (every multiplier of the warp's weights fits T), else its fp32 arithmetic.
template <typename T, int KIND, bool kFast>
__device__ __forceinline__ void dequant_step(uint32_t w, uint2 w8, const RowConsts& c, uint32_t (&out)[4]) {
  using H = Woq16<T>;
  if constexpr (KIND == MB_WOQ_INT8) {
    const float s = __uint_as_float(c.a);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t biased = (j < 2 ? w8.x : w8.y) ^ 0x80808080u;  // q + 128 per byte
      const uint32_t b = (j & 1) * 2;
      // 2^23 + (q + 128) as fp32 bits, then the exact subtraction: q
      const float q0 = __uint_as_float(__byte_perm(biased, 0x4b000000u, 0x7440u | b)) - 8388736.f;
      const float q1 = __uint_as_float(__byte_perm(biased, 0x4b000000u, 0x7440u | (b + 1))) - 8388736.f;
      out[j] = pack_rn<T>(q0 * s, q1 * s);
    }
  } else {
    const uint32_t ws = w >> 4;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      // byte j's low nibble (the even k) to bits 0-3, its high nibble to bits 16-19
      const uint32_t p = __byte_perm(w, ws, 0x0400u + 0x0101u * j);
      if constexpr (KIND == MB_WOQ_INT4) {
        const uint32_t d = fma2<T>(and_or<0x000f000fu, H::kMagic>(p), H::kOne, c.c);
        out[j] = fma2<T>(d, c.a, fma2<T>(d, c.b, kNegZero2));
      } else if constexpr (kFast) {
        const uint32_t x = ((p << H::kE2m1Shift) & H::kE2m1Mask) | ((p << 12) & 0x80008000u);
        out[j] = fma2<T>(x, c.a, kNegZero2);
      } else {
        // bf16 placement (e2m1 * 2^-126), widened to fp32: e2m1 * 2^(e - 127) exactly, rounded once to T
        const uint32_t x = ((p << 6) & 0x01c001c0u) | ((p << 12) & 0x80008000u);
        const float two126 = __uint_as_float(0x7e800000u), s = __uint_as_float(c.b);
        out[j] = pack_rn<T>(__uint_as_float(x << 16) * two126 * s, __uint_as_float(x & 0xffff0000u) * two126 * s);
      }
    }
  }
}

// Where byte `kbyte` of weight row `row` (counted over the experts: n % 16 == 0 keeps a tile inside one) lies in the
// int4 tiles form (MB_WOQ_INT4_TILES) of rows of `row_bytes` (k / 2) bytes: tile row / 16 at 16 row_bytes each, batch
// kbyte / 64 at 1024 each, the row's 64 bytes of a whole batch at 64 (row % 16), those of a last partial batch at
// (row_bytes % 64) (row % 16).
__host__ __device__ __forceinline__ int64_t int4_tile_offset(int64_t row, int64_t kbyte, int64_t row_bytes) {
  const int64_t batch = kbyte >> 6;
  const int64_t pitch = batch < (row_bytes >> 6) ? 64 : (row_bytes & 63);
  return (row >> 4) * 16 * row_bytes + batch * 1024 + (row & 15) * pitch + (kbyte & 63);
}

// int4 codes in either form: rows (MB_WOQ_INT4) or 16-row tiles (MB_WOQ_INT4_TILES); the kernels' arithmetic is the
// same (their KIND MB_WOQ_INT4), p.kind says where a byte lies.
__host__ __device__ constexpr bool is_int4(int kind) { return kind == MB_WOQ_INT4 || kind == MB_WOQ_INT4_TILES; }

// Byte `kbyte` of weight row `row` of int4 codes in either form (rows of `row_bytes` = k / 2 bytes).
__host__ __device__ __forceinline__ int64_t int4_offset(bool tiles, int64_t row, int64_t kbyte, int64_t row_bytes) {
  return tiles ? int4_tile_offset(row, kbyte, row_bytes) : row * row_bytes + kbyte;
}

// A decode lane's int4 codes (gemm/woq_decode.cu, gemm/woq_decode_digits.cu): rows g and g + 8 of the warp's 16 from
// weight row `row0` (a multiple of 16), at the lane's byte `lane_byte` of the 128-k batch from k `k0` (a multiple of
// 128); each batch `batch_bytes` on; a half batch at the end of K (k % 128 == 64) `half0` / `half1` bytes back (in
// tiles its rows' 32 bytes lie row by row; loads.cuh's ld_int4_batch_row).
struct Int4Lane {
  const uint8_t* p0;
  const uint8_t* p1;
  unsigned batch_bytes, half0, half1;
};
__device__ __forceinline__ Int4Lane int4_lane(const WoqGemmParams& p, int64_t row0, int g, int k0, int lane_byte) {
  const int64_t rb = p.k / 2;
  if (p.kind == MB_WOQ_INT4_TILES) {
    const uint8_t* p0 = p.B + row0 * rb + (k0 / 128) * 1024 + 64 * g + lane_byte;
    return Int4Lane{p0, p0 + 512, 1024u, 32u * g, 32u * (g + 8)};
  }
  const uint8_t* p0 = p.B + (row0 + g) * rb + k0 / 2 + lane_byte;
  return Int4Lane{p0, p0 + 8 * rb, 64u, 0u, 0u};
}

// int4 weights in the int4 codes forms (gemm/woq_decode.cu's ring and staged kernels, and the token digits of
// gemm/woq_decode_digits.cu): one scale per 128 k or per row, and whole 128-k batches.
inline bool int4_codes_fit(const WoqGemmParams& p) {
  return is_int4(p.kind) && (p.group == 0 || p.group == 128) && p.k % 128 == 0;
}

// int4 weights on the staged and digits decode kernels: the ring kernel's, and one scale per 64 k with k % 64 == 0
// (GPT-OSS-20B's 2880 at group 64).
inline bool int4_staged_fit(const WoqGemmParams& p) {
  return int4_codes_fit(p) || (is_int4(p.kind) && p.group == 64 && p.k % 64 == 0);
}

// The weights the digits decode kernel takes: the staged kernel's int4 forms, MXFP4 in its quarters form with
// k % 128 == 0 (the form pads GPT-OSS-20B's 2880 to whole 128-k groups), and int8 with one scale per row and
// k % 64 == 0 or per 128 k and k % 128 == 0.
inline bool digits_fit(const WoqGemmParams& p) {
  const bool int8 = p.kind == MB_WOQ_INT8 && ((p.group == 0 && p.k % 64 == 0) || (p.group == 128 && p.k % 128 == 0));
  return int4_staged_fit(p) || (p.kind == MB_WOQ_MXFP4_QUARTERS && p.k % 128 == 0) || int8;
}

// The kernels' launchers; the arguments and the tactic are checked by the caller (gemm/woq_abi.cu), max_rows > 0.
// gemm/woq_decode.cu: `k_split` (1, 2, 4 or 8) warps per K slice; `tile` MB_TILE_NONE, MB_TILE_DECODE_STAGED (the
// token rows staged in shared memory: the int4 codes forms only, where a chunk's rows fit; refused otherwise),
// MB_TILE_DECODE_STAGED_C4 (the same, K split over a cluster of four CTAs: compute capability 9.0) or
// MB_TILE_DECODE_DIGITS (A the token digits, launch_woq_decode_digits).
mb_status launch_woq_decode(const WoqGemmParams& p, int64_t max_rows, int dtype, int k_split, int tile,
                            bool after_trigger, cudaStream_t stream);
// gemm/woq_decode_digits.cu: A the token digits (MB_INPUT_DIGITS) on the int8 mma; weights that digits_fit, checked
// by the caller; refused where a chunk's digits do not fit the kernel's shared memory.
mb_status launch_woq_decode_digits(const WoqGemmParams& p, int64_t max_rows, int dtype, int k_split,
                                   bool after_trigger, cudaStream_t stream);
// gemm/woq_mma.cu: `tile` MB_TILE_MMA_64x128 or MB_TILE_MMA_128x128.
mb_status launch_woq_mma(const WoqGemmParams& p, int64_t max_rows, int dtype, int tile, bool after_trigger,
                         cudaStream_t stream);

}  // namespace mbk
