// mb_grouped_gemm_woq_sm90 (issue 47; sm_90a): the mixed-input wgmma GEMM of gemm/woq_sm90.cuh with CUTLASS's TMA store
// of the product (C [rows, n]), and the workspace of both entry points.
#include "gemm/woq_sm90.cuh"  // first: it sets NDEBUG and CuTe's extended wgmma shapes before CUTLASS is included

extern "C" {

size_t mb_grouped_gemm_woq_sm90_workspace(int num_experts) {
  if (num_experts <= 0) return 0;
  const int sm = mb::device_attribute(cudaDevAttrMultiProcessorCount);
  size_t bytes = mbk::woq_sm90_gated_workspace(num_experts, sm);
  for (int dtype : {MB_BF16, MB_FP16})
    for (int kind : {MB_WOQ_INT4, MB_WOQ_INT8})
      for (int tile : mbk::kWoqTiles)
        mbk::dispatch_woq_sm90<mbk::WoqStore>(dtype, kind, tile, [&](auto g) {
          bytes = std::max(bytes, mbk::woq_sm90_workspace<decltype(g)>(num_experts, sm).total);
          return MB_OK;
        });
  return bytes;
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
