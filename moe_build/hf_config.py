"""Hugging Face `config.json` -> MoESpec, one parser per MoE family.

Each family spells the same facts differently (expert count, routing, shared experts), so the
mapping is decided here once and the rest of moe-build reads only MoESpec. Where a family's
released code and transformers' port disagree, the released checkpoints' own code wins (noted
at the place it matters).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping

from .errors import MoeBuildError
from .spec import Activation, DType, MoESpec, Routing, RoutingMethod, SharedExperts

ConfigSource = Mapping[str, Any] | str | os.PathLike

_DTYPES = {"float32": DType.FP32, "float16": DType.FP16, "bfloat16": DType.BF16}
# Gated activations only: every supported family feeds act(gate) * up. The gelu entries are the
# tanh approximation, the variant the fused TensorRT-LLM kernels implement (FtGelu).
_ACTIVATIONS = {"silu": Activation.SWIGLU, "swish": Activation.SWIGLU,
                "gelu_pytorch_tanh": Activation.GEGLU, "gelu_new": Activation.GEGLU}


def load_config(source: ConfigSource) -> dict[str, Any]:
    """Accept a dict, a config.json path or a checkpoint folder, so callers need not care which."""
    if isinstance(source, Mapping):
        return dict(source)
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    try:
        text = path.read_text()
    except OSError as exc:
        raise MoeBuildError("config", f"cannot read {path}: {exc.strerror}", "a config.json file or its folder")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MoeBuildError("config", f"{path} is not valid JSON ({exc.msg}, line {exc.lineno})", "JSON")
    if not isinstance(data, dict):
        raise MoeBuildError("config", f"{path} holds a {type(data).__name__}, not an object", "a JSON object")
    return data


class _Fields:
    """Typed reads of a config dict; every failure names the config key, so errors point at the file."""

    def __init__(self, data: Mapping[str, Any]):
        self.data = data

    def first(self, *keys: str) -> tuple[str, Any] | None:
        """The first present (non-null) alias; two aliases with different values are a contradiction."""
        found = [(k, self.data[k]) for k in keys if self.data.get(k) is not None]
        for key, value in found[1:]:
            if value != found[0][1]:
                raise MoeBuildError(key, f"{value!r} contradicts {found[0][0]}={found[0][1]!r}",
                                    f"the same value as {found[0][0]}")
        return found[0] if found else None

    def int(self, *keys: str, default: int | None = None, minimum: int = 1) -> int:
        hit = self.first(*keys)
        if hit is None:
            if default is None:
                raise MoeBuildError(keys[0], "missing from the config", f"an integer >= {minimum}")
            return default
        key, value = hit
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise MoeBuildError(key, f"must be an integer >= {minimum}, got {value!r}", f"integers >= {minimum}")
        return value

    def float(self, key: str, default: float | None = None) -> float:
        value = self.data.get(key)
        if value is None:
            if default is None:
                raise MoeBuildError(key, "missing from the config", "a positive number")
            return default
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise MoeBuildError(key, f"must be a positive number, got {value!r}", "numbers > 0")
        return float(value)

    def bool(self, key: str, default: bool | None = None) -> bool:
        value = self.data.get(key)
        if value is None:
            if default is None:
                raise MoeBuildError(key, "missing from the config", "true, false")
            return default
        if not isinstance(value, bool):
            raise MoeBuildError(key, f"must be true or false, got {value!r}", "true, false")
        return value

    def choice(self, key: str, allowed: tuple[str, ...], default: str | None = None) -> str:
        value = self.data.get(key, default)
        if value is None:
            raise MoeBuildError(key, "missing from the config", allowed)
        if value not in allowed:
            raise MoeBuildError(key, f"{value!r} is not supported", allowed)
        return value

    def int_list(self, key: str) -> list[int]:
        value = self.data.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise MoeBuildError(key, f"must be a list of layer indices, got {value!r}", "a list of integers")
        return value


def _dtype(f: _Fields) -> DType:
    """`dtype` (transformers 5) or `torch_dtype` (4.x); absent means bf16, the dtype of every released MoE."""
    hit = f.first("dtype", "torch_dtype")
    if hit is None:
        return DType.BF16
    key, value = hit
    name = str(value).removeprefix("torch.")
    if name not in _DTYPES:
        raise MoeBuildError(key, f"{value!r} is not a model dtype moe-build builds", list(_DTYPES))
    return _DTYPES[name]


def _activation(f: _Fields) -> Activation:
    value = f.data.get("hidden_act", "silu")
    if value not in _ACTIVATIONS:
        raise MoeBuildError("hidden_act", f"{value!r} is not supported for MoE experts", list(_ACTIVATIONS))
    return _ACTIVATIONS[value]


def _common(f: _Fields, experts: tuple[str, ...], inter: tuple[str, ...]) -> dict[str, Any]:
    """Fields every family has, read under that family's key names."""
    return dict(hidden_size=f.int("hidden_size"), intermediate_size=f.int(*inter),
                num_experts=f.int(*experts), top_k=f.int("num_experts_per_tok", "experts_per_token"),
                dtype=_dtype(f))


