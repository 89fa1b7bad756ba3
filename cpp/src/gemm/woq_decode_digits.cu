// Weight-only grouped GEMM, decode on the int8 mma (tactic tile MB_TILE_DECODE_DIGITS, A MB_INPUT_DIGITS): int4 weights
// with one scale per 128 k or per row and k % 128 == 0, or per 64 k and k % 64 == 0, MXFP4 in its quarters form (k a
// multiple of 128, which the form pads to; digits_chunk_mxfp4, below), and int8 weights as stored (digits_chunk_int8,
// below), against token rows that stages/token_digits.cu has split into three 8-bit digits per value under one
// power-of-two factor per 128-k group (x = F (4096 d0 + 64 d1 + d2), common/token_digits.cuh). The 16-bit decode
// kernels (gemm/woq_decode.cu) spend about ten integer instructions per 32-bit word of codes turning them into 16-bit
// values for the mma, and issue, not the weights' bytes, bounds them (docs/performance.md, "No pipe at its ceiling");
// here a word becomes the int8 mma's A operand in three (a shift and two masks: the codes as unsigned bytes), and one
// m16n8k32 step takes 32 k.
//
// Layout: gemm/decode.cu's swap-AB CTA (expert, chunk of <= 8 token rows, 128 / WK weight rows; WK warps split K)
// and the staged kernel's loads (gemm/woq_decode.cu woq_decode_int4_staged_kernel: a lane's 32 k of its two rows,
// 16 bytes each, in big batches of NB 128-k groups with one wait per big batch; the chunk's token records copied
// into shared memory once). Each token takes four of the mma's eight columns, its three digits and one unused: a
// step runs NM = ceil(rows / 2) mmas for the chunk's rows, and lane q's accumulators (columns 2q, 2q + 1) hold one token's digit sums,
// d0 and d1 (q even) or d2 (q odd). Per scale group the lane forms, exactly in int32,
//   R = 4096 S0 + 64 S1 - z T  (q even),  R = S2  (q odd),
// S the digit sums over the group's k of the codes u, z the row's zero point, T the group's sum of
// 4096 d0 + 64 d1 + d2, so that the two lanes' R add up to sum_k (u - z) (4096 d0 + 64 d1 + d2), and adds R times
// the row's scale times the digits' factor into its fp32 sum. Group 64 as the staged kernel (gemm/woq_decode.cu):
// a lane reads 8 bytes (16 k) at 16q of each half of a 128-k group, steps 0-1 the first half's and 2-3 the second's
// (the digits are written in that order for group 64), each half's sums taken with its own scale, zero and T (the
// record's first-half sum, or the rest); a half group at the end of K (k % 128 == 64) reads its second half from
// the first half's bytes against zero digits. No weight is rounded, and no token but those far below their group's
// largest (common/token_digits.cuh); the sums are fp32.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/token_digits.cuh"
#include "gemm/decode_launch.cuh"
#include "gemm/loads.cuh"
#include "gemm/mma.cuh"
#include "gemm/woq.cuh"
#include "gemm/woq_decode_sums.cuh"

namespace mbk {
namespace {

// c += A (16 x 32 unsigned bytes) * B (32 x 8 signed bytes), int32 sums.
__device__ __forceinline__ void mma_u8s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// c += A (16 x 32 signed bytes) * B (32 x 8 signed bytes), int32 sums (int8 weights as stored).
__device__ __forceinline__ void mma_s8s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// c += A * B with every byte of A the signed byte `a` (each output the column's digit sum times a).
__device__ __forceinline__ void mma_s8s8_constant(int (&c)[4], uint32_t a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %4, %4, %4}, {%5, %6}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a), "r"(b0), "r"(b1));
}

// PTX prmt in its default mode: result byte i is byte (nibble i of sel) & 7 of {b, a}, or, where the nibble's bit 3
// is set, that byte's top bit repeated over all 8 bits.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// MXFP4 codes as the int8 mma's unsigned A bytes: the four e2m1 codes in the low nibbles of x (bit 3 the sign, bits
// 0-2 the magnitude's index m), xf the same with the sign bits flipped, as 12 + 2 e2m1 (0..24). A positive code picks
// 12 + 2 e2m1(m) from the first table and, sign bit set in xf, 0 from the second (the top bit of 12 - 2 e2m1(m)
// repeated); a negative one the reverse.
__device__ __forceinline__ uint32_t mxfp4_offset_bytes(uint32_t x, uint32_t xf) {
  constexpr uint32_t kPlus0 = 0x0f0e0d0cu, kPlus1 = 0x18141210u;    // 12 + {0, 1, 2, 3}, 12 + {4, 6, 8, 12}
  constexpr uint32_t kMinus0 = 0x090a0b0cu, kMinus1 = 0x00040608u;  // 12 - {0, 1, 2, 3}, 12 - {4, 6, 8, 12}
  return prmt(kPlus0, kPlus1, x) | prmt(kMinus0, kMinus1, xf);
}

// The kernel's launch: the GEMM, and the most token rows a chunk can have (min(8, max_rows)), which sizes its
// shared memory and its mmas per step.
struct WoqDigitsLaunch {
  WoqGemmParams p;
  int rows_cap;
};

// Shared memory: each K slice's token records of the chunk's rows (slice 0's length, the longest), then 16 zero
// bytes (the sums and factor of a group past the slice).
size_t digits_smem(int k, int rows_cap, int wk) {
  const size_t slice_groups = static_cast<size_t>(mb::digit_groups(std::min(k, decode_k_slice(k, wk))));
  return static_cast<size_t>(rows_cap) * wk * slice_groups * mb::kDigitGroupBytes + 16;
}

