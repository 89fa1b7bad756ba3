"""The wrappers' argument checks: tensors' shapes, dtypes, devices and layout, enum values, outputs allocated
where not given, and scratch workspaces."""
from __future__ import annotations

import contextlib
import enum
import threading
from typing import Callable, Iterator, Sequence

import torch

from ..abi import DType
from ..library import is_recording


_trust = threading.local()


@contextlib.contextmanager
def trusted_tensors() -> Iterator[None]:
    """Inside this block the wrappers skip their per-tensor checks (`_check`). For a caller whose
    tensors are right by construction and who checks its own inputs once per call: the runner, on
    its own workspace views and weights. Those checks were about a quarter of an eager decode call's
    host time (25 per call). The kernels' own argument checks still run."""
    before = getattr(_trust, "on", False)
    _trust.on = True
    try:
        yield
    finally:
        _trust.on = before


def _dtype_code(t: torch.Tensor, name: str) -> int:
    codes = {torch.float32: DType.FP32, torch.float16: DType.FP16, torch.bfloat16: DType.BF16}
    if t.dtype not in codes:
        raise ValueError(f"{name}: dtype {t.dtype} is not float32, float16 or bfloat16")
    return int(codes[t.dtype])


def _check(t: torch.Tensor | None, name: str, shape: Sequence[int | None] | None = None,
           dtype: torch.dtype | None = None, device: torch.device | None = None) -> None:
    """Raise ValueError naming `name` unless `t` is a contiguous CUDA tensor of that shape/dtype
    (a None in `shape` matches any size) on `device`. Skipped inside `trusted_tensors()`."""
    if getattr(_trust, "on", False):
        return
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_cuda:
        raise ValueError(f"{name}: must be a CUDA tensor, got device {t.device}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: on {t.device}, but the other tensors are on {device}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name}: dtype must be {dtype}, got {t.dtype}")
    if shape is not None:
        ok = t.dim() == len(shape) and all(s is None or s == d for s, d in zip(shape, t.shape))
        if not ok:
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise ValueError(f"{name}: shape must be {want}, got {list(t.shape)}")


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _stream(stream: int | torch.cuda.Stream | None, device: torch.device) -> int:
    if stream is None:
        return torch.cuda.current_stream(device).cuda_stream
    if isinstance(stream, torch.cuda.Stream):
        return stream.cuda_stream
    return int(stream)


def _enum(value: int | str | enum.IntEnum, cls: type[enum.IntEnum], name: str) -> int:
    if isinstance(value, str):
        try:
            return int(cls[value.upper()])
        except KeyError:
            raise ValueError(f"{name}: {value!r} is not one of {', '.join(m.name.lower() for m in cls)}") from None
    try:
        return int(cls(int(value)))
    except ValueError:
        raise ValueError(f"{name}: {value!r} is not one of {', '.join(m.name.lower() for m in cls)}") from None


def _out(t: torch.Tensor | None, name: str, shape: Sequence[int], dtype: torch.dtype,
         device: torch.device, zero: bool = False) -> torch.Tensor:
    if t is None:
        _refuse_recorded_allocation(name)
        return (torch.zeros if zero else torch.empty)(tuple(shape), dtype=dtype, device=device)
    _check(t, name, shape, dtype, device)
    return t


def _workspace(workspace: torch.Tensor | None, nbytes: Callable[[], int], dev: torch.device
               ) -> tuple[int | None, int]:
    """(pointer, bytes) of the caller's scratch, or of a fresh one of `nbytes()` bytes (NULL when none
    is needed; the size query runs only then). The runner passes its preallocated workspace (no
    allocation per call, stable addresses for CUDA graphs); the kernels check the size themselves
    (an sm90 workspace below the split-K size only turns splitting off)."""
    if workspace is None:
        size = nbytes()
        if size == 0:
            return None, 0
        _refuse_recorded_allocation("workspace")
        workspace = torch.empty(size, dtype=torch.uint8, device=dev)
    else:
        _check(workspace, "workspace", None, None, dev)
    return workspace.data_ptr(), workspace.numel() * workspace.element_size()


def _refuse_recorded_allocation(name: str) -> None:
    """A wrapper about to allocate `name` inside `library.recording()`: refused, since a replay of the recorded
    launch would write to the freed allocation's address. The runner passes every output and scratch buffer."""
    if is_recording():
        raise RuntimeError(f"{name}: a recorded launch must be given its buffer (a replay cannot reuse a freed "
                           f"allocation)")
