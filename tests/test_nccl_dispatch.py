"""The nccl dispatch borrows the NCCL communicator of torch.distributed's process group: a group without one is
refused in one line naming the dispatch, before any exchange (CPU: a one-rank gloo group)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from moe_build.errors import MoeBuildError
from moe_build.runner.dispatch.kept import KeptGraphs
from moe_build.runner.dispatch.nccl import communicator


@pytest.fixture
def gloo_group(tmp_path):  # noqa: ANN001, ANN201
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_a_group_without_nccl_is_refused_naming_the_dispatch(gloo_group: dist.ProcessGroup) -> None:
    with pytest.raises(MoeBuildError) as e:
        communicator(gloo_group, torch.device("cuda", 0))
    msg = str(e.value)
    assert msg.startswith("dispatch:") and "NCCL backend" in msg and "init_process_group('nccl')" in msg
    assert "\n" not in msg


class _Graph:
    """A captured call's stand-in (capturing needs a GPU): replay logs its name."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def replay(self) -> None:
        self.log.append(self.name)


def _kept(budget: int, calls: int, log: list[str]) -> KeptGraphs:
    kept = KeptGraphs(budget, calls)
    kept._capture = lambda launches: _Graph(launches(), log)  # type: ignore[method-assign]  # launches: a name
    return kept


def test_a_kept_call_replays_its_graph_and_returns_its_result() -> None:
    log: list[str] = []
    kept = _kept(100, 8, log)
    assert kept.replay("a") is None and log == []
    result = object()
    kept.keep("a", lambda: "graph a", result, 10)
    assert kept.replay("a") is result and log == ["graph a"]
    assert kept.replay("b") is None and log == ["graph a"]


def test_kept_calls_drop_the_least_recent_past_the_budget_or_the_count() -> None:
    log: list[str] = []
    kept = _kept(100, 3, log)
    for key in "abc":
        kept.keep(key, lambda key=key: key, key, 40)  # c pushes a out: 120 > 100 bytes
    assert kept.replay("a") is None and kept.replay("b") == "b"
    kept.keep("d", lambda: "d", "d", 40)  # b was used after c: c goes
    assert kept.replay("c") is None and kept.replay("b") == "b" and kept.replay("d") == "d"
    kept.keep("huge", lambda: "huge", "huge", 101)  # past the budget alone: never kept, nothing dropped for it
    assert kept.replay("huge") is None and kept.replay("b") == "b" and kept.replay("d") == "d"
    for key in "xy":  # no bytes, but at most 3 calls: y pushes b out
        kept.keep(key, lambda key=key: key, key, 0)
    assert kept.replay("b") is None and len(kept) == 3 and [kept.replay(k) for k in "dxy"] == ["d", "x", "y"]
