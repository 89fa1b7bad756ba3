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

import json
import shutil
import sys
from pathlib import Path

import torch
from checkpoint_writers import load_writers
from safetensors.torch import load_file, save_file

FAMILIES = ("qwen3_moe", "mixtral", "deepseek_v3")
PRESETS = ("ct_fp8", "ct_fp8_dynamic", "ct_fp8_block")  # static per-tensor, dynamic per-channel, block-128
SCALE_SUFFIXES = (".weight_scale", ".input_scale")


def write(out: Path) -> list[Path]:
    m = load_writers("test_fp8_checkpoints.py", "fp8_checkpoint_writers")
    made = []
    for family_name in FAMILIES:
        family = m.FAMILIES[family_name]
        for preset in PRESETS:
            case = out / f"{family_name}-{preset}"
            shutil.rmtree(case, ignore_errors=True)
            fp8, plain = case / "fp8", case / "dequantized"
            fp8.mkdir(parents=True)
            _, written = m._fp8_checkpoint(family, preset, fp8)
            tensors = load_file(fp8 / m.SINGLE_FILE)
            dequantized = {name: t for name, t in tensors.items() if not name.endswith(SCALE_SUFFIXES)}
            for name in family.matrices():
                dequantized[name] = written.dequantize(name).to(torch.bfloat16).contiguous()
            plain.mkdir()
            save_file(dequantized, plain / m.SINGLE_FILE, metadata={"format": "pt"})
            config = json.loads((fp8 / "config.json").read_text())
            config.pop("quantization_config")
            (plain / "config.json").write_text(json.dumps(config, indent=1))
            made.append(case)
    return made


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: python {Path(__file__).name} OUT_DIR")
    for case in write(Path(sys.argv[1])):
        print(case)
