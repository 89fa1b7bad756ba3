// The FP8 grouped-GEMM entry points (mb_grouped_gemm_fp8 and its workspace query): argument checks, the
// tactic's check (gemm/tactic.cuh), then the tactic's kernel: gemm/fp8_decode.cu (mma.sync e4m3, compute
// capability 8.9 and later) or gemm/fp8_sm90.cu (wgmma, 9.0 only). The mma tiles have no FP8 form.
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

mb_status check_fp8_args(const Fp8GemmParams& p, int64_t max_rows, int dtype) {
  const char* who = "grouped gemm fp8";
  if (dtype != MB_BF16 && dtype != MB_FP16)
    return fail(dtype == MB_FP32 ? MB_ERR_UNSUPPORTED : MB_ERR_INVALID_ARGUMENT,
                "%s: output dtype %d is not bf16 (%d) or fp16 (%d)", who, dtype, MB_BF16, MB_FP16);
  if (p.scaling != MB_FP8_ROWWISE && p.scaling != MB_FP8_BLOCK128)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: scaling %d is not rowwise (%d) or block128 (%d)", who, p.scaling,
                MB_FP8_ROWWISE, MB_FP8_BLOCK128);
  if (!p.A || !p.B || !p.C || !p.scale_a || !p.scale_b || !p.offsets || p.num_experts <= 0 || max_rows < 0 ||
      p.n <= 0 || p.k <= 0)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: null pointer or non-positive size", who);
  if (p.n % 16 != 0 || p.k % 16 != 0)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: n (%d) and k (%d) must be multiples of 16", who, p.n, p.k);
  if (!aligned16(p.A) || !aligned16(p.B) || !aligned16(p.C))
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: A, B and C must be 16-byte aligned", who);
  return MB_OK;
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
                              const void* bias, void* C, const int64_t* expert_first_token_offset, int num_experts,
                              int64_t max_rows, int n, int k, int dtype, mb_gemm_tactic tactic, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  const mbk::Fp8GemmParams p{static_cast<const uint8_t*>(A), scale_a, static_cast<const uint8_t*>(B), scale_b, bias,
                             C, expert_first_token_offset, num_experts, n, k, scaling};
  MB_TRY(mbk::check_fp8_args(p, max_rows, dtype));
  const int cc = mbk::compute_capability();
  MB_TRY(mbk::check_tactic(tactic, mbk::TacticSite{"grouped gemm fp8", cc == 90, mbk::EPI_STORE, nullptr}));
  switch (tactic.kernel) {
    case MB_GEMM_DECODE:
      if (cc < 89)
        return mbk::fail(MB_ERR_UNSUPPORTED, "grouped gemm fp8: needs compute capability 8.9 or later (this device: %d.%d)",
                    cc / 10, cc % 10);
      return mbk::launch_fp8_decode(p, max_rows, dtype, tactic.k_split, tactic.launch == MB_LAUNCH_AFTER_TRIGGER,
                                    stream);
    case MB_GEMM_WGMMA:
      return mbk::run_fp8_wgmma(p, max_rows, dtype, tactic, workspace, workspace_bytes, stream);
    default:
      return mbk::fail(MB_ERR_UNSUPPORTED, "grouped gemm fp8: the mma tiles have no FP8 kernel (decode or wgmma)");
  }
}

}  // extern "C"