def _mixtral(f: _Fields) -> dict[str, Any]:
    # softmax over all experts then renormalising the top-k equals a softmax over the top-k logits
    return dict(_common(f, ("num_local_experts", "num_experts"), ("intermediate_size",)),
                activation=_activation(f), routing=Routing(RoutingMethod.TOPK_SOFTMAX))


def _softmax_topk(f: _Fields, inter: str) -> dict[str, Any]:
    """Qwen-MoE and OLMoE: softmax over all experts, top-k, optional renormalisation."""
    return dict(_common(f, ("num_experts", "num_local_experts"), (inter,)), activation=_activation(f),
                routing=Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=f.bool("norm_topk_prob", False)))


def _qwen2_moe(f: _Fields) -> dict[str, Any]:
    spec = _softmax_topk(f, "moe_intermediate_size")
    shared = f.int("shared_expert_intermediate_size", default=0, minimum=0)
    if shared:
        spec["shared"] = SharedExperts(count=1, intermediate_size=shared, sigmoid_gate=True)
    return spec


def _deepseek_shared(f: _Fields, inter: int) -> SharedExperts:
    if f.bool("mlp_bias", False):
        raise MoeBuildError("mlp_bias", "shared-expert biases are not supported", "false")
    count = f.int("n_shared_experts", default=0, minimum=0)
    return SharedExperts(count=count, intermediate_size=count * inter)


def _deepseek_v2(f: _Fields) -> dict[str, Any]:
    """V2 softmax routing. Its released code scales by routed_scaling_factor only when it does not
    renormalise (transformers' port always scales and never renormalises; they agree for the
    released configs, which all have norm_topk_prob=false)."""
    f.choice("scoring_func", ("softmax",), "softmax")
    method = f.choice("topk_method", ("greedy", "group_limited_greedy"), "greedy")
    renorm = f.bool("norm_topk_prob", False)
    groups = (f.int("n_group"), f.int("topk_group")) if method == "group_limited_greedy" else (1, 1)
    routing = Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=renorm, num_groups=groups[0], topk_groups=groups[1],
                      routed_scaling_factor=1.0 if renorm else f.float("routed_scaling_factor", 1.0))
    common = _common(f, ("n_routed_experts", "num_experts"), ("moe_intermediate_size",))
    return dict(common, activation=_activation(f), routing=routing,
                shared=_deepseek_shared(f, common["intermediate_size"]))


def _deepseek_v3(f: _Fields) -> dict[str, Any]:
    """V3 sigmoid routing with the e_score_correction_bias used for selection only."""
    f.choice("scoring_func", ("sigmoid",), "sigmoid")
    f.choice("topk_method", ("noaux_tc",), "noaux_tc")
    routing = Routing(RoutingMethod.SIGMOID_GROUPED, renormalize=f.bool("norm_topk_prob"),
                      num_groups=f.int("n_group"), topk_groups=f.int("topk_group"),
                      routed_scaling_factor=f.float("routed_scaling_factor"), correction_bias=True)
    common = _common(f, ("n_routed_experts", "num_local_experts"), ("moe_intermediate_size",))
    return dict(common, activation=_activation(f), routing=routing,
                shared=_deepseek_shared(f, common["intermediate_size"]))


