"""Tiny weight-only checkpoints written by their producers' own code, each beside the same checkpoint dequantized.

tests/test_woq_checkpoints.py's writers quantize the experts of tiny random Qwen3-MoE, Mixtral and DeepSeek-V3 models:
compressed-tensors' own quantizer and pack-quantized compressor (W4A16 group 32, W4A16 asymmetric group 64, W8A16 per
channel; what llm-compressor writes), ModelOpt's own int4 packing with AWQ pre-quant scales (W4A16_AWQ group 64), and
AutoAWQ's GEMM packing written to its documented format (AutoAWQ does not install beside this torch). For each
(family, format) OUT/<family>-<format>/ holds:
  woq/          the checkpoint as written (config.json with its quantization_config; ModelOpt's hf_quant_config.json);
  dequantized/  the same model with every quantized matrix replaced by its dequantization in bf16 (the producer's own
                decompression where it has one, compressed-tensors', else the format's exact meaning), times the AWQ
                pre-quant scale of its input where the format stores one (x * s @ W^T = x @ (W * s)^T), and no
                quantization_config: a plain checkpoint transformers loads.
The GPU machines lack these tools, so this runs on a CPU machine that has them (the `test` extra) and the folder is
carried to the GPU, where tests/gpu/test_runner_woq_checkpoints.py runs each checkpoint through the runner and
compares it with transformers on the dequantized one.

    python scripts/make_woq_tool_checkpoints.py .device_carry/woq_tool_checkpoints
"""
from __future__ import annotations

from itertools import product
from pathlib import Path

import torch
from checkpoint_writers import load_writers, main, write_cases
from safetensors.torch import load_file

FAMILIES = ("qwen3_moe", "mixtral", "deepseek_v3")
FORMATS = ("ct_w4a16_g32", "ct_w4a16_asym_g64", "ct_w8a16", "modelopt_int4_g64", "autoawq_g64")


def write(out: Path) -> list[Path]:
    m = load_writers("test_woq_checkpoints.py", "woq_checkpoint_writers")

    def case(family_name: str, fmt: str, woq: Path) -> dict[str, torch.Tensor]:
        family = m.FAMILIES[family_name]
        m._saved(family, woq)
        original = load_file(woq / m.SINGLE_FILE)
        written = m._rewrite(woq, lambda tensors: m.FORMATS[fmt](family, tensors, woq))
        dense = dict(original)
        for name, exact in written.exact.items():
            w = written.theirs.get(name, exact).double()
            if name in written.pre:
                w = w * written.pre[name].double()
            dense[name] = w.to(torch.bfloat16).contiguous()
        return dense
    return write_cases(out, product(FAMILIES, FORMATS), "woq", m.SINGLE_FILE, case)


if __name__ == "__main__":
    main(write)
