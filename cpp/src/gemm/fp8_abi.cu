// The FP8 grouped-GEMM entry points (mb_grouped_gemm_fp8, mb_grouped_gemm_fp8_finalize, its quantizing form
// mb_grouped_gemm_fp8_quantizing_finalize, mb_grouped_gemm_fp8_gated and their workspace query): argument checks,
// the tactic's check (gemm/tactic.cuh), then the tactic's kernel: gemm/fp8_decode.cu (mma.sync e4m3, compute
// capability 8.9 and later) or gemm/fp8_sm90.cu (wgmma, 9.0 only), each with the plain store, the finalize or the
// gated epilogue. The mma tiles have no FP8 form.
#include <cstdint>

#include "gemm/fp8.cuh"
#include "gemm/mma.cuh"
#include "gemm/tactic.cuh"

namespace mbk {
namespace {

int compute_capability() {
  return 10 * mb::device_attribute(cudaDevAttrComputeCapabilityMajor) +
         mb::device_attribute(cudaDevAttrComputeCapabilityMinor);
}

mb_status check_fp8_args(const Fp8GemmParams& p, int64_t max_rows, int dtype, const char* who) {
  if (dtype != MB_BF16 && dtype != MB_FP16)
    return fail(dtype == MB_FP32 ? MB_ERR_UNSUPPORTED : MB_ERR_INVALID_ARGUMENT,
                "%s: output dtype %d is not bf16 (%d) or fp16 (%d)", who, dtype, MB_BF16, MB_FP16);
  if (p.scaling != MB_FP8_ROWWISE && p.scaling != MB_FP8_BLOCK128)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: scaling %d is not rowwise (%d) or block128 (%d)", who, p.scaling,
                MB_FP8_ROWWISE, MB_FP8_BLOCK128);
  if (p.accumulation != MB_FP8_ACCUM_PROMOTED && p.accumulation != MB_FP8_ACCUM_FAST)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: accumulation %d is not promoted (%d) or fast (%d)", who, p.accumulation,
                MB_FP8_ACCUM_PROMOTED, MB_FP8_ACCUM_FAST);
  if (p.accumulation == MB_FP8_ACCUM_FAST && p.scaling != MB_FP8_ROWWISE)
    return fail(MB_ERR_UNSUPPORTED, "%s: fast accumulation takes rowwise scales only (block128 scales each 128-k "
                "block's sum as it is promoted)", who);
  const bool has_a = p.a16 != nullptr || (p.A != nullptr && p.scale_a != nullptr);  // 16-bit rows need no scale_a
  if (!has_a || !p.B || !p.C || !p.scale_b || !p.offsets || p.num_experts <= 0 || max_rows < 0 || p.n <= 0 ||
      p.k <= 0)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: null pointer or non-positive size", who);
  if (p.n % 16 != 0 || p.k % 16 != 0)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: n (%d) and k (%d) must be multiples of 16", who, p.n, p.k);
  if (!aligned16(p.a16 != nullptr ? p.a16 : p.A) || !aligned16(p.B) || !aligned16(p.C))
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: A, B and C must be 16-byte aligned", who);
  return MB_OK;
}

// Both finalize entry points after check_fp8_args: the token maps and routing weights their epilogue reads.
mb_status set_finalize_maps(Fp8GemmParams& p, const int32_t* permuted_to_unpermuted, const float* permuted_weights,
                            int num_tokens, int top_k, const char* who) {
  if (!permuted_to_unpermuted || !permuted_weights || top_k <= 0 || num_tokens < 0)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: missing maps/weights or bad top_k", who);
  p.epilogue = EPI_FINALIZE;
  p.permuted_to_unpermuted = permuted_to_unpermuted;
  p.permuted_weights = permuted_weights;
  p.top_k = top_k;
  return MB_OK;
}

