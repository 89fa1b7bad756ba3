"""A TensorRT progress monitor that drives a rich progress display.

Why a factory: the base class (`IProgressMonitor`) lives in whichever TensorRT module the
backend loaded, so the subclass is made per backend rather than at import time.
"""
from __future__ import annotations

from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from .backend import Backend


def make_progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    transient=True)


def make_monitor(backend: Backend, progress: Progress) -> Any:
    """An IProgressMonitor of `backend` that shows each builder phase as one rich task."""
    base = backend.trt.IProgressMonitor

    class RichProgressMonitor(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            base.__init__(self)
            self.tasks: dict[str, TaskID] = {}
            self.phases_seen: list[str] = []

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            indent = "  " if parent_phase else ""
            self.tasks[phase_name] = progress.add_task(f"{indent}{phase_name}", total=num_steps)
            self.phases_seen.append(phase_name)

        def step_complete(self, phase_name: str, step: int) -> bool:
            task = self.tasks.get(phase_name)
            if task is not None:
                progress.update(task, completed=step + 1)
            return True

        def phase_finish(self, phase_name: str) -> None:
            task = self.tasks.pop(phase_name, None)
            if task is not None:
                progress.remove_task(task)

    return RichProgressMonitor()