// Every K slice's token records of the chunk's rows into shared memory (cp.async), then a barrier: slice s's row r at
// (s * rows_cap + r) * pitch.
template <int WK>
__device__ __forceinline__ void stage_digit_rows(const WoqDigitsLaunch& d, int64_t row_begin, int rows, int kslice,
                                                 unsigned pitch, unsigned char* s_tok) {
  constexpr unsigned GB = mb::kDigitGroupBytes;
  constexpr int kChunks = GB / 16;  // 16-byte chunks per group record
  const int K = d.p.k;
  const int groups = static_cast<int>(mb::digit_groups(K));  // token records per row
  const char* A = static_cast<const char*>(d.p.A);
  for (int sr = 0; sr < WK * rows; ++sr) {  // (slice, row) pairs, CTA-uniform
    const int s = sr % WK, r = sr / WK;
    const int slice_groups = static_cast<int>(mb::digit_groups(max(0, min(kslice, K - s * kslice))));
    const char* src = A + ((row_begin + r) * groups + s * kslice / mb::kDigitGroup) * static_cast<int64_t>(GB);
    unsigned char* dst = s_tok + (s * d.rows_cap + r) * pitch;
#pragma unroll 4
    for (int c = threadIdx.x; c < slice_groups * kChunks; c += kDecodeThreads)
      cp_async16(static_cast<uint32_t>(__cvta_generic_to_shared(dst + 16 * c)), src + 16 * c, true);
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  __syncthreads();
}

// The lanes' sums of mma m's token rows (lanes q and q ^ 1 hold the same token's parts; the even lane stores their
// sum) into s_part, a barrier, then the K slices' sums to C.
template <typename T, int WK, int NM>
__device__ __forceinline__ void store_digit_sums(const WoqDigitsLaunch& d, float (&acc)[NM][2],
                                                 float (&s_part)[WK][16 * (kDecodeWarps / WK)][kDecodeTokens + 1],
                                                 int expert, int64_t row_begin, int rows, int col0) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int q = lane & 3, g = lane >> 2;
  const int rg = warp / WK, ks = warp % WK;
#pragma unroll
  for (int m = 0; m < NM; ++m) {
#pragma unroll
    for (int h = 0; h < 2; ++h) acc[m][h] += __shfl_xor_sync(0xffffffffu, acc[m][h], 1);
    if ((q & 1) == 0) {
      s_part[ks][rg * 16 + g][2 * m + (q >> 1)] = acc[m][0];
      s_part[ks][rg * 16 + g + 8][2 * m + (q >> 1)] = acc[m][1];
    }
  }
  __syncthreads();
  store_part_sums<T, WK>(d.p, s_part, expert, row_begin, rows, col0);
}