// Both entry points after their own checks: the tactic's check, then its kernel with p's epilogue. The FP8
// wgmma kernel takes no placement (its tiles are not the placed scheduler's): a placed launch is refused
// before check_tactic, which would ask for a placement region.
mb_status run_fp8(const Fp8GemmParams& p, int64_t max_rows, int dtype, const mb_gemm_tactic& tactic, void* workspace,
                  size_t workspace_bytes, cudaStream_t stream, const char* who) {
  const int cc = compute_capability();
  if (tactic.launch == MB_LAUNCH_PLACED)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: the FP8 kernels launch plainly or after a trigger (tactic launch "
                "placed)", who);
  MB_TRY(check_tactic(tactic, TacticSite{who, cc == 90, p.epilogue, nullptr, p.scaling == MB_FP8_BLOCK128}));
  switch (tactic.kernel) {
    case MB_GEMM_DECODE:
      if (cc < 89)
        return fail(MB_ERR_UNSUPPORTED, "%s: needs compute capability 8.9 or later (this device: %d.%d)", who,
                    cc / 10, cc % 10);
      return launch_fp8_decode(p, max_rows, dtype, tactic.k_split, tactic.tile == MB_TILE_DECODE_TWOCTA,
                               tactic.launch == MB_LAUNCH_AFTER_TRIGGER, stream);
    case MB_GEMM_WGMMA:
      return run_fp8_wgmma(p, max_rows, dtype, tactic, workspace, workspace_bytes, stream);
    default:
      return fail(MB_ERR_UNSUPPORTED, "%s: the mma tiles have no FP8 kernel (decode or wgmma)", who);
  }
}

}  // namespace
}  // namespace mbk

