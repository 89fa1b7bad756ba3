"""Torch wrappers of the kernel library's entry points, one module per family: each validates its tensors and passes
raw pointers and the current CUDA stream. The wrappers allocate outputs they are not given and return them; a failing
entry point raises `KernelError` (library.call)."""
from .args import trusted_tensors
from .stages import (expand_rows, fc1_activation, finalize, routing, routing_prologue_fused,
                     routing_prologue_fused_routing,
                     routing_prologue_three_step, routing_prologue_three_step_routing, scale_columns,
                     three_step_workspace_bytes)
from .ep import (ep_combine, ep_layout, ep_local_ids, ep_nccl_all_gather, ep_nccl_exchange, ep_nccl_reduce_scatter, ep_pack_send, ep_nvlink_combine, ep_nvlink_dispatch,
                 ep_nvlink_gather, ep_nvlink_return,
                 ep_nvlink_wait, ep_permute_layout, ep_permute_rows, layout_block_counts)
from .gemm import (gemm_placement_ints, grouped_gemm_sm80, grouped_gemm_sm80_workspace_bytes, grouped_gemm_sm90,
                   grouped_gemm_sm90_finalize, grouped_gemm_sm90_gated, grouped_gemm_sm90_workspace_bytes,
                   new_gemm_placement, tactic_struct)
from .fp8 import (expand_rows_fp8, expand_rows_fp8_dequantized, expand_rows_fp8_prequantized, fc1_activation_fp8,
                  fc1_activation_fp8_dequantized, fp8_scale_shapes,
                  grouped_gemm_fp8, grouped_gemm_fp8_finalize, grouped_gemm_fp8_gated, grouped_gemm_fp8_gated_quantized,
                  grouped_gemm_fp8_quantizing_finalize, grouped_gemm_fp8_workspace_bytes, quantize_fp8)
from .woq import (grouped_gemm_woq, grouped_gemm_woq_finalize, grouped_gemm_woq_sm90, grouped_gemm_woq_sm90_gated, grouped_gemm_woq_sm90_finalize,
                  grouped_gemm_woq_sm90_workspace_bytes, token_digits, expand_rows_digits, fc1_activation_digits, woq_dequantize)

__all__ = ["trusted_tensors", "expand_rows", "fc1_activation", "finalize", "routing", "routing_prologue_fused",
           "routing_prologue_fused_routing",
           "routing_prologue_three_step", "routing_prologue_three_step_routing", "scale_columns",
           "three_step_workspace_bytes", "ep_combine", "ep_layout",
           "ep_local_ids", "ep_nccl_all_gather", "ep_nccl_exchange", "ep_nccl_reduce_scatter", "ep_pack_send", "ep_nvlink_combine", "ep_nvlink_dispatch", "ep_nvlink_gather", "ep_nvlink_return", "ep_nvlink_wait",
           "ep_permute_layout", "ep_permute_rows", "layout_block_counts", "gemm_placement_ints", "grouped_gemm_sm80",
           "grouped_gemm_sm80_workspace_bytes", "grouped_gemm_sm90", "grouped_gemm_sm90_finalize",
           "grouped_gemm_sm90_gated", "grouped_gemm_sm90_workspace_bytes", "new_gemm_placement", "tactic_struct",
           "expand_rows_fp8", "expand_rows_fp8_dequantized", "expand_rows_fp8_prequantized", "fc1_activation_fp8",
           "fc1_activation_fp8_dequantized", "fp8_scale_shapes",
           "grouped_gemm_fp8", "grouped_gemm_fp8_finalize", "grouped_gemm_fp8_gated", "grouped_gemm_fp8_gated_quantized",
           "grouped_gemm_fp8_quantizing_finalize", "grouped_gemm_fp8_workspace_bytes", "quantize_fp8",
           "grouped_gemm_woq", "grouped_gemm_woq_finalize", "grouped_gemm_woq_sm90", "grouped_gemm_woq_sm90_gated", "grouped_gemm_woq_sm90_finalize",
           "grouped_gemm_woq_sm90_workspace_bytes", "token_digits", "expand_rows_digits", "fc1_activation_digits", "woq_dequantize"]