// The CTA's work for a chunk of `rows` token rows, NM = ceil(rows / 2) mmas a step (the kernel below picks NM),
// NB1 groups a wait in the one-mma body at group 128 (digits_groups_per_wait), weights with one scale per GROUP k
// (0: per row).
template <typename T, int WK, int GROUP, int NM, int NB1>
__device__ __forceinline__ void digits_chunk(const WoqDigitsLaunch& d, int expert, int64_t row_begin, int rows,
                                             float (&s_part)[WK][16 * (kDecodeWarps / WK)][kDecodeTokens + 1],
                                             unsigned char* s_tok) {
  static_assert(NM >= 1 && 2 * NM <= kDecodeTokens, "two token rows per mma");
  const WoqGemmParams& p = d.p;
  static_assert(GROUP == 0 || GROUP == 64 || GROUP == 128, "one scale per row, per 64 k or per 128 k");
  constexpr bool PER_ROW = GROUP == 0;
  constexpr int R = 16 * (kDecodeWarps / WK);  // weight rows per CTA (= output columns)
  constexpr int U = 4;                         // k32 steps per group
  constexpr int H = GROUP == 64 ? 2 : 1;       // scale groups per 128-k group
  constexpr int GK = PER_ROW ? 1 : GROUP;      // k per scale group, as a divisor (per row: none)
  // groups per wait (big batch): group 64's two scale groups a group leave the registers for 2 past one mma
  constexpr int NB = PER_ROW ? 4 : H == 1 ? (NM == 1 ? NB1 : 3) : NM == 1 ? 3 : 2;
  constexpr int SB = PER_ROW ? 1 : NB;         // scales and zeros per row in a buffer: one for group 0
  constexpr int CB = PER_ROW ? 1 : 2;          // their buffers
  constexpr unsigned GB = mb::kDigitGroupBytes;
  const int N = p.n, K = p.k;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int q = lane & 3, g = lane >> 2;
  const int rg = warp / WK, ks = warp % WK;
  const int col0 = blockIdx.y * R;
  const int sgroups = PER_ROW ? 1 : K / GK;                   // scale groups per row

  // The lane's weight rows r and r + 8 (a warp's 16 rows moved back inside n where they pass its end).
  const int64_t wrow = static_cast<int64_t>(expert) * N + min(col0 + rg * 16, N - 16) + g;
  // This warp's K slice in whole groups (K's last one a half where k % 128 == 64); group j of the slice is read at
  // min(j, last). An empty slice (the last ones of a short K) reads K's last group and computes nothing.
  const int kslice = decode_k_slice(K, WK);
  const int kb = ks * kslice;
  const int nb = static_cast<int>(mb::digit_groups(max(0, min(K, kb + kslice) - kb)));
  const int nb0 = static_cast<int>(mb::digit_groups(min(K, kslice)));
  const int last = max(nb, 1) - 1;
  const int kbc = min(kb, (K - 1) / mb::kDigitGroup * mb::kDigitGroup);
  const int g0 = PER_ROW ? 0 : kbc / GK;                           // the slice's first scale group
  const int64_t gi = wrow * sgroups + g0;
  const unsigned glast = static_cast<unsigned>(sgroups - 1 - g0);  // the row's last scale group, from g0
  const Int4Lane wl = int4_lane(p, wrow - g, g, kbc, (H == 2 ? 8 : 16) * q);
  const float* sp0 = static_cast<const float*>(p.scales) + gi;
  const float* sp1 = sp0 + 8 * sgroups;
  // Without zero points (symmetric int4 stored as q + 8) the zero is read from the scales' bytes and masked to 0,
  // then 8 is or-ed in: one unpredicated load either way.
  const uint8_t* zp0 = p.zeros ? p.zeros + gi : reinterpret_cast<const uint8_t*>(sp0);
  const uint8_t* zp1 = p.zeros ? zp0 + 8 * sgroups : reinterpret_cast<const uint8_t*>(sp1);
  const int zmask = p.zeros ? 0xff : 0, zor = p.zeros ? 0 : 8;

  // Shared-memory offsets: mma m's B column g is token 2m + g / 4's digit g % 4 (rows past the chunk and the unused
  // fourth digit read another column's bytes: their sums land in columns nobody reads); lane q's sums are token
  // 2m + q / 2's, whose record gives the group's sum and factor.
  const unsigned pitch = static_cast<unsigned>(nb0) * GB;
  const unsigned zero_at = static_cast<unsigned>(WK * d.rows_cap) * pitch;
  unsigned b_at[NM], f_at[NM];
#pragma unroll
  for (int m = 0; m < NM; ++m) {
    const unsigned tb = min(2 * m + (g >> 2), rows - 1), tf = min(2 * m + (q >> 1), rows - 1);
    b_at[m] = (ks * d.rows_cap + tb) * pitch + min(g & 3, 2) * mb::kDigitPlaneBytes + 8 * q;
    f_at[m] = (ks * d.rows_cap + tf) * pitch + mb::kDigitSumOffset;
  }
  const int ca = q & 1 ? 1 : 4096, cb = q & 1 ? 0 : 64, zf = q & 1 ? 0 : 1;

  float acc[NM][2];
#pragma unroll
  for (int m = 0; m < NM; ++m) acc[m][0] = acc[m][1] = 0.f;
  uint4 w[2][NB][2];
  float sv[CB][SB][H][2];
  int zv[CB][SB][2];  // the zero points of the H groups, byte h group h's
  // The constants of group jc's H scale groups (group 64: the second half's moved back to the first past the row's
  // end).
  auto load_consts = [&](int buf, int j, unsigned jc) {
#pragma unroll
    for (int h = 0; h < H; ++h) {
      const unsigned gc = H == 1 ? jc : min(H * jc + h, glast);
      const unsigned zo = p.zeros ? gc : 4u * gc;  // the zero's byte, or the scale's first byte
      sv[buf][j][h][0] = __ldg(sp0 + gc);
      sv[buf][j][h][1] = __ldg(sp1 + gc);
      const int z0 = (__ldg(zp0 + zo) & zmask) | zor, z1 = (__ldg(zp1 + zo) & zmask) | zor;
      zv[buf][j][0] = h == 0 ? z0 : zv[buf][j][0] | z0 << 8;
      zv[buf][j][1] = h == 0 ? z1 : zv[buf][j][1] | z1 << 8;
    }
  };
  // Big batch jb .. jb + NB - 1 of the slice into buffer buf; groups past the slice read its last.
  auto load_big = [&](int buf, int jb) {
#pragma unroll
    for (int j = 0; j < NB; ++j) {
      const unsigned jc = static_cast<unsigned>(min(jb + j, last));
      w[buf][j][0] = ld_int4_batch_row<H>(wl.p0, jc, glast, wl.batch_bytes, wl.half0);
      w[buf][j][1] = ld_int4_batch_row<H>(wl.p1, jc, glast, wl.batch_bytes, wl.half1);
      if constexpr (!PER_ROW) load_consts(buf, j, jc);
    }
  };
  // Group jb of the slice from slot j of buffer buf; a group past the slice (`valid` false) takes a zero factor.
  auto compute = [&](int buf, int j, int jb, bool valid) {
    const int cbuf = PER_ROW ? 0 : buf, cs = PER_ROW ? 0 : j;
    const unsigned goff = GB * static_cast<unsigned>(min(jb, last));
    const uint4 r0 = w[buf][j][0], r1 = w[buf][j][1];
    const uint32_t x0[4] = {r0.x, r0.y, r0.z, r0.w}, x1[4] = {r1.x, r1.y, r1.z, r1.w};
#pragma unroll
    for (int h = 0; h < H; ++h) {
      int c[NM][4];
#pragma unroll
      for (int m = 0; m < NM; ++m) c[m][0] = c[m][1] = c[m][2] = c[m][3] = 0;
#pragma unroll
      for (int u = h * (U / H); u < (h + 1) * (U / H); ++u) {
        // Word u's codes as bytes: the even k (low nibbles) in slots 4q..4q + 3, the odd k in 16 + 4q..16 + 4q + 3.
        const uint32_t a0 = x0[u] & 0x0f0f0f0fu, a1 = x1[u] & 0x0f0f0f0fu;
        const uint32_t a2 = (x0[u] >> 4) & 0x0f0f0f0fu, a3 = (x1[u] >> 4) & 0x0f0f0f0fu;
#pragma unroll
        for (int m = 0; m < NM; ++m) {
          const uint2 b = *reinterpret_cast<const uint2*>(s_tok + b_at[m] + goff + u * mb::kDigitStepBytes);
          mma_u8s8(c[m], a0, a1, a2, a3, b.x, b.y);
        }
      }
#pragma unroll
      for (int m = 0; m < NM; ++m) {
        // The record's sum (or, group 64, its half's: the first-half sum, or the rest) and factor.
        const unsigned char* rec = s_tok + (valid ? f_at[m] + goff : zero_at);
        int t;
        float f;
        if constexpr (H == 2) {
          const int4 r = *reinterpret_cast<const int4*>(rec);
          t = h == 0 ? r.z : r.x - r.z;
          f = __int_as_float(r.y);
        } else {
          const int2 r = *reinterpret_cast<const int2*>(rec);
          t = r.x;
          f = __int_as_float(r.y);
        }
        const int z0 = H == 1 ? zv[cbuf][cs][0] : (zv[cbuf][cs][0] >> 8 * h) & 0xff;
        const int z1 = H == 1 ? zv[cbuf][cs][1] : (zv[cbuf][cs][1] >> 8 * h) & 0xff;
        const int r0s = ca * c[m][0] + cb * c[m][1] - zf * z0 * t;  // row g
        const int r1s = ca * c[m][2] + cb * c[m][3] - zf * z1 * t;  // row g + 8
        acc[m][0] = fmaf(sv[cbuf][cs][h][0] * f, static_cast<float>(r0s), acc[m][0]);
        acc[m][1] = fmaf(sv[cbuf][cs][h][1] * f, static_cast<float>(r1s), acc[m][1]);
      }
    }
  };
  // Weights and their constants (nothing upstream writes them) are requested before waiting for the kernel that
  // writes A.
  if constexpr (PER_ROW) load_consts(0, 0, 0u);
  load_big(0, 0);
  if (threadIdx.x == 0) *reinterpret_cast<uint4*>(s_tok + zero_at) = make_uint4(0u, 0u, 0u, 0u);
  mb::wait_for_predecessor();
  mb::let_dependents_start();
  stage_digit_rows<WK>(d, row_begin, rows, kslice, pitch, s_tok);
  run_big_batches<NB>(nb, load_big, compute);  // gemm/woq_decode_sums.cuh: the staged kernel's schedule
  store_digit_sums<T, WK, NM>(d, acc, s_part, expert, row_begin, rows, col0);
}

