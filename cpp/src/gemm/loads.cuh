// The decode GEMMs' global loads (gemm/decode.cu, gemm/fp8_decode.cu, gemm/woq_decode.cu): 16-byte loads straight
// into registers, predicated instead of branched, or unpredicated where the caller keeps the address in bounds.
#pragma once

#include <cstdint>

namespace mbk {

// Predicated 16-byte loads (zeros when `valid` is false) as single asm statements: no branch per
// load, so a batch of U * 4 weight and U * NT token loads is straight-line code and every load is
// in flight before the batch's first mma (behind a branch per load ptxas sank each load to its
// use: 48 registers and one load in flight per warp).
// The asm of one such load with cache qualifiers QUAL (a string literal: asm takes no run-time text).
#define MB_PREDICATED_LD16(QUAL, p, valid)                                                               \
  uint4 v;                                                                                              \
  asm volatile(                                                                                         \
      "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n"    \
      " mov.b32 %3, 0;\n @p ld.global.nc" QUAL ".v4.u32 {%0,%1,%2,%3}, [%4];\n}\n"                          \
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)                                                      \
      : "l"(p), "r"((int)(valid)));                                                                     \
  return v
// Weights are read once per layer: kept out of L1, and L2 is asked for the whole 256-byte run at once.
__device__ __forceinline__ uint4 ld_weights(const void* p, bool valid) {
  MB_PREDICATED_LD16(".L1::no_allocate.L2::256B", p, valid);
}
__device__ __forceinline__ uint4 ld_tokens(const void* p, bool valid) { MB_PREDICATED_LD16("", p, valid); }
#undef MB_PREDICATED_LD16

// The same loads unpredicated, for a kernel whose addresses are kept inside the tensors (clamped) instead: one
// instruction each, where the predicated form spends five more zeroing the registers.
#define MB_LD16(QUAL, p)                                                                                        \
  uint4 v;                                                                                                     \
  asm volatile("ld.global.nc" QUAL ".v4.u32 {%0,%1,%2,%3}, [%4];\n"                                             \
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)                                                    \
               : "l"(p));                                                                                      \
  return v
__device__ __forceinline__ uint4 ld_weights_in_bounds(const void* p) { MB_LD16(".L1::no_allocate.L2::256B", p); }
__device__ __forceinline__ uint4 ld_tokens_in_bounds(const void* p) { MB_LD16("", p); }
#undef MB_LD16
// Half of it: 8 bytes of weights (a lane's 16 k of int4 codes in each half of a 128-k batch, gemm/woq_decode.cu's
// group-64 form).
__device__ __forceinline__ uint2 ld_weights_half_in_bounds(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// A lane's int4 codes of one weight row in 128-k batch jc, as the staged and digits decode kernels read them
// (gemm/woq_decode.cu, gemm/woq_decode_digits.cu), from wp (the row's bytes at the lane's place in the slice's first
// batch), each batch `batch_bytes` on (64 in rows, 1024 in 16-row tiles): one 16-byte load (32 k), or, for weights
// with H == 2 scale groups a batch (groups of 64), 8 bytes of each half (16 k each, the halves 32 bytes apart). A half
// batch at the end of K (its second scale group 2 jc + 1 past the row's last, glast, counted from the lane's first) is
// read at `half` bytes back (tiles hold its rows' 32 bytes row by row), its second half from the first's bytes.
template <int H>
__device__ __forceinline__ uint4 ld_int4_batch_row(const uint8_t* wp, unsigned jc, unsigned glast,
                                                   unsigned batch_bytes, unsigned half) {
  if constexpr (H == 2) {
    const bool whole = 2 * jc + 1 <= glast;
    const uint8_t* at = wp + batch_bytes * jc - (whole ? 0u : half);
    const uint2 lo = ld_weights_half_in_bounds(at), hi = ld_weights_half_in_bounds(at + (whole ? 32u : 0u));
    return make_uint4(lo.x, lo.y, hi.x, hi.y);
  } else {
    return ld_weights_in_bounds(wp + batch_bytes * jc);
  }
}

}  // namespace mbk
