// The weight-only grouped-GEMM entry points (mb_grouped_gemm_woq, and mb_grouped_gemm_woq_finalize on the decode
// kernel): the argument and tactic checks, then the tactic's kernel: gemm/woq_decode.cu (MB_GEMM_DECODE, a few rows
// per expert) or gemm/woq_mma.cu (MB_GEMM_MMA, many), on 16-bit activations (or their token digits).
#include <cstdint>

#include "gemm/mma.cuh"
#include "gemm/tactic.cuh"
#include "gemm/woq.cuh"

namespace mbk {
namespace {

bool woq_tactic_ok(const mb_gemm_tactic& t) {
  const bool decode = t.kernel == MB_GEMM_DECODE &&
                      (t.tile == MB_TILE_NONE || t.tile == MB_TILE_DECODE_STAGED || t.tile == MB_TILE_DECODE_STAGED_C4 ||
                       t.tile == MB_TILE_DECODE_DIGITS) &&
                      (t.k_split == 1 || t.k_split == 2 || t.k_split == 4 || t.k_split == 8);
  const bool mma = t.kernel == MB_GEMM_MMA && (t.tile == MB_TILE_MMA_64x128 || t.tile == MB_TILE_MMA_128x128) &&
                   t.k_split == 0;
  return (decode || mma) && (t.launch == MB_LAUNCH_PLAIN || t.launch == MB_LAUNCH_AFTER_TRIGGER) &&
         t.output_l2 == MB_OUTPUT_L2_PLAIN;
}

mb_status check_woq_args(const WoqGemmParams& p, int a_type, int64_t max_rows, const mb_gemm_tactic& t) {
  const char* who = "grouped gemm woq";
  if (a_type != MB_INPUT_DTYPE && a_type != MB_INPUT_DIGITS)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: a_type %d is not dtype (%d) or digits (%d)", who, a_type,
                MB_INPUT_DTYPE, MB_INPUT_DIGITS);
  const bool digits_tile = t.kernel == MB_GEMM_DECODE && t.tile == MB_TILE_DECODE_DIGITS;
  if ((a_type == MB_INPUT_DIGITS) != digits_tile)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: the token digits (a_type %d) go with the decode kernel's digits tile "
                "and only there (tactic %s %s)", who, MB_INPUT_DIGITS, kernel_name(t.kernel), tile_name(t.tile));
  if (!is_int4(p.kind) && p.kind != MB_WOQ_INT8 && p.kind != MB_WOQ_MXFP4 && p.kind != MB_WOQ_MXFP4_QUARTERS)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: kind %d is not int4 (%d), int4_tiles (%d), int8 (%d), mxfp4 (%d) or "
                "mxfp4_quarters (%d)", who, p.kind, MB_WOQ_INT4, MB_WOQ_INT4_TILES, MB_WOQ_INT8, MB_WOQ_MXFP4,
                MB_WOQ_MXFP4_QUARTERS);
  if (p.kind == MB_WOQ_MXFP4_QUARTERS && a_type != MB_INPUT_DIGITS)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: kind mxfp4_quarters (%d) is the digits tile's form: A must be token "
                "digits (a_type %d)", who, MB_WOQ_MXFP4_QUARTERS, MB_INPUT_DIGITS);
  if (a_type == MB_INPUT_DIGITS && !digits_fit(p))
    return fail(MB_ERR_UNSUPPORTED, "%s: the token digits take int4 weights with group 0 or 128 and k a multiple of "
                "128, or group 64 and k a multiple of 64, MXFP4 in its quarters form (kind %d) with k a multiple of "
                "128, or int8 with group 0 and k a multiple of 64 or group 128 and k a multiple of 128 (kind %d, group "
                "%d, k %d)", who, MB_WOQ_MXFP4_QUARTERS, p.kind, p.group, p.k);
  if (p.kind == MB_WOQ_MXFP4_QUARTERS && reinterpret_cast<uintptr_t>(p.scales) % 4 != 0)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: mxfp4_quarters scales must be 4-byte aligned (a group's four to a "
                "load)", who);
  if (!p.A || !p.B || !p.C || !p.scales || !p.offsets || p.num_experts <= 0 || max_rows < 0 || p.n <= 0 || p.k <= 0)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: null pointer or non-positive size", who);
  if (p.n % 16 != 0 || p.k % 32 != 0)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: n (%d) must be a multiple of 16 and k (%d) of 32", who, p.n, p.k);
  const bool mxfp4 = p.kind == MB_WOQ_MXFP4 || p.kind == MB_WOQ_MXFP4_QUARTERS;
  const bool group_ok = mxfp4 ? p.group == kMxfp4Group
                              : (p.group == 0 || ((p.group == 32 || p.group == 64 || p.group == 128) &&
                                                  p.k % p.group == 0));
  if (!group_ok)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: group %d with k %d (int4/int8: 0, or 32, 64 or 128 dividing k; mxfp4: 32)",
                who, p.group, p.k);
  if (p.zeros && !is_int4(p.kind))
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: zero points exist for int4 only", who);
  if (!aligned16(p.A) || !aligned16(p.B) || !aligned16(p.C))
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: A, B and C must be 16-byte aligned", who);
  if (!woq_tactic_ok(t))
    return fail(MB_ERR_UNSUPPORTED, "%s: no kernel for tactic %s %s (k_split %d, launch %d, output_l2 %d): the decode "
                "kernel (tile none, staged or digits, k_split 1, 2, 4 or 8) or the mma kernel (tile 64x128 or 128x128), "
                "launched plain or after_trigger, with plain outputs", who, kernel_name(t.kernel), tile_name(t.tile), t.k_split,
                t.launch, t.output_l2);
  return MB_OK;
}

}  // namespace
}  // namespace mbk