// The CTA's work for a chunk of `rows` token rows on MXFP4 weights in the quarters form (MB_WOQ_MXFP4_QUARTERS:
// e2m1 codes re-ordered so that a lane's words of a 128-k group lie together, and four e8m0 scales a group, p.scales
// uint8, both in 16-row tiles: a warp's 16 rows of a group 1024 contiguous code bytes and 64 scale bytes), the digits
// in the quarters order (common/token_digits.cuh): step u of a 128-k group is its scale group u, and lane q's word of
// it the codes of k 32u + 8q + 0..7 in nibble order, word u of the lane's 16 bytes at 16q of the row's group (one
// 16-byte load a row and group, and one 4-byte load of its scales). A word's codes become 12 + 2 e2m1
// (mxfp4_offset_bytes: two byte permutes and an or per four codes), and a second mma of -12 times the digits into the
// same int32 sums takes the 12 back out, so that a step's sums are exactly those of 2 e2m1 times the digits; the
// lane forms R = 4096 S0 + 64 S1 (q even) or S2 (q odd) and adds R times the step's 2^(e - 127) into the group's fp32
// sum, then that times half the digits' factor into its total. The form pads a half group at the end of the layer's
// k (k % 128 == 64) to a whole one of zero codes and exponents, against the token digits' zero second half: K here is
// a multiple of 128, every row's group 64-byte aligned. NM mmas a step as digits_chunk; NB groups a wait.
template <typename T, int WK, int NM, int NB>
__device__ __forceinline__ void digits_chunk_mxfp4(const WoqDigitsLaunch& d, int expert, int64_t row_begin, int rows,
                                                   float (&s_part)[WK][16 * (kDecodeWarps / WK)][kDecodeTokens + 1],
                                                   unsigned char* s_tok) {
  static_assert(NM >= 1 && 2 * NM <= kDecodeTokens, "two token rows per mma");
  const WoqGemmParams& p = d.p;
  constexpr int R = 16 * (kDecodeWarps / WK);  // weight rows per CTA (= output columns)
  constexpr int U = 4;                         // k32 steps (scale groups) per group
  constexpr unsigned GB = mb::kDigitGroupBytes;
  const int N = p.n, K = p.k;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int q = lane & 3, g = lane >> 2;
  const int rg = warp / WK, ks = warp % WK;
  const int col0 = blockIdx.y * R;
  const int groups = K / mb::kDigitGroup;  // 128-k groups per row

  // The warp's 16 weight rows (a tile of the form; n % 16 == 0), the lane's rows g and g + 8 of it, the warp's K
  // slice and its groups as digits_chunk.
  const int64_t tile = static_cast<int64_t>(expert) * N + min(col0 + rg * 16, N - 16);  // its first row
  const int kslice = decode_k_slice(K, WK);
  const int kb = ks * kslice;
  const int nb = static_cast<int>(mb::digit_groups(max(0, min(K, kb + kslice) - kb)));
  const int nb0 = static_cast<int>(mb::digit_groups(min(K, kslice)));
  const int last = max(nb, 1) - 1;
  const int kbc = min(kb, (K - 1) / mb::kDigitGroup * mb::kDigitGroup);
  const int j0 = kbc / mb::kDigitGroup;  // the slice's first group
  constexpr unsigned kTileGroupBytes = 16 * 64;  // a tile's codes of one group
  const uint8_t* wp0 = p.B + tile * (K / 2) + static_cast<int64_t>(j0) * kTileGroupBytes + 64 * g;
  const uint8_t* wp1 = wp0 + 8 * 64;
  // a tile's scales of one group: 16 words, row r % 16's four scales word r % 16
  const uint32_t* sp0 = static_cast<const uint32_t*>(p.scales) + tile * groups + 16 * static_cast<int64_t>(j0) + g;
  const uint32_t* sp1 = sp0 + 8;

  // Shared-memory offsets as digits_chunk's.
  const unsigned pitch = static_cast<unsigned>(nb0) * GB;
  const unsigned zero_at = static_cast<unsigned>(WK * d.rows_cap) * pitch;
  unsigned b_at[NM], f_at[NM];
#pragma unroll
  for (int m = 0; m < NM; ++m) {
    const unsigned tb = min(2 * m + (g >> 2), rows - 1), tf = min(2 * m + (q >> 1), rows - 1);
    b_at[m] = (ks * d.rows_cap + tb) * pitch + min(g & 3, 2) * mb::kDigitPlaneBytes + 8 * q;
    f_at[m] = (ks * d.rows_cap + tf) * pitch + mb::kDigitSumOffset;
  }
  const int ca = q & 1 ? 1 : 4096, cb = q & 1 ? 0 : 64;

  float acc[NM][2];
#pragma unroll
  for (int m = 0; m < NM; ++m) acc[m][0] = acc[m][1] = 0.f;
  uint4 w[2][NB][2];        // the rows' words of the group's four steps
  uint32_t sc[2][NB][2];    // the rows' four e8m0 scales of the group
  // Big batch jb .. jb + NB - 1 of the slice into buffer buf; groups past the slice read its last.
  auto load_big = [&](int buf, int jb) {
#pragma unroll
    for (int j = 0; j < NB; ++j) {
      const unsigned jc = static_cast<unsigned>(min(jb + j, last));
      w[buf][j][0] = ld_weights_in_bounds(wp0 + kTileGroupBytes * jc + 16 * q);
      w[buf][j][1] = ld_weights_in_bounds(wp1 + kTileGroupBytes * jc + 16 * q);
      sc[buf][j][0] = __ldg(sp0 + 16 * jc);
      sc[buf][j][1] = __ldg(sp1 + 16 * jc);
    }
  };
  // Group jb of the slice from slot j of buffer buf; a group past the slice (`valid` false) takes a zero factor.
  auto compute = [&](int buf, int j, int jb, bool valid) {
    const unsigned goff = GB * static_cast<unsigned>(min(jb, last));
    float gs[NM][2];  // the group's sums of R times the steps' scales
    const uint4 r0 = w[buf][j][0], r1 = w[buf][j][1];
    const uint32_t xs0[U] = {r0.x, r0.y, r0.z, r0.w}, xs1[U] = {r1.x, r1.y, r1.z, r1.w};
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint32_t x0 = xs0[u], x1 = xs1[u];
      const uint32_t f0 = x0 ^ 0x88888888u, f1 = x1 ^ 0x88888888u;
      const uint32_t a0 = mxfp4_offset_bytes(x0, f0), a1 = mxfp4_offset_bytes(x1, f1);
      const uint32_t a2 = mxfp4_offset_bytes(x0 >> 16, f0 >> 16), a3 = mxfp4_offset_bytes(x1 >> 16, f1 >> 16);
      // The step's scales 2^(e - 127) as fp32 bits (e 0: 2^-127, the subnormal 0x400000).
      const unsigned sh = 8 * u;
      const float s0 = __int_as_float(max(static_cast<int>((sc[buf][j][0] >> sh) & 0xffu) << 23, 0x400000));
      const float s1 = __int_as_float(max(static_cast<int>((sc[buf][j][1] >> sh) & 0xffu) << 23, 0x400000));
#pragma unroll
      for (int m = 0; m < NM; ++m) {
        const uint2 b = *reinterpret_cast<const uint2*>(s_tok + b_at[m] + goff + u * mb::kDigitStepBytes);
        int c[4] = {0, 0, 0, 0};
        mma_u8s8(c, a0, a1, a2, a3, b.x, b.y);
        mma_s8s8_constant(c, 0xf4f4f4f4u, b.x, b.y);  // -12 a byte
        const float r0 = static_cast<float>(ca * c[0] + cb * c[1]);  // row g
        const float r1 = static_cast<float>(ca * c[2] + cb * c[3]);  // row g + 8
        gs[m][0] = u == 0 ? s0 * r0 : fmaf(s0, r0, gs[m][0]);
        gs[m][1] = u == 0 ? s1 * r1 : fmaf(s1, r1, gs[m][1]);
      }
    }
#pragma unroll
    for (int m = 0; m < NM; ++m) {
      const int2 r = *reinterpret_cast<const int2*>(s_tok + (valid ? f_at[m] + goff : zero_at));
      const float fh = 0.5f * __int_as_float(r.y);  // weights are 2 e2m1 times the scale, over 2
      acc[m][0] = fmaf(fh, gs[m][0], acc[m][0]);
      acc[m][1] = fmaf(fh, gs[m][1], acc[m][1]);
    }
  };
  // Weights and scales (nothing upstream writes them) are requested before waiting for the kernel that writes A.
  load_big(0, 0);
  if (threadIdx.x == 0) *reinterpret_cast<uint4*>(s_tok + zero_at) = make_uint4(0u, 0u, 0u, 0u);
  mb::wait_for_predecessor();
  mb::let_dependents_start();
  stage_digit_rows<WK>(d, row_begin, rows, kslice, pitch, s_tok);
  run_big_batches<NB>(nb, load_big, compute);
  store_digit_sums<T, WK, NM>(d, acc, s_part, expert, row_begin, rows, col0);
}

