"""Test-session hooks: which GPU cases run (every pair of parameter values, or all), shards of a run for processes
side by side (each taking its share of the CPU's threads), and one line that says how many tests were skipped and why.

Why the line: most of the suite is GPU tests (tests/gpu), which skip on machines without a CUDA GPU (CI, the
developer machines); `-q` output would otherwise show only a row of s's.
"""
from __future__ import annotations

import os
from collections import Counter, defaultdict
from typing import Any

import pytest

from pairwise_cases import pairwise_subset

GPU_CASES_KEPT = pytest.StashKey[tuple[int, int]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--gpu-cases", choices=("pairs", "all"), default="pairs",
                     help="parametrized GPU tests: 'pairs' (default) runs the cases that hold every pair of parameter "
                          "values (tests/pairwise_cases.py), 'all' every combination")
    parser.addoption("--shard", default="0/1", metavar="I/N", type=_shard,
                     help="run every N-th selected test from the I-th (0 <= I < N), for N pytest processes side by "
                          "side (scripts/device_run.sh's tests_split)")


def _shard(text: str) -> tuple[int, int]:
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise pytest.UsageError(f"--shard: {text!r} is not I/N with 0 <= I < N, e.g. 0/4")
    return int(index), int(count)


def pytest_configure(config: pytest.Config) -> None:
    """A shard of N is one of N processes side by side: without OMP_NUM_THREADS each would run its fp64 references
    on every core, and eight such processes on 16 cores ran them many times slower (tests past 80 s that take 1)."""
    _, count = config.getoption("--shard")
    if count > 1 and "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // count))


def _chosen_by_id(config: pytest.Config) -> set[str]:
    """Parametrized cases named on the command line (`file::test[id]`): always run, whatever --gpu-cases says."""
    return {arg.replace("\\", "/").split("::", 1)[1] for arg in config.args if "::" in arg and "[" in arg}


@pytest.hookimpl(trylast=True)  # after -k / -m have deselected: the pairs are those of the cases left
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--gpu-cases") == "pairs":
        _keep_pairs(config, items)
    index, count = config.getoption("--shard")
    if count > 1:
        config.hook.pytest_deselected(items=[item for i, item in enumerate(items) if i % count != index])
        items[:] = items[index::count]


def _keep_pairs(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the parametrized GPU cases past those that hold every pair of their test's parameter values."""
    named = _chosen_by_id(config)
    groups: dict[tuple[str, tuple[str, ...]], list[Any]] = defaultdict(list)
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and item.get_closest_marker("gpu") and item.nodeid.split("::", 1)[1] not in named:
            groups[(item.nodeid.split("[", 1)[0], tuple(sorted(callspec.params)))].append(item)
    dropped: set[int] = set()
    for (_, names), cases in groups.items():
        values = [tuple(repr(case.callspec.params[name]) for name in names) for case in cases]
        kept = set(pairwise_subset(values))
        dropped.update(id(case) for i, case in enumerate(cases) if i not in kept)
    if not dropped:
        return
    config.hook.pytest_deselected(items=[item for item in items if id(item) in dropped])
    config.stash[GPU_CASES_KEPT] = (sum(len(cases) for cases in groups.values()) - len(dropped), len(dropped))
    items[:] = [item for item in items if id(item) not in dropped]


def _reason(report: Any) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if GPU_CASES_KEPT in config.stash:
        kept, dropped = config.stash[GPU_CASES_KEPT]
        terminalreporter.write_line(f"GPU cases: {kept} of {kept + dropped} parametrized ones, every pair of parameter "
                                    f"values; --gpu-cases=all runs the other {dropped}")
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
