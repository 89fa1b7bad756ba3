"""Which decoder layers of a config hold the MoE block (the others are dense MLPs): the layouts the families'
configs describe, each a function of the config's fields."""
from __future__ import annotations

from typing import Callable

from ..errors import MoeBuildError
from .config_fields import ConfigFields


def all_layers(f: ConfigFields) -> list[int]:
    return list(f.layers())


def first_dense(key: str, default: int) -> Callable[[ConfigFields], list[int]]:
    """The first `key` layers are dense MLPs, the rest MoE."""
    def layers(f: ConfigFields) -> list[int]:
        first = f.int(key, default=default, minimum=0)
        return [i for i in f.layers() if i >= first]
    return layers


def leading_dense(count: int) -> Callable[[ConfigFields], list[int]]:
    """The first `count` layers are dense MLPs, whatever the config says (its config class has no key for it)."""
    def layers(f: ConfigFields) -> list[int]:
        return [i for i in f.layers() if i >= count]
    return layers


def layer_types(default: Callable[[ConfigFields], list[int]]) -> Callable[[ConfigFields], list[int]]:
    """`mlp_layer_types` ("dense" / "sparse" per layer), as transformers writes it; configs without it get the
    layout their config class derives."""
    def layers(f: ConfigFields) -> list[int]:
        kinds = f.data.get("mlp_layer_types")
        if kinds is None:
            return default(f)
        n = len(f.layers())
        if not isinstance(kinds, list) or len(kinds) != n or any(k not in ("dense", "sparse") for k in kinds):
            raise MoeBuildError("mlp_layer_types", f"must list 'dense' or 'sparse' for each of the {n} layers",
                                "dense, sparse")
        return [i for i, kind in enumerate(kinds) if kind == "sparse"]
    return layers


def required_layer_types(f: ConfigFields) -> list[int]:
    raise MoeBuildError("mlp_layer_types", "missing from the config (this family has no default layout)",
                        "a list of 'dense' / 'sparse' per layer")


def qwen_layers(f: ConfigFields) -> list[int]:
    """Qwen-MoE: every decoder_sparse_step-th layer, minus mlp_only_layers."""
    step = f.int("decoder_sparse_step", default=1)
    dense = set(f.int_list("mlp_only_layers"))
    return [i for i in f.layers() if i not in dense and (i + 1) % step == 0]


def flint_layers(f: ConfigFields) -> list[int]:
    """Flint: Qwen's rule, but an absent mlp_only_layers means [0, 1]."""
    return qwen_layers(ConfigFields({"mlp_only_layers": [0, 1], **{k: v for k, v in f.data.items() if v is not None}}))


def deepseek_layers(first_default: int) -> Callable[[ConfigFields], list[int]]:
    """DeepSeek: dense before first_k_dense_replace, then every moe_layer_freq-th layer (the released code
    honours moe_layer_freq; transformers' port assumes 1)."""
    def layers(f: ConfigFields) -> list[int]:
        first = f.int("first_k_dense_replace", default=first_default, minimum=0)
        freq = f.int("moe_layer_freq", default=1)
        return [i for i in f.layers() if i >= first and i % freq == 0]
    return layers


def layer_freq(first_default: int) -> Callable[[ConfigFields], list[int]]:
    """first_k_dense_replace plus moe_layer_freq as an interval or as a per-layer 0/1 list."""
    def layers(f: ConfigFields) -> list[int]:
        first = f.int("first_k_dense_replace", default=first_default, minimum=0)
        freq = f.data.get("moe_layer_freq", 1)
        if isinstance(freq, list):
            return [i for i in f.layers() if i >= first and i < len(freq) and freq[i]]
        step = f.int("moe_layer_freq", default=1)
        return [i for i in f.layers() if i >= first and i % step == 0]
    return layers


def layer_flags(f: ConfigFields) -> list[int]:
    """MiniMax-M3: an optional per-layer moe_layer_freq list (1: MoE), else every layer."""
    freq = f.data.get("moe_layer_freq")
    if freq is None:
        return list(f.layers())
    if not isinstance(freq, list):
        raise MoeBuildError("moe_layer_freq", f"must be a per-layer list, got {freq!r}", "a list of 0 / 1")
    return [i for i in f.layers() if i < len(freq) and freq[i]]


def jamba_layers(f: ConfigFields) -> list[int]:
    """Jamba: layer i is MoE when i % expert_layer_period == expert_layer_offset (and there are experts)."""
    period, offset = f.int("expert_layer_period", default=2), f.int("expert_layer_offset", default=1, minimum=0)
    if f.int("num_experts", default=16) <= 1:
        return []
    return [i for i in f.layers() if i % period == offset]


def granite_hybrid_layers(f: ConfigFields) -> list[int]:
    return list(f.layers()) if f.int("num_local_experts", default=8, minimum=0) else []


def step_layers(f: ConfigFields) -> list[int]:
    """Step-3.5: the layers listed in moe_layers_enum ("3,4,..." or a list), by default all from the fourth."""
    listed = f.data.get("moe_layers_enum")
    if listed is None:
        return [i for i in f.layers() if i >= 3]
    items = listed.split(",") if isinstance(listed, str) else listed
    try:
        moe = {int(i) for i in items if str(i).strip()}
    except (TypeError, ValueError):
        raise MoeBuildError("moe_layers_enum", f"must list layer indices, got {listed!r}", "e.g. \"3,4,5\"") from None
    return [i for i in f.layers() if i in moe]