// The CTA's work for a chunk on int8 weights ([E, n, k] signed bytes, one scale per row
// (GROUP 0) or per 128 k), the digits in the quarters order (common/token_digits.cuh, written for group 32): step u of
// a 128-k group is its k 32u .. 32u + 31, lane q's 8 bytes of it k 32u + 8q + 0..7 in k order, which are the lane's
// A bytes of row g and g + 8 as stored (slots 4q..4q + 3 the first four, 16 + 4q.. the last), one 8-byte load a row
// and step and no instruction to widen them. R = 4096 S0 + 64 S1 (q even) or S2 (q odd), no zero term; a half group at
// the end of K (k % 128 == 64) reads its last two steps' weights from the row's last 32 k against zero digits. A
// 128-k group is 2 KB a warp, twice int4's, so NB 2 (one-mma body) or 1 keeps int4's bytes a wait and registers.
template <typename T, int WK, int GROUP, int NM, int NB>
__device__ __forceinline__ void digits_chunk_int8(const WoqDigitsLaunch& d, int expert, int64_t row_begin, int rows,
                                                  float (&s_part)[WK][16 * (kDecodeWarps / WK)][kDecodeTokens + 1],
                                                  unsigned char* s_tok) {
  static_assert(NM >= 1 && 2 * NM <= kDecodeTokens, "two token rows per mma");
  static_assert(GROUP == 0 || GROUP == 128, "one scale per row or per 128 k");
  constexpr bool PER_ROW = GROUP == 0;
  const WoqGemmParams& p = d.p;
  constexpr int R = 16 * (kDecodeWarps / WK);
  constexpr int U = 4;
  constexpr unsigned GB = mb::kDigitGroupBytes;
  const int N = p.n, K = p.k;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int q = lane & 3, g = lane >> 2;
  const int rg = warp / WK, ks = warp % WK;
  const int col0 = blockIdx.y * R;
  const int sgroups = PER_ROW ? 1 : K / 128;

  const int64_t wrow = static_cast<int64_t>(expert) * N + min(col0 + rg * 16, N - 16) + g;
  const int kslice = decode_k_slice(K, WK);
  const int kb = ks * kslice;
  const int nb = static_cast<int>(mb::digit_groups(max(0, min(K, kb + kslice) - kb)));
  const int nb0 = static_cast<int>(mb::digit_groups(min(K, kslice)));
  const int last = max(nb, 1) - 1;
  const int kbc = min(kb, (K - 1) / mb::kDigitGroup * mb::kDigitGroup);
  const int g0 = PER_ROW ? 0 : kbc / 128;
  const unsigned glast = static_cast<unsigned>(sgroups - 1 - g0);
  const int8_t* wp0 = reinterpret_cast<const int8_t*>(p.B) + wrow * K + 8 * q;
  const int8_t* wp1 = wp0 + 8 * static_cast<int64_t>(K);
  const float* sp0 = static_cast<const float*>(p.scales) + wrow * sgroups + g0;
  const float* sp1 = sp0 + 8 * sgroups;
  const int klast = K - 32;  // the row's last step: a half group's missing steps read it (against zero digits)

  const unsigned pitch = static_cast<unsigned>(nb0) * GB;
  const unsigned zero_at = static_cast<unsigned>(WK * d.rows_cap) * pitch;
  unsigned b_at[NM], f_at[NM];
#pragma unroll
  for (int m = 0; m < NM; ++m) {
    const unsigned tb = min(2 * m + (g >> 2), rows - 1), tf = min(2 * m + (q >> 1), rows - 1);
    b_at[m] = (ks * d.rows_cap + tb) * pitch + min(g & 3, 2) * mb::kDigitPlaneBytes + 8 * q;
    f_at[m] = (ks * d.rows_cap + tf) * pitch + mb::kDigitSumOffset;
  }
  const int ca = q & 1 ? 1 : 4096, cb = q & 1 ? 0 : 64;

  float acc[NM][2];
#pragma unroll
  for (int m = 0; m < NM; ++m) acc[m][0] = acc[m][1] = 0.f;
  uint2 w[2][NB][2][U];
  float sv[2][PER_ROW ? 1 : NB][2];
  if constexpr (PER_ROW) {
    sv[0][0][0] = __ldg(sp0);
    sv[0][0][1] = __ldg(sp1);
  }
  auto load_big = [&](int buf, int jb) {
#pragma unroll
    for (int j = 0; j < NB; ++j) {
      const unsigned jc = static_cast<unsigned>(min(jb + j, last));
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t at = min(kbc + 128 * static_cast<int>(jc) + 32 * u, klast);
        w[buf][j][0][u] = ld_weights_half_in_bounds(wp0 + at);
        w[buf][j][1][u] = ld_weights_half_in_bounds(wp1 + at);
      }
      if constexpr (!PER_ROW) {
        const unsigned gc = min(jc, glast);
        sv[buf][j][0] = __ldg(sp0 + gc);
        sv[buf][j][1] = __ldg(sp1 + gc);
      }
    }
  };
  auto compute = [&](int buf, int j, int jb, bool valid) {
    const unsigned goff = GB * static_cast<unsigned>(min(jb, last));
    const float s0 = PER_ROW ? sv[0][0][0] : sv[buf][j][0], s1 = PER_ROW ? sv[0][0][1] : sv[buf][j][1];
    int c[NM][4];
#pragma unroll
    for (int m = 0; m < NM; ++m) c[m][0] = c[m][1] = c[m][2] = c[m][3] = 0;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint2 x0 = w[buf][j][0][u], x1 = w[buf][j][1][u];
#pragma unroll
      for (int m = 0; m < NM; ++m) {
        const uint2 b = *reinterpret_cast<const uint2*>(s_tok + b_at[m] + goff + u * mb::kDigitStepBytes);
        mma_s8s8(c[m], x0.x, x1.x, x0.y, x1.y, b.x, b.y);
      }
    }
