"""Where a spec comes from: a checkpoint folder, a preset name, or flags, then flag overrides.

The CLI commands share this so `build`, `fusion-report` and `bench` read a layer the same way.
"""
from __future__ import annotations

import enum
from pathlib import Path
from typing import Any, TypeVar

from ..errors import MoeBuildError
from .layer import Activation, DType, MoESpec, OutputDType, Quant

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
                 ep_rank: int | None = None,
                 fp8_input: bool | None = None) -> MoESpec:
    """Base spec (checkpoint > preset > flags > embedded default), then the flags as overrides."""
    if checkpoint is not None and preset is not None:
        raise MoeBuildError("preset", "give a checkpoint or a preset, not both", "one of CHECKPOINT, --preset")
    overrides: dict[str, Any] = dict(
        hidden_size=hidden, intermediate_size=inter, num_experts=experts, top_k=top_k,
        activation=parse_enum("activation", Activation, activation), dtype=parse_enum("dtype", DType, dtype),
        quant=parse_enum("quant", Quant, quant), output_dtype=parse_enum("output_dtype", OutputDType, output_dtype),
        lora=lora or None, ep_size=ep_size, ep_rank=ep_rank, fp8_input=fp8_input or None)
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
