"""Ctrl-C and SIGTERM while TensorRT works: held until TensorRT returns, then raised where Python is.

Why: TensorRT calls back into Python while it parses and builds (the progress monitor, Polygraphy's
logger). A signal's Python handler raises in whichever of those callbacks runs next; the binding
swallows the exception and TensorRT fails the build ("Invalid Engine"), which reads as a builder
failure (exit 2) instead of an interrupt (130, 143). So while TensorRT works the two signals are
only noted: the progress monitor cancels the build at TensorRT's next step (TensorRT's own way to
stop), and once TensorRT has returned the signal is raised again under the handlers it had before,
which unwind the build like any Ctrl-C: every cleanup runs and nothing half-written is left.
"""
from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any, Callable

from polygraphy import util
from polygraphy.backend.base import BaseLoader

HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class HeldInterrupts:
    """The signals held during one build: `hold` from where TensorRT starts, `release` once it returned."""

    def __init__(self) -> None:
        self.pending: int | None = None  # the first signal that arrived while held
        self._saved: dict[int, Any] = {}

    def hold(self) -> None:
        """Note SIGINT and SIGTERM instead of raising them (again: no-op). Handlers can be replaced only
        on the main thread and only where Python installed them, and an ignored signal (SIGINT in a job a
        non-interactive shell started in the background) stays ignored: it must not cancel the build."""
        if self._saved or threading.current_thread() is not threading.main_thread():
            return
        for sig in HELD_SIGNALS:
            handler = signal.getsignal(sig)
            if handler is not None and handler is not signal.SIG_IGN:
                self._saved[sig] = handler
                signal.signal(sig, self._note)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.pending is None:
            self.pending = signum

    def release(self) -> None:
        """Put the handlers back and raise the signal that arrived meanwhile (its handler runs now)."""
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved.clear()
        if self.pending is not None:
            pending, self.pending = self.pending, None
            signal.raise_signal(pending)


class HoldInterrupts(BaseLoader):
    """Passthrough loader (like BeginPhase): runs `obj`, then holds the signals; the step after it is TensorRT's."""

    def __init__(self, held: HeldInterrupts, obj: Callable[..., Any] | Any):
        self._held, self._obj = held, obj

    def call_impl(self, *args: Any, **kwargs: Any) -> Any:
        ret, _ = util.invoke_if_callable(self._obj, *args, **kwargs)
        self._held.hold()
        return ret


class ReleaseInterrupts(BaseLoader):
    """Runs `obj` (the loader that ends in TensorRT's build), then releases the signals, also when it raised:
    a build that TensorRT cancelled raises the interrupt rather than the cancelled build's error."""

    def __init__(self, held: HeldInterrupts, obj: Callable[..., Any] | Any):
        self._held, self._obj = held, obj

    def call_impl(self, *args: Any, **kwargs: Any) -> Any:
        try:
            ret, _ = util.invoke_if_callable(self._obj, *args, **kwargs)
        finally:
            self._held.release()
        return ret