#pragma unroll
    for (int m = 0; m < NM; ++m) {
      const int2 r = *reinterpret_cast<const int2*>(s_tok + (valid ? f_at[m] + goff : zero_at));
      const float f = __int_as_float(r.y);
      acc[m][0] = fmaf(s0 * f, static_cast<float>(ca * c[m][0] + cb * c[m][1]), acc[m][0]);
      acc[m][1] = fmaf(s1 * f, static_cast<float>(ca * c[m][2] + cb * c[m][3]), acc[m][1]);
    }
  };
  load_big(0, 0);
  if (threadIdx.x == 0) *reinterpret_cast<uint4*>(s_tok + zero_at) = make_uint4(0u, 0u, 0u, 0u);
  mb::wait_for_predecessor();
  mb::let_dependents_start();
  stage_digit_rows<WK>(d, row_begin, rows, kslice, pitch, s_tok);
  run_big_batches<NB>(nb, load_big, compute);
  store_digit_sums<T, WK, NM>(d, acc, s_part, expert, row_begin, rows, col0);
}

// The int8 kernel: woq_decode_digits_kernel's chunks on digits_chunk_int8.
template <typename T, int WK, int GROUP, int NM_MAX>
__global__ void __launch_bounds__(kDecodeThreads, 2) woq_decode_digits_int8_kernel(WoqDigitsLaunch d) {
  __shared__ float s_part[WK][16 * (kDecodeWarps / WK)][kDecodeTokens + 1];
  extern __shared__ __align__(16) unsigned char s_tok[];
  const TileRows tile = cta_find_tile<kDecodeTokens>(d.p.offsets, d.p.num_experts);
  if (tile.expert < 0) return;
  const int rows = static_cast<int>(tile.end - tile.begin);
  const int nm = (rows + 1) / 2;
  auto chunk = [&](auto nm_tag) {
    constexpr int NM = decltype(nm_tag)::value;
    digits_chunk_int8<T, WK, GROUP, NM, NM == 1 ? 2 : 1>(d, tile.expert, tile.begin, rows, s_part, s_tok);
  };
  if constexpr (NM_MAX >= 4) if (nm == 4) return chunk(std::integral_constant<int, 4>{});
  if constexpr (NM_MAX >= 3) if (nm == 3) return chunk(std::integral_constant<int, 3>{});
  if constexpr (NM_MAX >= 2) if (nm == 2) return chunk(std::integral_constant<int, 2>{});
  chunk(std::integral_constant<int, 1>{});
}

