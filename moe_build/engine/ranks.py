"""Where an expert-parallel layer's engines live: one folder per rank, `<out>/<name>/rank<r>/`.

Why a folder per rank rather than `<name>-rank<r>.engine` beside the others: every rank's pair keeps the
layer's own name (`<name>.engine` + `<name>.json`, the manifest's `engine_file`), a launcher hands rank r
its folder, and `moe-build inspect <out>/<name>` finds the whole group. A layer on one GPU (ep_size 1)
keeps the flat layout, `<out>/<name>.engine`, unchanged.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from ..spec import MoESpec

RANK_FOLDER = re.compile(r"^rank(0|[1-9][0-9]*)$")


def split_ranks(spec: MoESpec) -> tuple[MoESpec, tuple[int, ...]]:
    """(the whole layer's spec, the ranks to build): no ranks for ep_size 1 (one engine, the flat layout), the
    one rank `--ep-rank` named, else every rank. The spec comes back without its rank, since weights are
    loaded (and checked) for the whole layer and sliced per rank."""
    whole = dataclasses.replace(spec, ep_rank=None)
    if spec.ep_size == 1:
        return whole, ()
    return whole, (spec.ep_rank,) if spec.ep_rank is not None else tuple(range(spec.ep_size))


def rank_folder(output_dir: Path, name: str, rank: int) -> Path:
    """The folder of rank `rank`'s engine + manifest of the layer `name`."""
    return Path(output_dir) / name / f"rank{rank}"


def rank_folders(folder: Path) -> list[tuple[int, Path]]:
    """(rank, folder) of each `rank<r>` subfolder of `folder`, by rank; none where it has none."""
    found = []
    for path in Path(folder).iterdir() if Path(folder).is_dir() else ():
        match = RANK_FOLDER.match(path.name)
        if match is not None and path.is_dir():
            found.append((int(match[1]), path))
    return sorted(found)
