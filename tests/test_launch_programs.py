"""Recorded kernel launches and their replay (kernels.library.recording / replay, runner.programs), on a stand-in
library: what a replay calls, what it skips, and what it refuses. The replay on the GPU against the fp64
reference is tests/gpu/test_runner.py's test_replayed_calls_follow_each_calls_inputs."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from moe_build import kernels
from moe_build.kernels import library
from moe_build.runner import programs, sequence
from moe_build.runner.batch import Batch


class FakeLibrary:
    """Entry points that log their arguments and return the status set for them (0: MB_OK)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, tuple[object, ...]]] = []
        self.status = {"mb_a": 0, "mb_b": 0}

    def __getattr__(self, name: str):  # noqa: ANN204
        if name == "mb_last_error":
            return lambda: b"the stand-in failed"
        if name not in self.status:
            raise AttributeError(name)

        def entry(*args: object) -> int:
            self.log.append((name, args))
            return self.status[name]
        return entry


@pytest.fixture
def lib(monkeypatch: pytest.MonkeyPatch) -> FakeLibrary:
    fake = FakeLibrary()
    monkeypatch.setattr(library, "_lib", fake)
    return fake


def test_a_recording_keeps_each_call_in_order_and_a_replay_calls_them_again(lib: FakeLibrary) -> None:
    with library.recording() as launches:
        library.call("mb_a", 1, 2.5)
        library.call("mb_b", 3)
    assert lib.log == [("mb_a", (1, 2.5)), ("mb_b", (3,))]  # recorded calls run as always
    assert [(x.name, x.args) for x in launches] == [("mb_a", (1, 2.5)), ("mb_b", (3,))]
    library.call("mb_a", 9)  # outside the block: not recorded
    assert len(launches) == 2
    library.replay(launches)
    assert lib.log[-2:] == [("mb_a", (1, 2.5)), ("mb_b", (3,))]


def test_a_failing_replayed_launch_raises_naming_its_entry_point(lib: FakeLibrary) -> None:
    with library.recording() as launches:
        library.call("mb_b", 1)
    lib.status["mb_b"] = 2
    with pytest.raises(library.KernelError, match="mb_b failed .*the stand-in failed"):
        library.replay(launches)


def test_a_failing_call_is_not_recorded_and_recordings_do_not_nest(lib: FakeLibrary) -> None:
    lib.status["mb_a"] = 2
    with library.recording() as launches:
        with pytest.raises(library.KernelError):
            library.call("mb_a", 1)
        with pytest.raises(RuntimeError, match="already being recorded"):
            with library.recording():
                pass
    assert launches == [] and not library.is_recording()


def test_the_wrappers_refuse_to_allocate_while_recording() -> None:
    """A recorded launch into a buffer the wrapper allocated would be replayed into freed memory."""
    cpu = torch.device("cpu")
    with library.recording():
        with pytest.raises(RuntimeError, match="out: a recorded launch must be given its buffer"):
            kernels.ops.args._out(None, "out", (2, 3), torch.float32, cpu)
        with pytest.raises(RuntimeError, match="workspace: a recorded launch"):
            kernels.ops.args._workspace(None, lambda: 64, cpu)
        assert kernels.ops.args._workspace(None, lambda: 0, cpu) == (None, 0)  # nothing to allocate: fine
    assert kernels.ops.args._out(None, "out", (2, 3), torch.float32, cpu).shape == (2, 3)


def _batch() -> Batch:
    return Batch(1, torch.zeros(1, 4), torch.zeros(1, 4), {}, 0, None, None)


def _step_table(lib: FakeLibrary, ran: list[str]) -> dict[str, object]:
    """Two launching steps (the wrapper's Python logged in `ran`) around a torch step."""
    def launching(name: str, entry: str):  # noqa: ANN202
        def step(b: Batch) -> None:
            ran.append(name)
            library.call(entry, name)
        return step

    def torch_step(b: Batch) -> None:
        ran.append(sequence.ROUTER_GEMM)
    return {"first": launching("first", "mb_a"), sequence.ROUTER_GEMM: torch_step, "second": launching("second", "mb_b"),
            "third": launching("third", "mb_a")}