// A chunk's mmas per step follow its own rows (the host knows only the most a chunk may have, NM_MAX * 2): at one
// token most chunks of a many-expert layer hold one row. GROUP 32: MXFP4 (digits_chunk_mxfp4): NB1 groups a wait at
// one mma a step (mxfp4_groups_per_wait), 2 past it.
template <typename T, int WK, int GROUP, int NM_MAX, int NB1>
__global__ void __launch_bounds__(kDecodeThreads, 2) woq_decode_digits_kernel(WoqDigitsLaunch d) {
  __shared__ float s_part[WK][16 * (kDecodeWarps / WK)][kDecodeTokens + 1];
  extern __shared__ __align__(16) unsigned char s_tok[];  // [WK][rows_cap][pitch], then 16 zero bytes
  const TileRows tile = cta_find_tile<kDecodeTokens>(d.p.offsets, d.p.num_experts);
  if (tile.expert < 0) return;
  const int rows = static_cast<int>(tile.end - tile.begin);
  const int nm = (rows + 1) / 2;  // CTA-uniform
  auto chunk = [&](auto nm_tag) {
    constexpr int NM = decltype(nm_tag)::value;
    if constexpr (GROUP == kMxfp4Group)
      digits_chunk_mxfp4<T, WK, NM, NM == 1 ? NB1 : 2>(d, tile.expert, tile.begin, rows, s_part, s_tok);
    else
      digits_chunk<T, WK, GROUP, NM, NB1>(d, tile.expert, tile.begin, rows, s_part, s_tok);
  };
  if constexpr (NM_MAX >= 4) if (nm == 4) return chunk(std::integral_constant<int, 4>{});
  if constexpr (NM_MAX >= 3) if (nm == 3) return chunk(std::integral_constant<int, 3>{});
  if constexpr (NM_MAX >= 2) if (nm == 2) return chunk(std::integral_constant<int, 2>{});
  chunk(std::integral_constant<int, 1>{});
}

// Groups a wait (a big batch) in the one-mma body at group 128, which has the registers for 4 (the bodies of 2-4
// mmas take 3, as every body at group 64; one scale per row, 4 in every body): 4 where a warp's slice of nb0 groups fills whole big batches of 4, since a big
// batch computes all its groups, those past the slice with a zero factor. H200, bench/woq_digits_probe.py, 4 against
// 3: Mixtral-8x7B's GEMM1 (32 groups) at 1 token 42.3 against 46.2 us, its GEMM2 (4 slices of 28) 30.2 against 32.5;
// Qwen3-30B-A3B's and DeepSeek-V2-Lite's GEMM1 (16 groups) 3-12% faster at 1-32 tokens; DeepSeek-V2-Lite's GEMM2
// (11 groups, 12 computed either way) 1-3% slower, Qwen3-30B-A3B's (6 groups, 8 computed) 3-8% slower.
int digits_groups_per_wait(int k, int wk) {
  const int64_t nb0 = mb::digit_groups(std::min(k, decode_k_slice(k, wk)));
  return nb0 % 4 == 0 ? 4 : 3;
}

