"""A runner call's kernel launches, kept per call key and replayed on the next call with the same key.

Why: an eager decode step spent 5-7x its GPU time on the host, most of it in the torch wrappers' argument
work (docs/performance.md, "Host time per call"). Every launch argument of a call is fixed by what the key
holds: the token count and routing input (the steps and tactics), the stream, the workspace's address and
layout, and the addresses of the caller's tensors (hidden, out, router logits, and the logits' dtype); the
weights are the runner's own. So the first call with a key runs its steps through the wrappers under
`kernels.recording()`, and later calls with that key call the recorded entry points directly. The steps that
run torch operators (`sequence.TORCH_STEPS`) are not launches of ours: they run as steps on every call.

A program holds integers, the loaded entry points and tactic structs, never a tensor, so keeping one keeps no
memory alive; a key whose buffers were freed is only never hit again (an address reused by another buffer
of the same call shape is the same launch).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Hashable, Mapping, Sequence, Union

from .. import kernels
from . import sequence as S
from .batch import Batch

CACHED_PROGRAMS = 64  # call keys whose launches a runner keeps (a decode loop reuses a few buffers)

# One item of a program: a torch step's name, run as a step on every call, or a run of recorded launches.
Item = Union[str, tuple[kernels.Launch, ...]]


class LaunchPrograms:
    """The recorded launches of the last CACHED_PROGRAMS call keys of one runner, over its step table."""

    def __init__(self, steps: Mapping[str, Callable[[Batch], None]]) -> None:
        self._steps = steps
        self._programs: OrderedDict[Hashable, tuple[Item, ...]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._programs)

    def run(self, key: Hashable, steps: Sequence[str], b: Batch) -> None:
        """`steps` on `b`: replayed where `key` has a program, else run through the wrappers and recorded."""
        program = self._programs.get(key)
        if program is None:
            self._programs[key] = self._record(steps, b)
            if len(self._programs) > CACHED_PROGRAMS:
                self._programs.popitem(last=False)
            return
        self._programs.move_to_end(key)
        for item in program:
            if isinstance(item, str):
                self._steps[item](b)
            else:
                kernels.replay(item)

    def _record(self, steps: Sequence[str], b: Batch) -> tuple[Item, ...]:
        """Run `steps` on `b`, recording the launches of every step but the torch ones (consecutive ones as one
        run). A step that raises leaves no program."""
        items: list[Item] = []
        for step in steps:
            if step in S.TORCH_STEPS:
                self._steps[step](b)
                items.append(step)
                continue
            with kernels.recording() as launches:
                self._steps[step](b)
            if items and not isinstance(items[-1], str):
                items[-1] = items[-1] + tuple(launches)
            else:
                items.append(tuple(launches))
        return tuple(items)
