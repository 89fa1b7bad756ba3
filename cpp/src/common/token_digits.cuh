// The token digits' layout (stages/token_digits.cu writes it, gemm/woq_decode_digits.cu reads it): per row, per
// 128-k group, MB_TOKEN_DIGITS_BATCH_BYTES bytes; and the warp's computation of one group's record, which every kernel
// that writes them shares (stages/token_digits.cu from 16-bit rows, stages/expand_rows.cu as it expands the tokens'
// rows, stages/fc1_activation.cu as it activates GEMM1's rows), so that each writes the same bytes.
//   - bytes 0..383, the three digit planes as the int8 mma's B fragments read them: step s (32 k), digit d, lane
//     q, then 8 bytes, at 96 s + 32 d + 8 q. Which 8 k a lane's bytes hold at a step is the order of the GEMM's
//     weight groups (DigitOrder):
//       rows (one scale per row or per 128 k): lane q holds k 32q .. 32q + 31 of the group as int4 codes, step s
//         k 32q + 8s + 0..7; a step's word widened to 8 bits puts the even k in the mma's slots 4q..4q + 3 and the
//         odd ones in 16 + 4q..16 + 4q + 3, so the 8 bytes hold the digits of the step's k {0, 2, 4, 6} then
//         {1, 3, 5, 7};
//       halves (one scale per 64 k, so that each step's mma sums the k of one scale group): k 16q .. 16q + 15 of
//         each half h, step s = 2h + t k 64h + 16q + 8t + 0..7, the bytes as for rows;
//       quarters (MXFP4's one scale per 32 k: each step one scale group): step s k 32s + 8q + 0..7, the bytes in k
//         order (the decode kernel's byte permute takes a word's codes in nibble order);
//   - bytes 384..395: the int32 sum of the group's 4096 d0 + 64 d1 + d2, the fp32 factor 2^(E - 12), and the int32
//     sum over its first half (k 0..63);
//   - bytes 396..399: zero.
// A row whose k % 128 == 64 ends with a half group: its k 64..127 are zero digits.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/common.cuh"
#include "moe_build_kernels.h"