// Groups a wait in the MXFP4 one-mma body: 3 where the call's rows are at most a seventh of the experts (a sparse
// call, few CTAs an SM, where a shorter first batch starts the mmas sooner), else 4 (the body takes either without
// spills at every NM_MAX). H100, WFP4A16 layers, 4 against 3: at 1 token (rows = top-k) GPT-OSS-20B (4 rows, 32
// experts) 1.055x, Qwen3-30B-A3B (8, 128) 1.029x, DeepSeek-V2-Lite (6, 64) 1.017x, Mixtral-8x7B (2, 8) 0.92x; at 2
// tokens GPT-OSS-20B (8, 32) 0.974x, DeepSeek-V2-Lite (12, 64) 0.942x, Qwen3-30B-A3B (16, 128) 0.998x; 4-16 tokens
// 0.92-1.01x (docs/measured/h100-2026-12-06-s22-mxfp4-quarters/call1, docs/measured/h100-2026-12-06-s23-mxfp4-nb4).
int mxfp4_groups_per_wait(int64_t max_rows, int num_experts) {
  return 7 * max_rows <= num_experts ? 3 : 4;
}

template <typename T, int GROUP>
mb_status launch_digits(const WoqGemmParams& p, int64_t max_rows, int k_split, bool after_trigger,
                        cudaStream_t stream) {
  const int rows_cap = static_cast<int>(std::min<int64_t>(kDecodeTokens, max_rows));
  return by_k_split(k_split, [&](auto wk) {
    constexpr int WK = decltype(wk)::value;
    const size_t smem = digits_smem(p.k, rows_cap, WK);
    if (smem > kTokenBudget)
      return fail(MB_ERR_UNSUPPORTED, "grouped gemm woq: the digits decode kernel's token records (%d-row chunks, k %d "
                  "in %d slices) need %zu bytes of shared memory, over its %zu: the staged or none tile",
                  rows_cap, p.k, WK, smem, kTokenBudget);
    const WoqDigitsLaunch d{p, rows_cap};
    // the one-mma body's big batch at group 128 and for MXFP4
    const bool four = (GROUP == kMxfp4Group ? mxfp4_groups_per_wait(max_rows, p.num_experts)
                                            : digits_groups_per_wait(p.k, WK)) == 4;
    auto go = [&](auto nm) {
      constexpr int NM_MAX = decltype(nm)::value;
      auto launch = [&](auto kernel) {
        return launch_decode(kernel, d, p.n, 16 * (kDecodeWarps / WK), decode_chunks(max_rows, p.num_experts),
                             after_trigger, stream, "grouped gemm woq", smem);
      };
      if constexpr (GROUP == 128 || GROUP == kMxfp4Group)
        return four ? launch(woq_decode_digits_kernel<T, WK, GROUP, NM_MAX, 4>)
                    : launch(woq_decode_digits_kernel<T, WK, GROUP, NM_MAX, 3>);
      else return launch(woq_decode_digits_kernel<T, WK, GROUP, NM_MAX, 3>);
    };
    switch ((rows_cap + 1) / 2) {
      case 1: return go(std::integral_constant<int, 1>{});
      case 2: return go(std::integral_constant<int, 2>{});
      case 3: return go(std::integral_constant<int, 3>{});
      default: return go(std::integral_constant<int, 4>{});
    }
  });
}

// launch_digits for int8 weights (GROUP 0 or 128).
template <typename T, int GROUP>
mb_status launch_digits_int8(const WoqGemmParams& p, int64_t max_rows, int k_split, bool after_trigger,
                             cudaStream_t stream) {
  const int rows_cap = static_cast<int>(std::min<int64_t>(kDecodeTokens, max_rows));
  return by_k_split(k_split, [&](auto wk) {
    constexpr int WK = decltype(wk)::value;
    const size_t smem = digits_smem(p.k, rows_cap, WK);
    if (smem > kTokenBudget)
      return fail(MB_ERR_UNSUPPORTED, "grouped gemm woq: the int8 digits kernel's token records (%d-row chunks, k %d "
                  "in %d slices) need %zu bytes of shared memory, over its %zu", rows_cap, p.k, WK, smem,
                  kTokenBudget);
    const WoqDigitsLaunch d{p, rows_cap};
    auto go = [&](auto nm) {
      constexpr int NM_MAX = decltype(nm)::value;
      return launch_decode(woq_decode_digits_int8_kernel<T, WK, GROUP, NM_MAX>, d, p.n, 16 * (kDecodeWarps / WK),
                           decode_chunks(max_rows, p.num_experts), after_trigger, stream, "grouped gemm woq", smem);
    };
    switch ((rows_cap + 1) / 2) {
      case 1: return go(std::integral_constant<int, 1>{});
      case 2: return go(std::integral_constant<int, 2>{});
      case 3: return go(std::integral_constant<int, 3>{});
      default: return go(std::integral_constant<int, 4>{});
    }
  });
}

}  // namespace

mb_status launch_woq_decode_digits(const WoqGemmParams& p, int64_t max_rows, int dtype, int k_split,
                                   bool after_trigger, cudaStream_t stream) {
  return dispatch_16bit(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (p.kind == MB_WOQ_MXFP4_QUARTERS)
      return launch_digits<T, kMxfp4Group>(p, max_rows, k_split, after_trigger, stream);
    if (p.kind == MB_WOQ_INT8)
      return p.group == 0 ? launch_digits_int8<T, 0>(p, max_rows, k_split, after_trigger, stream)
                          : launch_digits_int8<T, 128>(p, max_rows, k_split, after_trigger, stream);
    switch (p.group) {
      case 0: return launch_digits<T, 0>(p, max_rows, k_split, after_trigger, stream);
      case 64: return launch_digits<T, 64>(p, max_rows, k_split, after_trigger, stream);
      default: return launch_digits<T, 128>(p, max_rows, k_split, after_trigger, stream);
    }
  });
}

}  // namespace mbk