extern "C" mb_status mb_grouped_gemm_woq(const void* A, int a_type, const void* B, int kind,
                                         const void* scales, const uint8_t* zeros, int group, const void* bias,
                                         void* C, const int64_t* expert_first_token_offset, int num_experts,
                                         int64_t max_rows, int n, int k, int dtype, mb_gemm_tactic tactic,
                                         cudaStream_t stream) {
  const mbk::WoqGemmParams p{A, static_cast<const uint8_t*>(B), scales, zeros, bias, C,
                             expert_first_token_offset, num_experts, n, k, group, kind};
  MB_TRY(mbk::check_woq_args(p, a_type, max_rows, tactic));
  if (max_rows == 0) return MB_OK;
  const bool after = tactic.launch == MB_LAUNCH_AFTER_TRIGGER;
  if (tactic.kernel == MB_GEMM_MMA) return mbk::launch_woq_mma(p, max_rows, dtype, tactic.tile, after, stream);
  return mbk::launch_woq_decode(p, max_rows, dtype, tactic.k_split, tactic.tile, after, stream);
}

extern "C" mb_status mb_grouped_gemm_woq_finalize(const void* A, int a_type, const void* B, int kind,
                                                  const void* scales, const uint8_t* zeros, int group,
                                                  const void* bias, void* out,
                                                  const int64_t* expert_first_token_offset,
                                                  const int32_t* permuted_to_unpermuted,
                                                  const float* permuted_weights, int num_experts, int64_t max_rows,
                                                  int num_tokens, int top_k, int n, int k, int dtype,
                                                  mb_gemm_tactic tactic, cudaStream_t stream) {
  const char* who = "grouped gemm woq finalize";
  if (!permuted_to_unpermuted || !permuted_weights || num_tokens < 0 || top_k < 1)
    return mbk::fail(MB_ERR_INVALID_ARGUMENT, "%s: null finalize map or weights, num_tokens < 0 or top_k < 1", who);
  if (tactic.kernel != MB_GEMM_DECODE)
    return mbk::fail(MB_ERR_UNSUPPORTED, "%s: the finalize epilogue runs on the decode kernel only, not %s", who,
                     mbk::kernel_name(tactic.kernel));
  const mbk::WoqGemmParams p{A, static_cast<const uint8_t*>(B), scales, zeros, bias, out,
                             expert_first_token_offset, num_experts, n, k, group, kind, permuted_to_unpermuted,
                             permuted_weights, top_k};
  MB_TRY(mbk::check_woq_args(p, a_type, max_rows, tactic));
  if (max_rows == 0 || num_tokens == 0) return MB_OK;
  return mbk::launch_woq_decode(p, max_rows, dtype, tactic.k_split, tactic.tile,
                                tactic.launch == MB_LAUNCH_AFTER_TRIGGER, stream);
}
