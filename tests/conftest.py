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
