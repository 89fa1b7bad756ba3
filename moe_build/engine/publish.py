"""Publishing an engine and its manifest as one unit.

The pair has fixed names (`<name>.engine`, `<name>.json`) and POSIX cannot rename two files at
once, so the manifest is the commit record:
1. both files are written and fsynced under temporary names in the output folder;
2. an existing `<name>.json` is removed: from here the old pair is withdrawn;
3. the engine is renamed into place, then the manifest (the commit point), then the folder is fsynced.
Readers require the manifest and check the engine's sha256 against it (manifest.verify, which
re-reads when the manifest changed under it), so a reader sees the old pair, no pair, or the
new pair, never a manifest describing another engine. Any failure or interrupt before the
commit removes the temporary files and a renamed engine: the folder keeps neither file.
A kill -9 cannot run that cleanup; the temporary names carry their creator (moe_build/outputs.py)
and a later build sweeps those whose process is gone. A kill -9 between steps 2 and 3 leaves an
engine without a manifest, which readers refuse and the next build replaces.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path

from ..outputs import fsync_path, temp_prefix


def _write_temp(folder: Path, final_name: str, data: bytes) -> Path:
    """`data` in a new temporary file named for `final_name`, flushed to disk. Created with mode
    0666 less the umask, the mode the final file should have."""
    path = folder / f"{temp_prefix()}{secrets.token_hex(4)}.{final_name}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with open(fd, "wb", closefd=False) as f:
            f.write(data)
            f.flush()
            os.fsync(fd)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    return path


def publish_pair(folder: Path, name: str, engine: bytes, manifest: bytes) -> tuple[Path, Path]:
    """Write `<name>.engine` and `<name>.json` in `folder` as one unit (see the module docstring)."""
    engine_path, manifest_path = folder / f"{name}.engine", folder / f"{name}.json"
    temps: list[Path] = []
    engine_placed = False
    try:
        temps.append(_write_temp(folder, engine_path.name, engine))
        temps.append(_write_temp(folder, manifest_path.name, manifest))
        manifest_path.unlink(missing_ok=True)
        os.replace(temps[0], engine_path)
        engine_placed = True
        os.replace(temps[1], manifest_path)
    except BaseException:
        for path in temps + ([engine_path] if engine_placed else []):
            path.unlink(missing_ok=True)
        raise
    fsync_path(folder)
    return engine_path, manifest_path