def _gpt_oss(f: _Fields) -> dict[str, Any]:
    """GPT-OSS: fixed clamped SwiGLU (hidden_act is not used by its experts), biased router and experts."""
    return dict(_common(f, ("num_local_experts", "num_experts"), ("intermediate_size",)),
                activation=Activation.SWIGLU_CLAMP, expert_bias=True,
                routing=Routing(RoutingMethod.TOPK_SOFTMAX, router_bias=True),
                swiglu_alpha=f.float("swiglu_alpha", 1.702), swiglu_limit=f.float("swiglu_limit"))


_FAMILIES: dict[str, Callable[[_Fields], dict[str, Any]]] = {
    "mixtral": _mixtral,
    "qwen2_moe": _qwen2_moe,
    "qwen3_moe": lambda f: _softmax_topk(f, "moe_intermediate_size"),
    "olmoe": lambda f: _softmax_topk(f, "intermediate_size"),  # OLMoE has no dense MLP layers
    "deepseek_v2": _deepseek_v2,
    "deepseek_v3": _deepseek_v3,
    "gpt_oss": _gpt_oss,
}
FAMILIES: tuple[str, ...] = tuple(_FAMILIES)


def _family(data: Mapping[str, Any]) -> str:
    model_type = data.get("model_type")
    if model_type is None:
        raise MoeBuildError("model_type", "missing from the config", FAMILIES)
    if model_type not in _FAMILIES:
        raise MoeBuildError("model_type", f"{model_type!r} is not a supported MoE model", FAMILIES)
    return model_type


def _name(data: Mapping[str, Any], source: ConfigSource, family: str) -> str:
    """The checkpoint's own name when known (hub id or folder), else the family."""
    if data.get("_name_or_path"):
        return str(data["_name_or_path"]).rstrip("/").split("/")[-1]
    if not isinstance(source, Mapping):
        path = Path(source)
        return (path if path.is_dir() else path.parent).resolve().name
    return family


# MoESpec's own checks name spec fields; report them under the config key the user can fix.
_CONFIG_KEYS = {"top_k": ("num_experts_per_tok", "experts_per_token"),
                "num_groups": ("n_group",), "topk_groups": ("topk_group",)}


def spec_from_hf_config(config: ConfigSource) -> MoESpec:
    """The MoESpec of one MoE layer of a Hugging Face MoE model (all its MoE layers are alike)."""
    data = load_config(config)
    family = _family(data)
    moe_layer_indices(data)  # a config whose layers are all dense is not an MoE model
    fields = _FAMILIES[family](_Fields(data))
    try:
        return MoESpec(**fields, family=family, name=_name(data, config, family))
    except MoeBuildError as exc:
        key = next((k for k in _CONFIG_KEYS.get(exc.field, ()) if k in data), exc.field)
        raise MoeBuildError(key, exc.problem, exc.allowed) from None


def moe_layer_indices(config: ConfigSource) -> list[int]:
    """Decoder layers whose MLP is the MoE block (the others are dense MLPs)."""
    data = load_config(config)
    family = _family(data)
    f = _Fields(data)
    layers = range(f.int("num_hidden_layers"))
    if family in ("qwen2_moe", "qwen3_moe"):
        step = f.int("decoder_sparse_step", default=1)
        dense = set(f.int_list("mlp_only_layers"))
        indices = [i for i in layers if i not in dense and (i + 1) % step == 0]
    elif family in ("deepseek_v2", "deepseek_v3"):
        # the released DeepSeek code also honours moe_layer_freq (transformers' port assumes 1)
        first = f.int("first_k_dense_replace", default=0, minimum=0)
        freq = f.int("moe_layer_freq", default=1)
        indices = [i for i in layers if i >= first and i % freq == 0]
    else:
        indices = list(layers)
    if not indices:
        raise MoeBuildError("num_hidden_layers", "no decoder layer is an MoE layer, so this is not an MoE model",
                            "a config with at least one MoE layer")
    return indices
