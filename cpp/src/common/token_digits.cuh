// The token digits' layout (stages/token_digits.cu writes it, gemm/woq_decode_digits.cu reads it): per row, per
// 128-k group, MB_TOKEN_DIGITS_BATCH_BYTES bytes.
//   - bytes 0..383, the three digit planes as the int8 mma's B fragments read them: step s (32 k), digit d, lane
//     q, then 8 bytes, at 96 s + 32 d + 8 q. Lane q of the decode kernel holds the int4 codes of k 32q .. 32q + 31
//     of the group; its word s, k 32q + 8s + 0..7, widened to 8 bits puts the even k in the mma's slots 4q..4q + 3
//     and the odd ones in 16 + 4q..16 + 4q + 3, so the 8 bytes hold the digits of k 32q + 8s + {0, 2, 4, 6} then
//     {1, 3, 5, 7};
//   - bytes 384..391: the int32 sum of the group's 4096 d0 + 64 d1 + d2, then the fp32 factor 2^(E - 12);
//   - bytes 392..399: zero.
#pragma once

#include "moe_build_kernels.h"

namespace mb {

constexpr int kDigitGroup = 128;                              // k per group: one exponent
constexpr unsigned kDigitGroupBytes = MB_TOKEN_DIGITS_BATCH_BYTES;
constexpr unsigned kDigitStepBytes = 96;                      // a 32-k step: three planes of four lanes' 8 bytes
constexpr unsigned kDigitPlaneBytes = 32;                     // one digit of a step: four lanes' 8 bytes
constexpr unsigned kDigitSumOffset = 384;                     // int32 sum, then the fp32 factor
static_assert(kDigitGroupBytes % 16 == 0 && kDigitGroupBytes >= kDigitSumOffset + 16, "16-byte records");

}  // namespace mb
