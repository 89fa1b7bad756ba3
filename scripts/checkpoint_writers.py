"""The checkpoint writers of a test module (tests/test_fp8_checkpoints.py, tests/test_woq_checkpoints.py), loaded as a
library by the scripts that write tool checkpoints for the GPU machines."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_writers(test_file: str, name: str) -> ModuleType:
    """tests/`test_file` imported as module `name` (tests/ on the path: the writers import their siblings)."""
    sys.path.insert(0, str(ROOT / "tests"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / test_file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module
