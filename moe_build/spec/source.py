"""Where a spec comes from: a checkpoint folder, a preset name, or flags, then flag overrides.

The CLI commands share this so `build`, `fusion-report` and `bench` read a layer the same way.
"""
from __future__ import annotations

import enum
from pathlib import Path
from typing import Any, TypeVar

from ..errors import MoeBuildError
from .layer import WOQ_STORAGE_QUANTS, ActScale, Activation, DType, MoESpec, OutputDType, Quant
from .woq_config import GROUP_SIZES

E = TypeVar("E", bound=enum.Enum)
DEFAULT_PRESET = "tiny"


def parse_enum(field: str, cls: type[E], value: str | None) -> E | None:
    """Turn a CLI string into an enum member, or a one-line error listing the allowed spellings."""
    if value is None:
        return None
    try:
        return cls(value)
    except ValueError:
        raise MoeBuildError(field, f"unknown value {value!r}", [m.value for m in cls]) from None


def config_path(checkpoint: str | Path) -> Path:
    p = Path(checkpoint)
    cfg = p / "config.json" if p.is_dir() else p
    if not cfg.is_file():
        raise MoeBuildError("checkpoint", f"{p} has no config.json", "a Hugging Face checkpoint folder")
    return cfg


def resolve_spec(checkpoint: str | Path | None = None, preset: str | None = None, *, hidden: int | None = None,
                 inter: int | None = None, experts: int | None = None, top_k: int | None = None,
                 activation: str | None = None, dtype: str | None = None, quant: str | None = None,
                 output_dtype: str | None = None, lora: bool | None = None, ep_size: int | None = None,
                 ep_rank: int | None = None, fp8_input: bool | None = None, group_size: int | None = None,
                 zero_points: bool | None = None, per_channel: bool | None = None,
                 prequant_scales: bool | None = None, act_scale: str | None = None) -> MoESpec:
    """Base spec (checkpoint > preset > flags > embedded default), then the flags as overrides. The weight-only
    storage flags (zero points, per-channel scales, pre-quant scales) and the activation scales (static: a
    calibrated scale per GEMM input, as ModelOpt stores; dynamic: per row at run time) only set what a checkpoint's
    config would, and are refused for a quant whose layers cannot have them."""
    spec = _resolve(checkpoint, preset, hidden=hidden, inter=inter, experts=experts, top_k=top_k,
                    activation=activation, dtype=dtype, quant=quant, output_dtype=output_dtype, lora=lora,
                    ep_size=ep_size, ep_rank=ep_rank, fp8_input=fp8_input, quant_group_size=group_size,
                    quant_zero_points=zero_points or None, quant_per_channel=per_channel or None,
                    quant_prequant_scales=prequant_scales or None,
                    act_scale=parse_enum("act_scale", ActScale, act_scale))
    if act_scale is not None and spec.quant not in ACT_SCALE_QUANTS:
        raise MoeBuildError("act_scale", f"given for quant={spec.quant.value}", [q.value for q in ACT_SCALE_QUANTS])
    for name, given in (("quant_zero_points", zero_points), ("quant_per_channel", per_channel),
                        ("quant_prequant_scales", prequant_scales)):
        quants = WOQ_STORAGE_QUANTS[name]
        if given and spec.quant not in quants:
            raise MoeBuildError(name, f"given for quant={spec.quant.value}", [q.value for q in quants])
    if group_size is not None:
        _check_group_size(spec)
    return spec


GROUPED_QUANTS = (Quant.W4A16_AWQ, Quant.W4AFP8, Quant.W8A16)
ACT_SCALE_QUANTS = (Quant.FP8, Quant.FP8_BLOCK, Quant.W4AFP8)  # the quants with FP8 activations


def _check_group_size(spec: MoESpec) -> None:
    """--group-size: a group the weight-only kernels take, for a group-wise quant, dividing both GEMMs' K."""
    g = spec.quant_group_size
    if spec.quant not in GROUPED_QUANTS:
        raise MoeBuildError("group_size", f"given for quant={spec.quant.value}", [q.value for q in GROUPED_QUANTS])
    if g not in GROUP_SIZES or spec.hidden_size % g or spec.intermediate_size % g:
        raise MoeBuildError("group_size", f"{g} with hidden {spec.hidden_size} and intermediate "
                            f"{spec.intermediate_size}", f"one of {GROUP_SIZES} dividing both")


def _resolve(checkpoint: str | Path | None, preset: str | None, *, hidden: int | None, inter: int | None,
             experts: int | None, top_k: int | None, activation: str | None, dtype: str | None, quant: str | None,
             output_dtype: str | None, lora: bool | None, ep_size: int | None, ep_rank: int | None,
             fp8_input: bool | None, **storage: Any) -> MoESpec:
    if checkpoint is not None and preset is not None:
        raise MoeBuildError("preset", "give a checkpoint or a preset, not both", "one of CHECKPOINT, --preset")
    overrides: dict[str, Any] = dict(
        hidden_size=hidden, intermediate_size=inter, num_experts=experts, top_k=top_k,
        activation=parse_enum("activation", Activation, activation), dtype=parse_enum("dtype", DType, dtype),
        quant=parse_enum("quant", Quant, quant), output_dtype=parse_enum("output_dtype", OutputDType, output_dtype),
        lora=lora or None, ep_size=ep_size, ep_rank=ep_rank, fp8_input=fp8_input or None, **storage)
    if checkpoint is not None:
        from .hf_config import spec_from_hf_config
        base = spec_from_hf_config(config_path(checkpoint))
    elif preset is not None:
        from .presets import get_preset
        base = get_preset(preset)
    elif any(v is not None for v in (hidden, inter, experts, top_k)):
        missing = [f for f, v in (("--hidden", hidden), ("--inter", inter), ("--experts", experts),
                                  ("--top-k", top_k)) if v is None]
        if missing:
            raise MoeBuildError(missing[0], "required when the layer is given by flags",
                                "--hidden, --inter, --experts and --top-k together")
        given = {k: v for k, v in overrides.items() if v is not None}
        return MoESpec(**given, name=f"moe-h{hidden}-i{inter}-e{experts}-k{top_k}")
    else:
        from .presets import get_preset
        base = get_preset(DEFAULT_PRESET)
    return base.with_overrides(**overrides)
