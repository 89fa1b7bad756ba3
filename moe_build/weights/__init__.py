"""A layer's weights: the canonical in-memory layout (`layout`, needs torch), the 64 x 64 block geometry
(`blocks`, pure), and the checkpoint loader (`checkpoint`).

The names below load `layout` (and torch) on first use, so that code which needs only the block geometry,
such as the planner, never imports torch.
"""
from __future__ import annotations

from typing import Any

from .blocks import BLOCK, blocks_fit

_LAYOUT_NAMES = ("MoEWeights", "block_64x64", "interleave_gate_up")
__all__ = ["BLOCK", "blocks_fit", *_LAYOUT_NAMES]


def __getattr__(name: str) -> Any:
    if name in _LAYOUT_NAMES:
        from . import layout
        return getattr(layout, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
