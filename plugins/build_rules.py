"""The MoE plugin's build-side rules (IPluginV3OneBuild): output shape, accepted inputs and formats, workspace,
optimization profile. Pure functions over the spec and plan, so the CPU tests check them without TensorRT."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from moe_build.errors import MoeBuildError
from moe_build.planner import Plan
from moe_build.spec import MoESpec
from moe_build.target import Target

from .fields import PLUGIN_NAME
from .slots import input_slots, output_dtype


def output_dims(input_dims: Sequence[Sequence[Any]]) -> list[Any]:
    """Output 0's dims from the inputs' dims: the hidden input's rows and columns.

    Works on any dim representation (ints, or TensorRT's IDimensionExpr), so the same rule
    serves get_output_shapes (symbolic) and run_enqueue (concrete).
    """
    if not input_dims:
        raise MoeBuildError(PLUGIN_NAME, "has no inputs; the first must be hidden states [T, H]")
    hidden = list(input_dims[0])
    if len(hidden) != 2:
        raise MoeBuildError(PLUGIN_NAME, f"hidden states must be 2-D [T, H], got rank {len(hidden)}")
    return [hidden[0], hidden[1]]


def check_input_dims(spec: MoESpec, dims: Sequence[Sequence[int]]) -> None:
    """Refuse inputs whose count or static dims do not fit `spec` (-1 marks a dynamic dim).

    The token dimension must be the same (or dynamic) in hidden and router_logits.
    """
    slots = input_slots(spec)
    if len(dims) != len(slots):
        raise MoeBuildError(PLUGIN_NAME, f"got {len(dims)} inputs, the spec needs {len(slots)}",
                            [s.name for s in slots])
    for slot, got in zip(slots, dims):
        got = tuple(int(d) for d in got)
        fits = len(got) == len(slot.shape) and all(
            g == -1 or w is None or g == w for g, w in zip(got, slot.shape))
        if not fits:
            want = tuple("T" if w is None else w for w in slot.shape)
            raise MoeBuildError(f"{PLUGIN_NAME} input {slot.name!r}", f"dims {got} do not fit the spec",
                                f"shape {want}")
    rows_hidden, rows_logits = int(dims[0][0]), int(dims[1][0])
    if -1 not in (rows_hidden, rows_logits) and rows_hidden != rows_logits:
        raise MoeBuildError(f"{PLUGIN_NAME} input 'router_logits'",
                            f"has {rows_logits} rows, hidden has {rows_hidden}", "the same token count")


def supports_io(spec: MoESpec, pos: int, dtype: torch.dtype | None, linear: bool, num_inputs: int) -> bool:
    """Whether tensor `pos` (inputs, then the output) may have `dtype` in `linear` format.

    Only the linear format and the exact dtypes of `input_slots`/`output_dtype` are accepted.
    `dtype` is None for a TensorRT type with no torch equivalent (always refused).
    """
    slots = input_slots(spec)
    if num_inputs != len(slots) or not linear or dtype is None or not 0 <= pos <= num_inputs:
        return False
    if pos == num_inputs:
        return dtype == output_dtype(spec)
    return dtype in slots[pos].dtypes


def workspace_size(spec: MoESpec, plan: Plan, max_tokens: int) -> int:
    """Bytes of TensorRT workspace for calls of up to `max_tokens` tokens: the runner's own sizing.

    The runner owns its buffer layout (and the kernel library's scratch queries), so the plugin
    asks it rather than repeating the arithmetic.
    """
    from moe_build.runner import workspace_bytes
    return int(workspace_bytes(spec, plan, max_tokens))


def plan_max_tokens(plan: Plan) -> int:
    """The largest token count the plan was built for (its target's profile): the runner's capacity."""
    return Target.from_dict(plan.target).profile.max


def check_profile(plan: Plan, profile_max_tokens: int) -> None:
    """Refuse an optimization profile reaching past the plan's: the runner holds no more rows."""
    if profile_max_tokens > plan_max_tokens(plan):
        raise MoeBuildError("max_tokens", f"the network's profile allows {profile_max_tokens} tokens, the plan "
                            f"was made for at most {plan_max_tokens(plan)}", f"<= {plan_max_tokens(plan)}")
