// The sm90 grouped-GEMM entry points (mb_grouped_gemm_sm90, _finalize, _gated and their workspace and
// placement queries): their argument checks, the tactic's check (gemm/tactic.cuh), then the tactic's kernel
// (gemm/sm90_dispatch.cuh). Compiled for sm_90a; a device other than compute capability 9.0 is refused.
#include <algorithm>
#include <cstdint>

#include "gemm/mma.cuh"
#include "gemm/sm90_dispatch.cuh"
#include "gemm/tactic.cuh"

namespace mbk {
namespace {

bool device_is_sm90() {
  // sm_90a code runs on 9.0 only (arch-specific features are not forward compatible).
  return mb::device_attribute(cudaDevAttrComputeCapabilityMajor) == 9 &&
         mb::device_attribute(cudaDevAttrComputeCapabilityMinor) == 0;
}

mb_status check_common(const void* A, const void* B, const void* out, const int64_t* offsets, int num_experts,
                       int64_t max_rows, int n, int k, int dtype, int weight_layout) {
  if (!device_is_sm90())
    return fail(MB_ERR_UNSUPPORTED, "grouped gemm sm90: needs a compute capability 9.0 device");
  if (dtype == MB_FP32) return fail(MB_ERR_UNSUPPORTED, "grouped gemm sm90: fp32 is not implemented");
  if (dtype != MB_BF16 && dtype != MB_FP16)
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm sm90: unknown dtype %d", dtype);
  if (!A || !B || !out || !offsets || num_experts <= 0 || max_rows < 0 || n <= 0 || k <= 0)
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm sm90: null pointer or non-positive size");
  if (n % 8 != 0 || k % 8 != 0)
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm sm90: n (%d) and k (%d) must be multiples of 8", n, k);
  if (weight_layout != MB_WEIGHTS_ROW_MAJOR && weight_layout != MB_WEIGHTS_BLOCKED64)
    return fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm sm90: weight_layout %d is not MB_WEIGHTS_ROW_MAJOR (%d) or "
                "MB_WEIGHTS_BLOCKED64 (%d)", weight_layout, MB_WEIGHTS_ROW_MAJOR, MB_WEIGHTS_BLOCKED64);
  if (weight_layout == MB_WEIGHTS_BLOCKED64 && (n % 64 != 0 || k % 64 != 0))
    return fail(MB_ERR_INVALID_ARGUMENT,
                "grouped gemm sm90: MB_WEIGHTS_BLOCKED64 needs the weight rows per expert (%d) and k (%d) to be "
                "multiples of 64", n, k);
  return MB_OK;
}

}  // namespace
}  // namespace mbk