namespace mb {

constexpr int kDigitGroup = 128;                              // k per group: one exponent
constexpr unsigned kDigitGroupBytes = MB_TOKEN_DIGITS_BATCH_BYTES;
constexpr unsigned kDigitStepBytes = 96;                      // a 32-k step: three planes of four lanes' 8 bytes
constexpr unsigned kDigitPlaneBytes = 32;                     // one digit of a step: four lanes' 8 bytes
constexpr unsigned kDigitSumOffset = 384;                     // int32 sum, the fp32 factor, the first half's sum
static_assert(kDigitGroupBytes % 16 == 0 && kDigitGroupBytes >= kDigitSumOffset + 16, "16-byte records");

// Which k a lane's 8 bytes of a step hold (the layout above), by the GEMM's weight group.
enum DigitOrder : int { kOrderRows = 0, kOrderHalves = 1, kOrderQuarters = 2 };
inline DigitOrder digit_order(int group) {
  return group == 64 ? kOrderHalves : group == 32 ? kOrderQuarters : kOrderRows;
}

// One group's record as a lane of the warp that computed it holds it: its 4-byte run of each digit plane, and (every
// lane) the group's sum, factor and first half's sum.
struct DigitWords {
  uint32_t plane[3];
  int sum;
  float factor;
  int half_sum;
};

// The groups of a row of k values (k % 64 == 0): the last one a half where k % 128 == 64.
__host__ __device__ constexpr int64_t digit_groups(int64_t k) { return (k + kDigitGroup - 1) / kDigitGroup; }

// The checks the digits' writers share: `name`, a row's k, whole 128-k groups, or (weights with one scale per 64 or
// 32 k, the GEMM's `group` 64 or 32) whole 64-k halves; group 0, 32, 64 or 128; dtype fp16 or bf16.
inline mb_status check_digits_rows(const char* who, const char* name, int k, int group, int dtype) {
  MB_REQUIRE(group == 0 || group == 32 || group == 64 || group == 128, "%s: group must be 0, 32, 64 or 128 (the "
             "GEMM's weights' scale group), got %d", who, group);
  const int whole = group == 64 || group == 32 ? kDigitGroup / 2 : kDigitGroup;
  MB_REQUIRE(k >= whole && k % whole == 0, "%s: %s must be a positive multiple of %d for group %d, got %d", who, name,
             whole, group, k);
  if (dtype != MB_FP16 && dtype != MB_BF16)
    return fail(dtype == MB_FP32 ? MB_ERR_UNSUPPORTED : MB_ERR_INVALID_ARGUMENT,
                "%s: dtype %d is not one of fp16(1), bf16(2)", who, dtype);
  return MB_OK;
}

// Four digits (one per k) as the bytes of a word, k order.
__device__ __forceinline__ uint32_t pack_digits(const int (&d)[4]) {
  return (d[0] & 0xff) | (d[1] & 0xff) << 8 | (d[2] & 0xff) << 16 | static_cast<uint32_t>(d[3] & 0xff) << 24;
}

// A warp's 128-k group, lane l holding k 4l .. 4l + 3 as fp32 (16-bit values, exactly): the group's largest magnitude
// m (its bits, as an integer max: non-negative floats order as their bits) gives E = ilogb(m) - 5, so y = x / 2^E has
// |y| < 64; then d0 = rint(y), d1 = rint(64 (y - d0)), d2 = rint(64 (64 (y - d0) - d1)), each step exact in fp32, so
// x = 2^(E - 12) (4096 d0 + 64 d1 + d2) wherever x has no bits below 2^(E - 12) (every bf16 value within 2^10 of m,
// every fp16 one within 2^7). A group holding an inf or NaN gets a NaN factor. Every lane of the warp calls it, with
// the order it will store the record in.
__device__ __forceinline__ DigitWords digit_words(const float (&x)[4], DigitOrder order) {
  const int lane = threadIdx.x & 31;
  uint32_t top = 0;
  bool finite = true;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    top = max(top, __float_as_uint(fabsf(x[i])));
    finite = finite && isfinite(x[i]);
  }
  top = __reduce_max_sync(0xffffffffu, top);
  finite = __all_sync(0xffffffffu, finite);
  const float m = __uint_as_float(top);
  const int e = m > 0.f ? max(ilogbf(m), -100) - 5 : 0;  // |x| / 2^e < 64; tiny groups keep 2^-e finite
  const float inv = __int_as_float((127 - e) << 23);      // 2^-e
  int d[3][4], sum = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float y = x[i] * inv, d0 = rintf(y), r1 = (y - d0) * 64.f, d1 = rintf(r1), d2 = rintf((r1 - d1) * 64.f);
    d[0][i] = static_cast<int>(d0);
    d[1][i] = static_cast<int>(d1);
    d[2][i] = static_cast<int>(d2);
    sum += 4096 * d[0][i] + 64 * d[1][i] + d[2][i];
  }
  DigitWords w;
  w.sum = __reduce_add_sync(0xffffffffu, sum);
  w.half_sum = __reduce_add_sync(0xffffffffu, lane < 16 ? sum : 0);  // lanes 0..15 hold k 0..63
  w.factor = finite ? __int_as_float((127 + e - 12) << 23) : __int_as_float(0x7fc00000);  // 2^(e - 12)
  // Lanes pair up to store each plane's 8-byte runs: in the rows and halves orders the even lane of a pair the even
  // k's digits (k 0, 2, 4, 6 of the 8), the odd lane the odd k's (1, 3, 5, 7); in the quarters order each its own.
  const bool odd = lane & 1;
#pragma unroll
  for (int p = 0; p < 3; ++p) {
    const uint32_t own = pack_digits(d[p]), other = __shfl_xor_sync(0xffffffffu, own, 1);
    w.plane[p] = order == kOrderQuarters ? own
                 : odd                   ? __byte_perm(own, other, 0x3175)
                                         : __byte_perm(own, other, 0x6420);
  }
  return w;
}

// Stores the calling lane's part of a group's record at rec (16-byte aligned) in `order`, the one digit_words was
// given. Lane l holds k 4l .. 4l + 3, the even lane of a pair at byte 0 of its 8-byte run, the odd at 4: rows, lane
// q = l / 8 of the GEMM's at step s = (l % 8) / 2; halves, lane q = (l / 4) % 4 at step 2 (l / 16) + (l / 2) % 2;
// quarters, lane q = (l % 8) / 2 at step l / 8.
__device__ __forceinline__ void store_digit_words(const DigitWords& w, uint8_t* rec, DigitOrder order) {
  const int lane = threadIdx.x & 31;
  const unsigned step = order == kOrderHalves     ? 2 * (lane >> 4) + ((lane >> 1) & 1)
                        : order == kOrderQuarters ? lane >> 3
                                                  : (lane & 7) >> 1;
  const unsigned q = order == kOrderHalves ? (lane >> 2) & 3 : order == kOrderQuarters ? (lane & 7) >> 1 : lane >> 3;
  const unsigned at = step * kDigitStepBytes + q * 8 + ((lane & 1) ? 4 : 0);
#pragma unroll
  for (int p = 0; p < 3; ++p) *reinterpret_cast<uint32_t*>(rec + at + p * kDigitPlaneBytes) = w.plane[p];
  if (lane == 0) {
    *reinterpret_cast<uint4*>(rec + kDigitSumOffset) = make_uint4(
        static_cast<uint32_t>(w.sum), __float_as_uint(w.factor), static_cast<uint32_t>(w.half_sum), 0u);
  }
}

}  // namespace mb
