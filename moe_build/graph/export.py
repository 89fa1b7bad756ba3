"""Writing one layer's OOTB ONNX graph where the user asked, as one unit (`moe-build export`).

Why not `export_onnx` straight to the path: an export of a large layer takes minutes and writes
GBs (the graph plus `<name>.data` with its weights), and a failure or Ctrl-C half-way would leave a
graph that onnxruntime or Polygraphy reads as truncated or pointing at missing weights. So the graph
is exported into a scratch folder beside the destination (same disk: the rename is atomic and moves
no bytes), fsynced, and then moved into place: an existing graph of that name is removed first, the
external data (if any) is renamed next, the graph last (the commit). A reader sees the old graph, no
graph, or the new one with its data; any failure before the commit removes everything this export
placed, and the scratch folder goes however the export ends (moe_build/outputs.py sweeps one a kill -9
left).
"""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import MoeBuildError
from ..outputs import check_writable_folder, fsync_path, make_folder, scratch_folder, sweep_stale_temps
from ..planner import Plan
from ..spec import MoESpec
from ..weights import MoEWeights
from .ootb import export_onnx


def check_onnx_destination(path: Path) -> None:
    """Refuse, before any weight is read, a destination that cannot take the graph."""
    if path.is_dir():
        raise MoeBuildError("onnx", f"{path} is a folder", "a file path such as layer.onnx")
    check_writable_folder("onnx", path.parent)


def write_onnx(spec: MoESpec, weights: MoEWeights, plan: Plan, path: str | os.PathLike[str],
               routing_input: str = "hidden") -> list[Path]:
    """Export the layer's graph to `path` as one unit (see the module docstring); returns the files
    written: the graph, then its external data file when the weights went there."""
    path = Path(path)
    check_onnx_destination(path)
    folder = path.parent
    make_folder("onnx", folder)
    sweep_stale_temps(folder)
    with scratch_folder(folder, ".onnx") as scratch:
        staged = export_onnx(spec, weights, plan, scratch / path.name, routing_input)
        data = sorted(p for p in scratch.iterdir() if p != staged)  # named as the graph references them
        for p in (*data, staged):
            fsync_path(p)
        placed: list[Path] = []
        try:
            path.unlink(missing_ok=True)
            for p in data:
                os.replace(p, folder / p.name)
                placed.append(folder / p.name)
            os.replace(staged, path)
        except BaseException:
            for p in placed:
                p.unlink(missing_ok=True)
            raise
    fsync_path(folder)
    return [path, *placed]
