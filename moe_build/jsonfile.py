"""Reading JSON that a user or another program wrote (configs, safetensors indexes, manifests, plugin
fields): every way it can be unreadable is one `MoeBuildError` line naming the field, never a traceback.

Why a helper: `json.loads` raises four different exceptions for bad bytes (UnicodeDecodeError,
JSONDecodeError, RecursionError for deeply nested input, MemoryError for absurd sizes), and callers want
an object, not whatever JSON value the file holds.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import MoeBuildError

MAX_JSON_BYTES = 64 << 20  # the largest index of a published checkpoint is ~5 MB; configs are kilobytes


def parse_json_object(data: bytes, field: str, what: str) -> dict[str, Any]:
    """`data` as a JSON object, or a one-line MoeBuildError about `field` (`what` names the source)."""
    if len(data) > MAX_JSON_BYTES:
        raise MoeBuildError(field, f"{what} is {len(data)} bytes, more than JSON of this kind holds",
                            f"at most {MAX_JSON_BYTES} bytes")
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise MoeBuildError(field, f"{what} is not UTF-8 (byte {exc.start})", "UTF-8 JSON") from None
    except json.JSONDecodeError as exc:
        raise MoeBuildError(field, f"{what} is not valid JSON ({exc.msg}, line {exc.lineno})", "JSON") from None
    except RecursionError:
        raise MoeBuildError(field, f"{what} is nested too deeply to read", "JSON of ordinary depth") from None
    if not isinstance(value, dict):
        raise MoeBuildError(field, f"{what} holds a {type(value).__name__}, not an object", "a JSON object")
    return value


def read_json_object(path: Path, field: str) -> dict[str, Any]:
    """The JSON object in file `path`, or a one-line MoeBuildError about `field`."""
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise MoeBuildError(field, f"{path} is {size} bytes, more than JSON of this kind holds",
                                f"at most {MAX_JSON_BYTES} bytes")
        data = path.read_bytes()
    except OSError as exc:
        raise MoeBuildError(field, f"cannot read {path}: {exc.strerror or exc}") from None
    return parse_json_object(data, field, str(path))
