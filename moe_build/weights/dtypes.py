"""The torch dtype of each spec dtype: one table for the checkpoint loaders, the OOTB graph, the runner and the
plugin (the spec package itself does not import torch)."""
from __future__ import annotations

import torch

from ..spec import DType, OutputDType

TORCH_DTYPE = {DType.FP32: torch.float32, DType.FP16: torch.float16, DType.BF16: torch.bfloat16}
TORCH_OUT_DTYPE = {OutputDType.FP32: torch.float32, OutputDType.FP16: torch.float16, OutputDType.BF16: torch.bfloat16}