def test_a_program_replays_its_launches_and_runs_its_torch_steps_every_call(lib: FakeLibrary) -> None:
    ran: list[str] = []
    progs = programs.LaunchPrograms(_step_table(lib, ran))
    steps = ["first", sequence.ROUTER_GEMM, "second", "third"]
    progs.run("key", steps, _batch())
    assert ran == steps and [e for e, _ in lib.log] == ["mb_a", "mb_b", "mb_a"]
    ran.clear()
    lib.log.clear()
    progs.run("key", steps, _batch())
    assert ran == [sequence.ROUTER_GEMM]  # the wrappers' Python is skipped, the torch step runs
    assert lib.log == [("mb_a", ("first",)), ("mb_b", ("second",)), ("mb_a", ("third",))]
    progs.run("other key", steps, _batch())
    assert ran[1:] == steps and len(progs) == 2


def test_a_step_that_raises_leaves_no_program(lib: FakeLibrary) -> None:
    ran: list[str] = []
    table = _step_table(lib, ran)
    progs = programs.LaunchPrograms(table)
    lib.status["mb_b"] = 2
    with pytest.raises(library.KernelError):
        progs.run("key", ["first", "second"], _batch())
    assert len(progs) == 0
    lib.status["mb_b"] = 0
    ran.clear()
    progs.run("key", ["first", "second"], _batch())
    assert ran == ["first", "second"]  # recorded anew, not replayed from the failed call


def test_the_least_recently_used_program_goes_first(lib: FakeLibrary) -> None:
    ran: list[str] = []
    progs = programs.LaunchPrograms(_step_table(lib, ran))
    for key in range(programs.CACHED_PROGRAMS):
        progs.run(key, ["first"], _batch())
    progs.run(0, ["first"], _batch())  # key 0 used again: key 1 is now the oldest
    progs.run("new", ["first"], _batch())
    assert len(progs) == programs.CACHED_PROGRAMS
    ran.clear()
    progs.run(0, ["first"], _batch())
    assert ran == []  # kept
    progs.run(1, ["first"], _batch())
    assert ran == ["first"]  # dropped, so recorded again


def _torch_methods(module) -> dict[str, set[str]]:  # noqa: ANN001
    """Per class of `module`, the methods that run a torch operator (a `torch.*` call or an in-place tensor method,
    `x.zero_()`), directly or through another method of the class."""
    import ast
    import inspect
    tree = ast.parse(inspect.getsource(module))
    found: dict[str, set[str]] = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        direct, calls = set(), {}
        for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
            calls[fn.name] = set()
            for node in ast.walk(fn):
                if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                    continue
                f = node.func
                if isinstance(f.value, ast.Name) and f.value.id == "torch" or f.attr.endswith("_") \
                        and not f.attr.startswith("_"):
                    direct.add(fn.name)
                if isinstance(f.value, ast.Name) and f.value.id == "self":
                    calls[fn.name].add(f.attr)
        reach = set(direct)
        while True:
            more = {m for m, called in calls.items() if called & reach} - reach
            if not more:
                break
            reach |= more
        found[cls.name] = reach
    return found


def test_the_torch_steps_are_exactly_the_steps_that_run_torch_operators() -> None:
    """A step of the runner's table that ran a torch operator but was missing from TORCH_STEPS would be replayed
    without it; one listed there that only launches would lose nothing but the replay. The table's steps are
    read off MoERunner._step_table, the methods' torch operators off their source."""
    from moe_build.runner import experts, prepare_finalize
    from moe_build.runner.runner import MoERunner

    class Names:
        def __init__(self, cls: str) -> None:
            self.cls = cls

        def __getattr__(self, name: str) -> tuple[str, str]:
            return self.cls, name
    table = MoERunner._step_table(SimpleNamespace(prepare_finalize=Names("PrepareFinalize"),  # type: ignore[arg-type]
                                                  experts=Names("FusedExperts")))
    torch_methods = {**_torch_methods(prepare_finalize), **_torch_methods(experts)}
    assert torch_methods["PrepareFinalize"] == {"router_gemm", "shared_experts"}  # the scan sees them
    running_torch = {step for step, (cls, method) in table.items() if method in torch_methods[cls]}
    assert running_torch == sequence.TORCH_STEPS
