// mb_grouped_gemm_woq_sm90 (issue 47; sm_90a): the mixed-input wgmma GEMM of gemm/woq_sm90.cuh with CUTLASS's TMA store
// of the product (C [rows, n]), and the workspace of the three entry points.
#include "gemm/woq_sm90.cuh"  // first: it sets NDEBUG and CuTe's extended wgmma shapes before CUTLASS is included

extern "C" {

size_t mb_grouped_gemm_woq_sm90_workspace(int num_experts) {
  if (num_experts <= 0) return 0;
  const int sm = mb::device_attribute(cudaDevAttrMultiProcessorCount);
  return std::max({mbk::woq_sm90_gated_workspace(num_experts, sm), mbk::woq_sm90_finalize_workspace(num_experts, sm),
                   mbk::woq_sm90_max_workspace<mbk::WoqStore>(num_experts, sm)});
}

mb_status mb_grouped_gemm_woq_sm90(const void* A, const void* B, int kind, const void* scales, const void* zeros,
                                   int group, void* C, const int64_t* expert_first_token_offset, int num_experts,
                                   int64_t max_rows, int n, int k, int dtype, mb_gemm_tactic tactic, void* workspace,
                                   size_t workspace_bytes, cudaStream_t stream) {
  const mbk::WoqSm90Params p{A, B, scales, zeros, C, expert_first_token_offset, num_experts, n, k, group, kind};
  MB_TRY(mbk::check_woq_sm90(p, max_rows, dtype, tactic));
  if (max_rows == 0) return MB_OK;
  return mbk::dispatch_woq_sm90<mbk::WoqStore>(dtype, kind, tactic.tile, [&](auto g) {
    using G = decltype(g);
    return mbk::run_woq_sm90<G>(p, [](const mbk::GroupArrays<G>& a) { return mbk::woq_store_arguments<G>(a); },
                                workspace, workspace_bytes, stream);
  });
}

}  // extern "C"
