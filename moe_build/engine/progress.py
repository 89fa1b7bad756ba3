"""Progress of a build, phase by phase: loading weights, exporting ONNX, parsing, building, writing.

Why phases: export and parsing are most of a small build, and TensorRT's own progress monitor
covers only its build step. Each step of the lazily composed loader chain announces its phase
when its work starts (`begin`), which ends the previous phase, so steps that call one another
need no nesting. A terminal gets a rich task list with TensorRT's monitor phases as bars under
the build phase; a pipe or a log gets one line per phase (and per top-level TensorRT phase).
"""
from __future__ import annotations

from typing import IO, Any, Callable

from polygraphy import util
from polygraphy.backend.base import BaseLoader
from rich.console import Console
from rich.markup import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn,
                           TimeElapsedColumn)

from .backend import Backend
from .interrupts import HeldInterrupts

TRT_LINE_DEPTH = 1  # TensorRT phases this deep (0: top level) get a line of their own off a terminal


class BuildProgress:
    """Shows nothing: the display when progress is off, and the interface of the two others."""

    def __enter__(self) -> "BuildProgress":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(failed=exc_type is not None)

    def begin(self, phase: str) -> None:
        """Start `phase`, ending the current one."""

    def close(self, failed: bool = False) -> None:
        """End the current phase (as failed, when the build raised) and the display."""

    def trt_phase_start(self, name: str, parent: str | None, steps: int) -> None:
        """TensorRT started one of its builder phases (nested under `parent`)."""

    def trt_step(self, name: str, step: int) -> None:
        """TensorRT finished step `step` (0-based) of phase `name`."""

    def trt_phase_finish(self, name: str) -> None:
        """TensorRT finished phase `name`."""


class LineProgress(BuildProgress):
    """One line per phase on a stream that is not a terminal (pipes, CI logs)."""

    def __init__(self, label: str, stream: IO[str]):
        self._label, self._stream = label, stream
        self._depth: dict[str, int] = {}

    def _line(self, text: str) -> None:
        print(f"{self._label}: {text}", file=self._stream, flush=True)

    def begin(self, phase: str) -> None:
        self._line(phase)

    def trt_phase_start(self, name: str, parent: str | None, steps: int) -> None:
        depth = self._depth[name] = 0 if parent is None else self._depth.get(parent, 0) + 1
        if depth <= TRT_LINE_DEPTH:
            self._line(f"  {'  ' * depth}TensorRT: {name}")


class RichProgress(BuildProgress):
    """A rich task list on a terminal: our phases with their times, TensorRT's phases as bars."""

    def __init__(self, label: str, console: Console):
        self._label = label
        self._progress = Progress(SpinnerColumn(finished_text="[green]done[/green]"), TextColumn("{task.description}"),
                                  BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console)
        self._phase: tuple[TaskID, str] | None = None  # the current phase's task and text
        self._trt: dict[str, tuple[TaskID, int]] = {}

    def __enter__(self) -> "RichProgress":
        self._progress.start()
        return self

    def _end_phase(self, failed: bool = False) -> None:
        if self._phase is None:
            return
        task, text = self._phase
        if failed:
            self._progress.update(task, description=f"{text} [red](failed)[/red]")
        else:
            self._progress.update(task, total=1, completed=1)
        self._progress.stop_task(task)
        self._phase = None

    def begin(self, phase: str) -> None:
        self._end_phase()
        text = escape(f"{self._label}: {phase}")
        self._phase = (self._progress.add_task(text, total=None), text)

    def close(self, failed: bool = False) -> None:
        self._end_phase(failed)
        self._progress.stop()

    def trt_phase_start(self, name: str, parent: str | None, steps: int) -> None:
        depth = 1 if parent is None or parent not in self._trt else self._trt[parent][1] + 1
        self._trt[name] = (self._progress.add_task(escape(f"{'  ' * depth}{name}"), total=steps), depth)

    def trt_step(self, name: str, step: int) -> None:
        if name in self._trt:
            self._progress.update(self._trt[name][0], completed=step + 1)

    def trt_phase_finish(self, name: str) -> None:
        if name in self._trt:
            self._progress.remove_task(self._trt.pop(name)[0])


def make_build_progress(enabled: bool, label: str) -> BuildProgress:
    """The display for one build on stderr: none, a rich task list on a terminal, else lines."""
    if not enabled:
        return BuildProgress()
    console = Console(stderr=True)
    return RichProgress(label, console) if console.is_terminal else LineProgress(label, console.file)


def make_monitor(backend: Backend, progress: BuildProgress, held: HeldInterrupts) -> Any:
    """An IProgressMonitor of `backend`'s module (the base class is per module, so the subclass is
    made per backend) that reports TensorRT's builder phases to `progress` and cancels the build
    (TensorRT's way: a step that returns False) once a held signal is pending. It is made with the
    display off too: cancelling is what lets Ctrl-C stop a long build before it ends."""
    base = backend.trt.IProgressMonitor

    class PhaseMonitor(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            base.__init__(self)

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            progress.trt_phase_start(phase_name, parent_phase, num_steps)

        def step_complete(self, phase_name: str, step: int) -> bool:
            progress.trt_step(phase_name, step)
            return held.pending is None

        def phase_finish(self, phase_name: str) -> None:
            progress.trt_phase_finish(phase_name)

    return PhaseMonitor()


class BeginPhase(BaseLoader):
    """Passthrough loader (like Polygraphy's LoadPlugins): runs `obj`, then begins `phase`.

    It marks where the next step's work starts when that step is a Polygraphy loader we do not
    own: wrapped around the ONNX path, parsing begins once the export returns; wrapped around the
    config, TensorRT's build begins once the config is made.
    """

    def __init__(self, progress: BuildProgress, phase: str, obj: Callable[..., Any] | Any):
        self._progress, self._phase, self._obj = progress, phase, obj

    def call_impl(self, *args: Any, **kwargs: Any) -> Any:
        ret, _ = util.invoke_if_callable(self._obj, *args, **kwargs)
        self._progress.begin(self._phase)
        return ret
