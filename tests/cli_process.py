"""Running moe-build as a user does: the console entry point in a subprocess.

The environment switches that change plans (TensorRT-LLM's and moe-build's
`..._MOE_DISABLE_FINALIZE_FUSION`) are removed from the inherited environment, so a test sees the
default plan unless it sets one itself through `env`.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_moe_build(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
                  timeout: float = 600) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.endswith("DISABLE_FINALIZE_FUSION")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "moe_build", *args], capture_output=True, text=True, cwd=cwd,
                          env=full_env, timeout=timeout)


def assert_one_line_error(r: subprocess.CompletedProcess, field: str) -> None:
    """Exit 2 and stderr exactly one line, the error naming `field`: `moe-build: error: {field}: ...`."""
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"moe-build: error: {field}:"), r.stderr