extern "C" {

size_t mb_grouped_gemm_sm90_workspace(int num_experts, int64_t max_rows, int n, int k) {
  (void)max_rows;
  (void)n;
  (void)k;
  if (num_experts <= 0) return 0;
  const int sm = mb::device_attribute(cudaDevAttrMultiProcessorCount);
  size_t cw = 0;
  for (int epi : {mbk::EPI_STORE, mbk::EPI_GATED, mbk::EPI_FINALIZE}) {
    auto each = [&](auto tag) {
      using T = decltype(tag);
      switch (epi) {
        case mbk::EPI_STORE: return mbk::max_cutlass_workspace_bytes<T, mbk::EPI_STORE>(num_experts, sm);
        case mbk::EPI_GATED: return mbk::max_cutlass_workspace_bytes<T, mbk::EPI_GATED>(num_experts, sm);
        default: return mbk::max_cutlass_workspace_bytes<T, mbk::EPI_FINALIZE>(num_experts, sm);
      }
    };
    cw = std::max({cw, each(__nv_bfloat16{}), each(__half{})});
  }
  return cw;  // the decode and mma kernels need none
}

size_t mb_grouped_gemm_sm90_placement_ints(void) { return mbk::kPlacementInts; }

int mb_grouped_gemm_sm90_placement_recorded(void) { return mbk::placement_record_exists() ? 1 : 0; }

mb_status mb_grouped_gemm_sm90(const void* A, const void* B, const void* bias, void* C,
                               const int64_t* expert_first_token_offset, int num_experts, int64_t max_rows,
                               int n, int k, int dtype, int weight_layout, mb_gemm_tactic tactic, void* workspace,
                               size_t workspace_bytes, cudaStream_t stream) {
  MB_TRY(mbk::check_common(A, B, C, expert_first_token_offset, num_experts, max_rows, n, k, dtype, weight_layout));
  MB_TRY(mbk::check_tactic(tactic, {"grouped gemm sm90", true, mbk::EPI_STORE, nullptr}));
  if (max_rows == 0) return MB_OK;
  mbk::GemmParams p = mbk::gemm_params(A, B, bias, C, expert_first_token_offset, num_experts, n, k, MB_ACT_IDENTITY);
  p.weights_blocked = weight_layout == MB_WEIGHTS_BLOCKED64;
  return mbk::dispatch_sm90(p, max_rows, dtype, mbk::EPI_STORE, tactic, workspace, workspace_bytes, stream);
}

mb_status mb_grouped_gemm_sm90_finalize(const void* A, const void* B, const void* bias, void* out,
                                        const int64_t* expert_first_token_offset,
                                        const int32_t* permuted_to_unpermuted, const float* permuted_weights,
                                        int num_experts, int64_t max_rows, int num_tokens, int top_k, int n,
                                        int k, int dtype, int weight_layout, mb_gemm_tactic tactic,
                                        int32_t* placement, void* workspace, size_t workspace_bytes,
                                        cudaStream_t stream) {
  MB_TRY(mbk::check_common(A, B, out, expert_first_token_offset, num_experts, max_rows, n, k, dtype, weight_layout));
  if (!permuted_to_unpermuted || !permuted_weights || top_k <= 0 || num_tokens < 0)
    return mbk::fail(MB_ERR_INVALID_ARGUMENT, "grouped gemm sm90 finalize: missing maps/weights or bad top_k");
  MB_TRY(mbk::check_tactic(tactic, {"grouped gemm sm90 finalize", true, mbk::EPI_FINALIZE, placement}));
  if (max_rows == 0) return MB_OK;
  mbk::GemmParams p = mbk::gemm_params(A, B, bias, out, expert_first_token_offset, num_experts, n, k, MB_ACT_IDENTITY);
  p.permuted_to_unpermuted = permuted_to_unpermuted;
  p.permuted_weights = permuted_weights;
  p.top_k = top_k;
  p.weights_blocked = weight_layout == MB_WEIGHTS_BLOCKED64;
  p.placement = placement;
  return mbk::dispatch_sm90(p, max_rows, dtype, mbk::EPI_FINALIZE, tactic, workspace, workspace_bytes, stream);
}

mb_status mb_grouped_gemm_sm90_gated(const void* A, const void* B, const void* bias, void* C,
                                     const int64_t* expert_first_token_offset, int num_experts, int64_t max_rows,
                                     int inter, int k, int dtype, int activation, float swiglu_alpha,
                                     float swiglu_limit, int weight_layout, mb_gemm_tactic tactic,
                                     int32_t* placement, void* workspace, size_t workspace_bytes,
                                     cudaStream_t stream) {
  MB_TRY(mbk::check_gated("grouped gemm sm90 gated", inter, activation));
  MB_TRY(mbk::check_common(A, B, C, expert_first_token_offset, num_experts, max_rows, 2 * inter, k, dtype,
                           weight_layout));
  MB_TRY(mbk::check_tactic(tactic, {"grouped gemm sm90 gated", true, mbk::EPI_GATED, placement}));
  if (max_rows == 0) return MB_OK;
  mbk::GemmParams p = mbk::gemm_params(A, B, bias, C, expert_first_token_offset, num_experts, inter, k, activation);
  p.swiglu_alpha = swiglu_alpha;
  p.swiglu_limit = swiglu_limit;
  p.gate_up_interleaved = 1;
  p.weights_blocked = weight_layout == MB_WEIGHTS_BLOCKED64;
  p.placement = placement;
  return mbk::dispatch_sm90(p, max_rows, dtype, mbk::EPI_GATED, tactic, workspace, workspace_bytes, stream);
}

}  // extern "C"
