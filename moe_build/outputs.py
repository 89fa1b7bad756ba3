"""The output folder's housekeeping, shared by everything that writes there (engines, manifests,
exported graphs): refusing a folder that cannot be written before any work starts, temporary names
that carry their creator, sweeping the ones a killed run left, scratch folders, fsync.

Why temporary names carry the creating process's PID and start time (`.moe-build-tmp-<pid>-<start>-...`):
a kill -9 runs no cleanup, and a later run must tell such leftovers from the files of a run still
going in the same folder, whose PID may even be a reused one.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from .errors import MoeBuildError

TEMP_PREFIX = ".moe-build-tmp-"
_TEMP_NAME = re.compile(rf"^{re.escape(TEMP_PREFIX)}(\d+)-(\d+)-")


def process_start(pid: int) -> int | None:
    """Start time of process `pid` in clock ticks since boot (Linux /proc), None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22; the name before ')' may hold spaces


def temp_prefix() -> str:
    """Prefix of this process's temporary names: its PID and start time, so a sweep can tell a
    live creator from a dead one whose PID was reused."""
    return f"{TEMP_PREFIX}{os.getpid()}-{process_start(os.getpid()) or 0}-"


def _creator_alive(pid: int, start: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by another user
    now = process_start(pid)
    return start == 0 or now is None or now == start


def sweep_stale_temps(folder: Path) -> list[Path]:
    """Remove the temporary files and folders in `folder` whose creating process is gone."""
    removed = []
    for path in folder.glob(f"{TEMP_PREFIX}*"):
        match = _TEMP_NAME.match(path.name)
        if match is None or _creator_alive(int(match[1]), int(match[2])):
            continue
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        removed.append(path)
    return removed


@contextlib.contextmanager
def scratch_folder(folder: Path, suffix: str) -> Iterator[Path]:
    """A temporary folder in `folder` (same disk as the outputs: an ONNX export can be GBs),
    named for the sweep, removed when the body ends however it ends."""
    path = Path(tempfile.mkdtemp(dir=folder, prefix=temp_prefix(), suffix=suffix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def fsync_path(path: Path) -> None:
    """Flush a file, or a folder's entries (a rename is durable once its folder is fsynced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_writable_folder(field: str, folder: Path) -> None:
    """Refuse a folder that is a file, or that cannot be written (or created) by this user.
    Nothing is created: a refused build leaves the file system as it was."""
    existing = folder
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise MoeBuildError(field, f"cannot create {folder}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable" if existing == folder else f"cannot be created ({existing} is not writable)"
        raise MoeBuildError(field, f"{folder} {what}")


def make_folder(field: str, folder: Path) -> None:
    """Create `folder` (and its parents) or refuse in one line naming `field`."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MoeBuildError(field, f"cannot create {folder}: {exc.strerror or exc}") from None
