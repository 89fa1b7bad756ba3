"""The CUDA kernel library: its C ABI (`abi`), building it with nvcc (`build`), loading it (`library`) and
one torch wrapper per entry point (`ops`)."""
from .abi import (SIGNATURES, Activation, DType, Fp8Accumulation, Fp8Scaling, GemmKernel, GemmLaunch, GemmTacticStruct, GemmTile, OutputL2,
                  Routing, Status, StepTactic, WeightLayout, WoqInput, WoqKind)
from .library import KernelError, Launch, is_recording, last_error, load_library, recording, replay
from .ops import (ep_combine, ep_layout, ep_local_ids, ep_nccl_all_gather, ep_nccl_exchange, ep_nccl_reduce_scatter, ep_pack_send, ep_nvlink_combine, ep_nvlink_dispatch, ep_nvlink_gather, ep_nvlink_return, ep_nvlink_wait, ep_permute_layout, ep_permute_rows, layout_block_counts, expand_rows, expand_rows_fp8, expand_rows_fp8_dequantized, expand_rows_fp8_prequantized, fc1_activation, fc1_activation_fp8, fc1_activation_fp8_dequantized,
                  finalize, quantize_fp8, gemm_placement_ints, grouped_gemm_fp8, grouped_gemm_fp8_finalize, grouped_gemm_fp8_quantizing_finalize, grouped_gemm_fp8_gated, grouped_gemm_fp8_gated_quantized,
                  grouped_gemm_fp8_workspace_bytes, grouped_gemm_sm80,
                  grouped_gemm_sm80_workspace_bytes, grouped_gemm_sm90, grouped_gemm_sm90_finalize,
                  grouped_gemm_sm90_gated, grouped_gemm_sm90_workspace_bytes, grouped_gemm_woq, grouped_gemm_woq_finalize,
                  grouped_gemm_woq_sm90, grouped_gemm_woq_sm90_gated, grouped_gemm_woq_sm90_finalize,
                  grouped_gemm_woq_sm90_workspace_bytes, new_gemm_placement,
                  routing, scale_columns, token_digits, expand_rows_digits, fc1_activation_digits, woq_dequantize,
                  routing_prologue_fused, routing_prologue_fused_routing, routing_prologue_three_step,
                  routing_prologue_three_step_routing, tactic_struct,
                  three_step_workspace_bytes,
                  trusted_tensors)

__all__ = ["SIGNATURES", "Activation", "DType", "Fp8Accumulation", "Fp8Scaling", "GemmKernel", "GemmLaunch", "GemmTacticStruct", "GemmTile",
           "OutputL2", "Routing", "Status", "StepTactic", "WeightLayout", "WoqInput", "WoqKind", "KernelError", "Launch", "is_recording",
           "last_error", "load_library", "recording", "replay",
           "ep_combine", "ep_layout", "ep_local_ids", "ep_nccl_all_gather", "ep_nccl_exchange", "ep_nccl_reduce_scatter", "ep_pack_send", "ep_nvlink_combine", "ep_nvlink_dispatch", "ep_nvlink_gather", "ep_nvlink_return", "ep_nvlink_wait", "ep_permute_layout", "ep_permute_rows", "layout_block_counts", "expand_rows", "expand_rows_fp8", "expand_rows_fp8_dequantized", "expand_rows_fp8_prequantized", "fc1_activation", "fc1_activation_fp8", "fc1_activation_fp8_dequantized",
           "finalize", "quantize_fp8", "gemm_placement_ints", "grouped_gemm_fp8", "grouped_gemm_fp8_finalize", "grouped_gemm_fp8_quantizing_finalize", "grouped_gemm_fp8_gated", "grouped_gemm_fp8_gated_quantized",
           "grouped_gemm_fp8_workspace_bytes", "grouped_gemm_sm80",
           "grouped_gemm_sm80_workspace_bytes", "grouped_gemm_sm90", "grouped_gemm_sm90_finalize",
           "grouped_gemm_sm90_gated", "grouped_gemm_sm90_workspace_bytes", "grouped_gemm_woq", "grouped_gemm_woq_finalize",
           "grouped_gemm_woq_sm90", "grouped_gemm_woq_sm90_gated", "grouped_gemm_woq_sm90_finalize",
           "grouped_gemm_woq_sm90_workspace_bytes", "new_gemm_placement",
           "routing", "scale_columns", "token_digits", "expand_rows_digits", "fc1_activation_digits", "woq_dequantize",
           "routing_prologue_fused", "routing_prologue_fused_routing", "routing_prologue_three_step",
           "routing_prologue_three_step_routing", "tactic_struct",
           "three_step_workspace_bytes",
           "trusted_tensors"]
