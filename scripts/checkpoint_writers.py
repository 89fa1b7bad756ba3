"""What both tool-checkpoint scripts share: the checkpoint writers of a test module (tests/test_fp8_checkpoints.py,
tests/test_woq_checkpoints.py) loaded as a library, and the OUT/<family>-<case>/{quantized, dequantized} folders they
write for the GPU machines."""
from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterable

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]


def load_writers(test_file: str, name: str) -> ModuleType:
    """tests/`test_file` imported as module `name` (tests/ on the path: the writers import their siblings)."""
    sys.path.insert(0, str(ROOT / "tests"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / test_file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def write_cases(out: Path, cases: Iterable[tuple[str, str]], quantized: str, single_file: str,
                write_case: Callable[[str, str, Path], dict[str, torch.Tensor]]) -> list[Path]:
    """For each (family, case), OUT/<family>-<case>/ made afresh: `write_case(family, case, folder)` writes the
    quantized checkpoint into `folder` (OUT/<family>-<case>/<quantized>) and returns the whole model dequantized,
    which goes to OUT/<family>-<case>/dequantized/<single_file> beside the quantized config without its
    quantization_config (a plain checkpoint transformers loads). Returns the case folders."""
    made = []
    for family, case in cases:
        folder = out / f"{family}-{case}"
        shutil.rmtree(folder, ignore_errors=True)
        written, plain = folder / quantized, folder / "dequantized"
        written.mkdir(parents=True)
        dense = write_case(family, case, written)
        plain.mkdir()
        save_file(dense, plain / single_file, metadata={"format": "pt"})
        config = json.loads((written / "config.json").read_text())
        config.pop("quantization_config", None)
        (plain / "config.json").write_text(json.dumps(config, indent=1))
        made.append(folder)
    return made


def main(write: Callable[[Path], list[Path]]) -> None:
    """The scripts' command line: one argument, OUT_DIR; prints each case folder written."""
    if len(sys.argv) != 2:
        sys.exit(f"usage: python {Path(sys.argv[0]).name} OUT_DIR")
    for case in write(Path(sys.argv[1])):
        print(case)
