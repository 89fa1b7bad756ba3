"""Test-session reporting: one line that says how many tests were skipped and why.

Why: most of the suite is GPU tests (tests/gpu), which skip on machines without a CUDA GPU (CI, the
developer machines); `-q` output would otherwise show only a row of s's.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import pytest


def _reason(report: Any) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons = Counter(_reason(r) for r in skipped)
    parts = "; ".join(f"{n} {why}" for why, n in reasons.most_common())
    terminalreporter.write_line(f"skipped {len(skipped)}: {parts}")


@pytest.fixture(scope="session")
def kernel_library() -> Any:
    """The CUDA kernel library (no GPU needed to load it), for CPU tests whose answer comes from it, such as the
    runner's workspace size, which asks the library for its scratch. Where none is built and nvcc or the CUTLASS
    headers are missing to build one, the test skips and says so; any other build failure fails the test."""
    from moe_build.kernels import build as kernel_build
    from moe_build.kernels.library import load_library
    try:
        return load_library()
    except kernel_build.KernelBuildError:
        try:
            kernel_build.find_nvcc()
            kernel_build.cutlass_include_dir()
        except kernel_build.KernelBuildError:
            pytest.skip("needs the kernel library: none is built, and nvcc or the nvidia-cutlass headers are missing")
        raise