extern "C" {

size_t mb_grouped_gemm_fp8_workspace(int num_experts, int64_t max_rows, int n, int k) {
  (void)max_rows;
  (void)n;
  (void)k;
  if (num_experts <= 0 || mbk::compute_capability() != 90) return 0;  // only the wgmma kernel needs one
  return mbk::fp8_wgmma_workspace_bytes(num_experts);
}

mb_status mb_grouped_gemm_fp8(const void* A, const float* scale_a, const void* B, const float* scale_b, int scaling,
                              int accumulation, const void* bias, void* C, const int64_t* expert_first_token_offset,
                              int num_experts, int64_t max_rows, int n, int k, int dtype, mb_gemm_tactic tactic,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const char* who = "grouped gemm fp8";
  const mbk::Fp8GemmParams p{static_cast<const uint8_t*>(A), scale_a, static_cast<const uint8_t*>(B), scale_b, bias,
                             C, expert_first_token_offset, num_experts, n, k, scaling, accumulation};
  MB_TRY(mbk::check_fp8_args(p, max_rows, dtype, who));
  return mbk::run_fp8(p, max_rows, dtype, tactic, workspace, workspace_bytes, stream, who);
}

mb_status mb_grouped_gemm_fp8_finalize(const void* A, const float* scale_a, const void* B, const float* scale_b,
                                       int scaling, int accumulation, const void* bias, void* out,
                                       const int64_t* expert_first_token_offset,
                                       const int32_t* permuted_to_unpermuted, const float* permuted_weights,
                                       int num_experts, int64_t max_rows, int num_tokens, int top_k, int n, int k,
                                       int dtype, mb_gemm_tactic tactic, void* workspace, size_t workspace_bytes,
                                       cudaStream_t stream) {
  const char* who = "grouped gemm fp8 finalize";
  mbk::Fp8GemmParams p{static_cast<const uint8_t*>(A), scale_a, static_cast<const uint8_t*>(B), scale_b, bias,
                       out, expert_first_token_offset, num_experts, n, k, scaling, accumulation};
  MB_TRY(mbk::check_fp8_args(p, max_rows, dtype, who));
  MB_TRY(mbk::set_finalize_maps(p, permuted_to_unpermuted, permuted_weights, num_tokens, top_k, who));
  p.evict_last = tactic.output_l2 == MB_OUTPUT_L2_EVICT_LAST;
  return mbk::run_fp8(p, max_rows, dtype, tactic, workspace, workspace_bytes, stream, who);
}

mb_status mb_grouped_gemm_fp8_quantizing_finalize(const void* A16, const float* static_scale, const void* B,
                                                  const float* scale_b, int scaling, int accumulation,
                                                  const void* bias, void* out,
                                                  const int64_t* expert_first_token_offset,
                                                  const int32_t* permuted_to_unpermuted, const float* permuted_weights,
                                                  int num_experts, int64_t max_rows, int num_tokens, int top_k, int n,
                                                  int k, int dtype, mb_gemm_tactic tactic, cudaStream_t stream) {
  const char* who = "grouped gemm fp8 quantizing finalize";
  mbk::Fp8GemmParams p{nullptr, nullptr, static_cast<const uint8_t*>(B), scale_b, bias, out,
                       expert_first_token_offset, num_experts, n, k, scaling, accumulation};
  p.a16 = A16;
  p.a16_static_scale = static_scale;
  MB_TRY(mbk::check_fp8_args(p, max_rows, dtype, who));
  if (scaling == MB_FP8_BLOCK128 && static_scale != nullptr)
    return mbk::fail(MB_ERR_INVALID_ARGUMENT, "%s: block128 rows take their 128-column groups' own scales, not a "
                     "static one", who);
  MB_TRY(mbk::set_finalize_maps(p, permuted_to_unpermuted, permuted_weights, num_tokens, top_k, who));
  if (k > MB_FP8_QUANTIZING_MAX_K)
    return mbk::fail(MB_ERR_UNSUPPORTED, "%s: k %d is past %d (a chunk's quantized rows in shared memory)", who, k,
                     MB_FP8_QUANTIZING_MAX_K);
  if (tactic.kernel != MB_GEMM_DECODE)
    return mbk::fail(MB_ERR_UNSUPPORTED, "%s: the decode kernel only (tactic kernel %d)", who, tactic.kernel);
  return mbk::run_fp8(p, max_rows, dtype, tactic, nullptr, 0, stream, who);
}

mb_status mb_grouped_gemm_fp8_gated(const void* A, const float* scale_a, const void* B, const float* scale_b,
                                    int scaling, int accumulation, const void* bias, void* C,
                                    const float* c_static_scale, float* c_scales,
                                    const int64_t* expert_first_token_offset, int num_experts, int64_t max_rows,
                                    int inter, int k, int dtype, int activation, float swiglu_alpha,
                                    float swiglu_limit, mb_gemm_tactic tactic, void* workspace,
                                    size_t workspace_bytes, cudaStream_t stream) {
  const char* who = "grouped gemm fp8 gated";
  MB_TRY(mbk::check_gated(who, inter, activation));
  if (scaling == MB_FP8_BLOCK128 && tactic.kernel != MB_GEMM_DECODE && tactic.kernel != MB_GEMM_WGMMA)
    return mbk::fail(MB_ERR_UNSUPPORTED, "%s: block128 scales take the decode or the wgmma kernel (tactic kernel %d)",
                     who, tactic.kernel);
  if (scaling == MB_FP8_BLOCK128 && tactic.kernel == MB_GEMM_WGMMA && inter % 64 != 0)
    return mbk::fail(MB_ERR_INVALID_ARGUMENT, "%s: block128 scales on the wgmma kernel read W1 by 64-row gate/up "
                     "halves: inter (%d) must be a multiple of 64", who, inter);
  if (scaling == MB_FP8_BLOCK128 && c_static_scale != nullptr)
    return mbk::fail(MB_ERR_UNSUPPORTED, "%s: block128 layers quantize GEMM2's input per 128-column group, not by a "
                     "static scale (c_static_scale)", who);
  mbk::Fp8GemmParams p{static_cast<const uint8_t*>(A), scale_a, static_cast<const uint8_t*>(B), scale_b, bias,
                       C, expert_first_token_offset, num_experts, 2 * inter, k, scaling, accumulation};
  MB_TRY(mbk::check_fp8_args(p, max_rows, dtype, who));
  if ((c_static_scale == nullptr) != (c_scales == nullptr))
    return mbk::fail(MB_ERR_INVALID_ARGUMENT, "%s: c_static_scale and c_scales go together (an e4m3 C and its row "
                     "scales), or neither", who);
  p.c_static_scale = c_static_scale;
  p.c_scales = c_scales;
  p.epilogue = mbk::EPI_GATED;
  p.evict_last = tactic.output_l2 == MB_OUTPUT_L2_EVICT_LAST;
  p.activation = activation;
  p.swiglu_alpha = swiglu_alpha;
  p.swiglu_limit = swiglu_limit;
  return mbk::run_fp8(p, max_rows, dtype, tactic, workspace, workspace_bytes, stream, who);
}

}  // extern "C"
