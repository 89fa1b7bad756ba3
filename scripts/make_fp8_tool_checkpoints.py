"""Tiny FP8 checkpoints written by a real producer tool, each beside the same checkpoint dequantized by that tool.

compressed-tensors (vLLM's format, what llm-compressor writes) quantizes and compresses the experts of tiny
random Qwen3-MoE, Mixtral and DeepSeek-V3 models (tests/test_fp8_checkpoints.py's writers, which call the
tool's own quantizer and compressor), and decompresses them again with its own decompressor. For each
(family, preset) OUT/<family>-<preset>/ holds:
  fp8/          the FP8 checkpoint as the tool wrote it (config.json with its quantization_config);
  dequantized/  the same checkpoint with every FP8 matrix replaced by the tool's bf16 decompression and no
                quantization_config: a plain checkpoint transformers loads.
The GPU machines have no compressed-tensors, so this runs on a CPU machine that has it (the `test` extra) and
the folder is carried to the GPU, where tests/gpu/test_runner_fp8_checkpoints.py runs the FP8 checkpoint
through the runner and compares it with transformers on the dequantized one.

    python scripts/make_fp8_tool_checkpoints.py .device_carry/fp8_tool_checkpoints
"""
from __future__ import annotations

from itertools import product
from pathlib import Path

import torch
from checkpoint_writers import load_writers, main, write_cases
from safetensors.torch import load_file

FAMILIES = ("qwen3_moe", "mixtral", "deepseek_v3")
PRESETS = ("ct_fp8", "ct_fp8_dynamic", "ct_fp8_block")  # static per-tensor, dynamic per-channel, block-128
SCALE_SUFFIXES = (".weight_scale", ".input_scale")


def write(out: Path) -> list[Path]:
    m = load_writers("test_fp8_checkpoints.py", "fp8_checkpoint_writers")

    def case(family_name: str, preset: str, fp8: Path) -> dict[str, torch.Tensor]:
        family = m.FAMILIES[family_name]
        _, written = m._fp8_checkpoint(family, preset, fp8)
        tensors = load_file(fp8 / m.SINGLE_FILE)
        dequantized = {name: t for name, t in tensors.items() if not name.endswith(SCALE_SUFFIXES)}
        for name in family.matrices():
            dequantized[name] = written.dequantize(name).to(torch.bfloat16).contiguous()
        return dequantized
    return write_cases(out, product(FAMILIES, PRESETS), "fp8", m.SINGLE_FILE, case)


if __name__ == "__main__":
    main(write)
