"""Loading `libmoe_build_kernels.so` and calling its entry points.

`load_library()` uses `$MOE_BUILD_KERNELS_LIB` when set (a prebuilt library), else the cached build of
`moe_build.kernels.build` (built on first use where nvcc and the CUTLASS headers are there). Either way
the library is loaded only beside a `build.json` whose sha256 it matches (`build.verify_library`).
Every entry point returns an mb_status; a non-zero one raises `KernelError` carrying `mb_last_error()`'s
message. `recording()` keeps the launches a block makes (entry point and arguments) so that a caller whose next
call takes the same arguments can `replay` them without running the torch wrappers again.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from pathlib import Path
from typing import Callable, Iterator, NamedTuple, Sequence

from .abi import SIGNATURES, Status
from .build import KernelBuildError, build, verify_library


class KernelError(Exception):
    """A kernel entry point returned a non-zero mb_status; `status` says which kind."""

    def __init__(self, function: str, status: int, message: str):
        self.function = function
        self.status = Status(status) if status in Status._value2member_map_ else status
        name = self.status.name if isinstance(self.status, Status) else str(status)
        super().__init__(f"{function} failed ({name}): {message}")


_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()


def _prebuilt(path: str | os.PathLike[str], source: str) -> Path:
    """`path` once verified against the build.json beside it, else a one-line KernelBuildError."""
    try:
        verify_library(Path(path))
    except KernelBuildError as e:
        raise KernelBuildError(f"{source}: {e}; build it with `moe-build kernels --out DIR` (it writes "
                               f"build.json beside the library)") from None
    return Path(path)


def load_library(path: str | os.PathLike[str] | None = None) -> ctypes.CDLL:
    """The kernel library with every ABI function's argtypes/restype set. Order of choice: `path`,
    `$MOE_BUILD_KERNELS_LIB`, else the cached build (compiled first if there is none). A library is
    loaded only where its sha256 matches its build.json (KernelBuildError otherwise). The first library
    loaded is kept for the process; asking for a different path afterwards is an error."""
    global _lib
    with _lib_lock:
        if path is None and _lib is not None:
            return _lib
        if path is not None:
            lib_path = _prebuilt(path, f"kernel library {path}")
        elif os.environ.get("MOE_BUILD_KERNELS_LIB"):
            env = os.environ["MOE_BUILD_KERNELS_LIB"]
            lib_path = _prebuilt(env, f"$MOE_BUILD_KERNELS_LIB={env}")
        else:
            lib_path = build().library
        resolved = str(lib_path.resolve())
        if _lib is not None:
            if _lib._name != resolved:  # type: ignore[attr-defined]
                raise RuntimeError(f"kernel library already loaded from {_lib._name}, not {resolved}")
            return _lib
        lib = ctypes.CDLL(resolved)
        missing = [name for name in SIGNATURES if not hasattr(lib, name)]
        if missing:
            raise RuntimeError(f"{resolved} lacks ABI functions: {', '.join(missing)}")
        for name, (restype, argtypes) in SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = list(argtypes)
        _lib = lib
        return lib


def last_error() -> str:
    msg = load_library().mb_last_error()
    return msg.decode(errors="replace") if msg else ""


class Launch(NamedTuple):
    """One entry point call as `recording` kept it: its name, the loaded function and its arguments."""

    name: str
    function: Callable[..., int]
    args: tuple[object, ...]


_recorder = threading.local()


@contextlib.contextmanager
def recording() -> Iterator[list[Launch]]:
    """Every `call` made inside the block runs as always and is also appended to the list this yields, in
    order. Why: an eager decode step spends most of its host time in the wrappers' checks and pointer reads
    (docs/performance.md, "Host time per call"); a caller whose tensors and arguments are the same on the next
    call (the runner, keyed by every address it passes) replays the list instead. The wrappers refuse to
    allocate inside the block (`is_recording`): a replay would pass the freed buffer's address."""
    if is_recording():
        raise RuntimeError("kernel launches are already being recorded on this thread")
    launches: list[Launch] = []
    _recorder.launches = launches
    try:
        yield launches
    finally:
        _recorder.launches = None


def is_recording() -> bool:
    """Whether this thread is inside `recording()`."""
    return getattr(_recorder, "launches", None) is not None


def replay(launches: Sequence[Launch]) -> None:
    """Call each recorded launch again with its arguments, in order; a non-zero mb_status raises KernelError as
    `call` does."""
    for name, function, args in launches:
        status = function(*args)
        if status != Status.OK:
            raise KernelError(name, status, last_error())


def call(name: str, *args: object) -> None:
    """Call entry point `name`; a non-zero mb_status raises KernelError with mb_last_error()'s message."""
    function = getattr(_lib if _lib is not None else load_library(), name)
    status = function(*args)
    if status != Status.OK:
        raise KernelError(name, status, last_error())
    launches = getattr(_recorder, "launches", None)
    if launches is not None:
        launches.append(Launch(name, function, args))
