"""The fused MoE runner: our CUDA kernels composed exactly as a plan says (PyTorch-callable).

Split as in vLLM's modular fused MoE: prepare_finalize (router GEMM, routing, top-k
weight/reduce, shared experts) around experts (permute, GEMM1, GEMM2), over a workspace sized
once. `kernel_sequence` is the single plan -> steps mapping the runner executes. Importing
this package needs no GPU; constructing a `MoERunner` does.
"""
from .graph import GraphedMoE
from .runner import MoERunner, require_cuda, runner_layout, workspace_bytes
from .sequence import check_runnable, kernel_sequence, steps_up_to
from .workspace import BufferSpec, Workspace, layout_bytes, workspace_layout

__all__ = ["MoERunner", "GraphedMoE", "BufferSpec", "Workspace", "check_runnable", "kernel_sequence",
           "layout_bytes", "require_cuda", "runner_layout", "steps_up_to", "workspace_bytes", "workspace_layout"]
