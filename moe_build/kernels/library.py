"""Loading `libmoe_build_kernels.so` and calling its entry points.

`load_library()` uses `$MOE_BUILD_KERNELS_LIB` when set (a prebuilt library), else the cached build of
`moe_build.kernels.build` (built on first use where nvcc and the CUTLASS headers are there). Either way
the library is loaded only beside a `build.json` whose sha256 it matches (`build.verify_library`).
Every entry point returns an mb_status; a non-zero one raises `KernelError` carrying `mb_last_error()`'s
message.
"""
from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

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


def call(name: str, *args: object) -> None:
    """Call entry point `name`; a non-zero mb_status raises KernelError with mb_last_error()'s message."""
    status = getattr(load_library(), name)(*args)
    if status != Status.OK:
        raise KernelError(name, status, last_error())
