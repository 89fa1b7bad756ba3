"""Hugging Face `config.json` -> MoESpec, one parser per MoE family.

Each family spells the same facts differently (expert count, routing, shared experts), so the
mapping is decided here once and the rest of moe-build reads only MoESpec. Where a family's
released code and transformers' port disagree, the released checkpoints' own code wins (noted
at the place it matters). A family whose MoE block needs math that MoESpec cannot say is refused
by name (`REFUSED`), and so is a supported family's config that switches such math on: an accepted
checkpoint never computes silently different math.

Multimodal models keep their language model's config under `text_config` (Qwen3-Omni under
`thinker_config.text_config`); the spec is that language model's MoE layer, and its family stays the
top-level `model_type` so the checkpoint loader knows where those layers live.

FP8 checkpoints set the spec's `quant` and `act_scale` from their quantization description (`_fp8_quant`):
the experts then stay FP8 from the file to the kernels, so a description that moe-build cannot run
exactly is refused rather than read as something else. Weight-only quantized ones (AWQ, compressed-tensors int,
ModelOpt W4A16/W4A8-AWQ and W8A16, GPT-OSS's MXFP4) set `quant` and `quant_group_size` the same way
(`_woq_quant`, spec/woq_config.py).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from ..errors import MoeBuildError
from ..jsonfile import read_json_object
from .layer import ActScale, Activation, DType, MoESpec, Quant, Routing, RoutingMethod, SharedExperts
from .woq_config import Woq, is_int, woq_description

ConfigSource = Mapping[str, Any] | str | os.PathLike

MAX_LAYERS = 1024  # decoder layers of a config (the largest released MoE models have under 100)
_DTYPES = {"float32": DType.FP32, "float16": DType.FP16, "bfloat16": DType.BF16}
# Gated activations only: every supported family feeds act(gate) * up. The gelu entries are the
# tanh approximation, the variant the fused TensorRT-LLM kernels implement (FtGelu).
_ACTIVATIONS = {"silu": Activation.SWIGLU, "swish": Activation.SWIGLU,
                "gelu_pytorch_tanh": Activation.GEGLU, "gelu_new": Activation.GEGLU}
_EXPERTS_PER_TOKEN = ("num_experts_per_tok", "experts_per_token", "num_experts_per_token")


def load_config(source: ConfigSource) -> dict[str, Any]:
    """Accept a dict, a config.json path or a checkpoint folder, so callers need not care which."""
    if isinstance(source, Mapping):
        return dict(source)
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    return read_json_object(path, "config")


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

    def int(self, *keys: str, default: int | None = None, minimum: int = 1, maximum: int | None = None) -> int:
        hit = self.first(*keys)
        allowed = f"integers {minimum}..{maximum}" if maximum is not None else f"integers >= {minimum}"
        if hit is None:
            if default is None:
                raise MoeBuildError(keys[0], "missing from the config", allowed)
            return default
        key, value = hit
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum or \
                (maximum is not None and value > maximum):
            raise MoeBuildError(key, f"must be an integer in that range, got {value!r}", allowed)
        return value

    def float(self, *keys: str, default: float | None = None) -> float:
        hit = self.first(*keys)
        if hit is None:
            if default is None:
                raise MoeBuildError(keys[0], "missing from the config", "a positive number")
            return default
        key, value = hit
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise MoeBuildError(key, f"must be a positive number, got {value!r}", "numbers > 0")
        return float(value)

    def bool(self, *keys: str, default: bool | None = None) -> bool:
        hit = self.first(*keys)
        if hit is None:
            if default is None:
                raise MoeBuildError(keys[0], "missing from the config", "true, false")
            return default
        key, value = hit
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

    def layers(self) -> range:
        """Every decoder layer (DBRX spells the count `n_layers`)."""
        return range(self.int("num_hidden_layers", "n_layers", maximum=MAX_LAYERS))

    def same(self, key: str, value: Any, problem: str) -> None:
        """Refuse `key` unless it is absent or equals `value`: the keys transformers ignores but a family's
        released code reads, where another value would mean another architecture."""
        if self.data.get(key) is not None and self.data[key] != value:
            raise MoeBuildError(key, f"{self.data[key]!r}: {problem}", repr(value))


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


def _activation(f: _Fields, key: str = "hidden_act", default: str = "silu") -> Activation:
    value = f.data.get(key) or default
    if not isinstance(value, str) or value not in _ACTIVATIONS:
        raise MoeBuildError(key, f"{value!r} is not supported for MoE experts", list(_ACTIVATIONS))
    return _ACTIVATIONS[value]


def _common(f: _Fields, experts: tuple[str, ...], inter: tuple[str, ...],
            top_k: tuple[str, ...] = _EXPERTS_PER_TOKEN) -> dict[str, Any]:
    """Fields every family has, read under that family's key names."""
    return dict(hidden_size=f.int("hidden_size"), intermediate_size=f.int(*inter),
                num_experts=f.int(*experts), top_k=f.int(*top_k), dtype=_dtype(f))


def _shared(count: int, intermediate_size: int, sigmoid_gate: bool = False) -> SharedExperts:
    """`count` always-on experts of `intermediate_size` in total; a zero count or size means none."""
    if not count or not intermediate_size:
        return SharedExperts()
    return SharedExperts(count=count, intermediate_size=intermediate_size, sigmoid_gate=sigmoid_gate)


def _no_mlp_bias(f: _Fields, key: str = "mlp_bias") -> None:
    if f.bool(key, default=False):
        raise MoeBuildError(key, "shared-expert biases are not supported", "false")


# ---- top-k on the logits, softmax over the k (Mixtral, MiniMax, Granite-MoE, Aria, HunYuan) ----------------
# A softmax over all experts renormalised over the chosen k equals a softmax over the k chosen logits.

def _mixtral(f: _Fields) -> dict[str, Any]:
    return dict(_common(f, ("num_local_experts", "num_experts"), ("intermediate_size",)),
                activation=_activation(f), routing=Routing(RoutingMethod.TOPK_SOFTMAX))


def _minimax(f: _Fields) -> dict[str, Any]:
    """MiniMax-Text-01: Mixtral's block. Its released code adds a shared expert when shared_intermediate_size
    is set; transformers' port has none, so such a config is refused rather than built without it."""
    f.same("shared_intermediate_size", 0, "MiniMax's shared expert is not in transformers' MiniMax block")
    return _mixtral(f)


def _aria(f: _Fields) -> dict[str, Any]:
    """Aria: routed experts are always SiLU-gated while its shared experts use hidden_act; one spec holds one
    activation, so hidden_act must be SiLU too."""
    if _activation(f) is not Activation.SWIGLU:
        raise MoeBuildError("hidden_act", f"{f.data['hidden_act']!r}: Aria's routed experts always use SiLU, "
                            "so its shared experts would use another activation", "silu")
    _no_mlp_bias(f)
    common = _common(f, ("moe_num_experts",), ("intermediate_size",), ("moe_topk",))
    count = f.int("moe_num_shared_experts", default=2, minimum=0)
    return dict(common, activation=Activation.SWIGLU, routing=Routing(RoutingMethod.TOPK_SOFTMAX),
                shared=_shared(count, count * common["intermediate_size"]))


def _per_layer(f: _Fields, key: str) -> Any:
    """HunYuan lets some keys be per-layer lists; one spec serves every layer, so the list must be uniform."""
    value = f.data.get(key)
    if isinstance(value, list):
        if not value or any(v != value[0] for v in value):
            raise MoeBuildError(key, f"differs between layers ({value!r}); moe-build builds one layer spec "
                                "for all MoE layers", "one value, or a list of equal values")
        return value[0]
    return value


def _hunyuan_v1_moe(f: _Fields) -> dict[str, Any]:
    """HunYuan-A13B: softmax top-k renormalised, one shared MLP of intermediate_size. transformers' port sizes
    routed and shared experts by intermediate_size; the released keys that would size them otherwise must
    agree with it."""
    per_layer = {k: _per_layer(f, k) for k in ("num_experts", "moe_topk", "moe_intermediate_size",
                                               "num_shared_expert")}
    g = _Fields({**f.data, **{k: v for k, v in per_layer.items() if v is not None}})
    inter = g.int("intermediate_size")
    g.same("moe_intermediate_size", inter, "transformers' HunYuan experts use intermediate_size")
    g.same("num_shared_expert", 1, "transformers' HunYuan block has exactly one shared MLP")
    g.same("use_mixed_mlp_moe", True, "transformers' HunYuan block always adds the shared MLP")
    return dict(_common(g, ("num_experts", "num_local_experts"), ("intermediate_size",),
                        ("moe_topk", "num_experts_per_tok")),
                activation=_activation(g), routing=Routing(RoutingMethod.TOPK_SOFTMAX), shared=_shared(1, inter))


def _openai_privacy_filter(f: _Fields) -> dict[str, Any]:
    """OpenAI privacy filter: GPT-OSS's biased router and clamped SwiGLU experts (gate/up not interleaved).
    Its scores are divided by top_k and the block output multiplied by top_k again, which cancels."""
    return dict(_common(f, ("num_local_experts", "num_experts"), ("intermediate_size",)),
                activation=Activation.SWIGLU_CLAMP, expert_bias=True,
                routing=Routing(RoutingMethod.TOPK_SOFTMAX, router_bias=True),
                swiglu_alpha=f.float("swiglu_alpha", default=1.702), swiglu_limit=f.float("swiglu_limit", default=7.0))


def _gpt_oss(f: _Fields) -> dict[str, Any]:
    """GPT-OSS: fixed clamped SwiGLU (hidden_act is not used by its experts), biased router and experts."""
    return dict(_common(f, ("num_local_experts", "num_experts"), ("intermediate_size",)),
                activation=Activation.SWIGLU_CLAMP, expert_bias=True,
                routing=Routing(RoutingMethod.TOPK_SOFTMAX, router_bias=True),
                swiglu_alpha=f.float("swiglu_alpha", default=1.702), swiglu_limit=f.float("swiglu_limit"))


# ---- softmax over all experts, then top-k, optionally renormalised (Qwen-MoE, OLMoE, Jamba, DBRX) ----------

def _softmax_topk(f: _Fields, inter: str, renormalize: bool) -> dict[str, Any]:
    return dict(_common(f, ("num_experts", "num_local_experts"), (inter,)), activation=_activation(f),
                routing=Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=renormalize))


def _norm_topk(default: bool, inter: str = "moe_intermediate_size") -> Callable[[_Fields], dict[str, Any]]:
    """Renormalised when norm_topk_prob says so; `default` is the config class's (false for Qwen2/3-MoE and
    OLMoE, true for the later Qwen and Mellum)."""
    def parse(f: _Fields) -> dict[str, Any]:
        return _softmax_topk(f, inter, f.bool("norm_topk_prob", default=default))
    return parse


def _with_shared(parse: Callable[[_Fields], dict[str, Any]], default: int, gated: bool = True,
                 key: str = "shared_expert_intermediate_size") -> Callable[[_Fields], dict[str, Any]]:
    """Plus Qwen2-MoE's shared expert of `key`'s size, its output scaled by sigmoid(x @ w_gate)
    (Lara-mini's has no gate). Granite-MoE-Shared, -Hybrid and -SWA: an ungated shared MLP of
    shared_intermediate_size beside the block in the decoder layer, reading the same input, so
    layer output = routed + shared (the residual multiplier acts outside)."""
    def parse_shared(f: _Fields) -> dict[str, Any]:
        spec = parse(f)
        spec["shared"] = _shared(1, f.int(key, default=default, minimum=0), sigmoid_gate=gated)
        return spec
    return parse_shared


def _always_renormalised(f: _Fields) -> dict[str, Any]:
    """Qwen3-VL-MoE and Qwen3.5-MoE: the router always renormalises (they have no norm_topk_prob)."""
    return _softmax_topk(f, "moe_intermediate_size", True)


def _dbrx(f: _Fields) -> dict[str, Any]:
    """DBRX: the expert fields sit in `ffn_config`. Top-k weights are divided by their p-norm with
    p = moe_normalize_expert_weights; p = 1 is renormalisation, any other p is not in the spec."""
    ffn = f.data.get("ffn_config")
    if not isinstance(ffn, Mapping):
        raise MoeBuildError("ffn_config", "missing from the config", "an object")
    g = _Fields(ffn)
    p = ffn.get("moe_normalize_expert_weights", 1.0)
    if p is not None and (isinstance(p, bool) or p != 1):
        raise MoeBuildError("ffn_config.moe_normalize_expert_weights", f"{p!r}: dividing the top-k weights by "
                            "their p-norm for p != 1 is not supported", "1, null")
    act = ffn.get("ffn_act_fn") or {}
    key = "ffn_config.ffn_act_fn.name"
    activation = _activation(_Fields({key: act.get("name") if isinstance(act, Mapping) else act}), key)
    return dict(hidden_size=f.int("d_model", "hidden_size"), intermediate_size=g.int("ffn_hidden_size"),
                num_experts=g.int("moe_num_experts"), top_k=g.int("moe_top_k"), dtype=_dtype(f),
                activation=activation, routing=Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=p is not None))


def _grouped_softmax(f: _Fields, renormalize: bool) -> dict[str, Any]:
    """Mistral 4 / Mistral Large 4: softmax, best groups by the sum of their two best probabilities, top-k,
    scaling. moe-build's grouped softmax ranks a group by its best expert, so only configs whose group mask
    is a no-op (one group, or every group kept) are expressible."""
    groups, keep = f.int("n_group", default=1), f.int("topk_group", default=1)
    if keep < groups:
        raise MoeBuildError("topk_group", f"{keep} of n_group={groups}: ranking groups by the sum of their two "
                            "best softmax probabilities is not supported", f"n_group ({groups}), or n_group=1")
    routing = Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=renormalize,
                      routed_scaling_factor=f.float("routed_scaling_factor", default=1.0))
    common = _common(f, ("n_routed_experts", "num_local_experts", "num_experts"), ("moe_intermediate_size",))
    count = f.int("n_shared_experts", default=1, minimum=0)
    return dict(common, activation=_activation(f), routing=routing,
                shared=_shared(count, count * common["intermediate_size"]))


def _deepseek_shared(f: _Fields, inter: int, default: int = 0) -> SharedExperts:
    _no_mlp_bias(f)
    count = f.int("n_shared_experts", default=default, minimum=0)
    return _shared(count, count * inter)


def _deepseek_v2_like(shared_default: int) -> Callable[[_Fields], dict[str, Any]]:
    """V2 softmax routing. Its released code scales by routed_scaling_factor only when it does not
    renormalise (transformers' port always scales and never renormalises; they agree for the
    released configs, which all have norm_topk_prob=false). DeepSeek-OCR(-2)'s language model is this."""
    def parse(f: _Fields) -> dict[str, Any]:
        f.choice("scoring_func", ("softmax",), "softmax")
        method = f.choice("topk_method", ("greedy", "group_limited_greedy"), "greedy")
        renorm = f.bool("norm_topk_prob", default=False)
        groups = (f.int("n_group"), f.int("topk_group")) if method == "group_limited_greedy" else (1, 1)
        routing = Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=renorm, num_groups=groups[0], topk_groups=groups[1],
                          routed_scaling_factor=1.0 if renorm else f.float("routed_scaling_factor", default=1.0))
        common = _common(f, ("n_routed_experts", "num_experts"), ("moe_intermediate_size",))
        return dict(common, activation=_activation(f), routing=routing,
                    shared=_deepseek_shared(f, common["intermediate_size"], shared_default))
    return parse


# ---- sigmoid scores, selection by score + correction bias, grouped top-k (DeepSeek-V3 and its kin) ---------
# Weights are the sigmoid scores of the chosen experts (never the bias), optionally renormalised, then scaled.

def _sigmoid(*, renormalize: bool, scale: float = 1.0, bias: bool = True, groups: tuple[int, int] = (1, 1)) -> Routing:
    return Routing(RoutingMethod.SIGMOID_GROUPED, renormalize=renormalize, num_groups=groups[0],
                   topk_groups=groups[1], routed_scaling_factor=scale, correction_bias=bias)


def _deepseek_v3_like(f: _Fields, *, renorm: bool, scale: float, groups: tuple[int, int] = (1, 1),
                      shared: int = 1, shared_inter: tuple[str, ...] = ("moe_intermediate_size",)) -> dict[str, Any]:
    """The DeepSeek-V3 MoE block under the key spellings of its many ports (Kimi and Bailing say
    num_experts / num_expert_group / moe_renormalize / num_shared_experts); `shared` is the default count."""
    f.choice("scoring_func", ("sigmoid",), "sigmoid")
    f.choice("topk_method", ("noaux_tc",), "noaux_tc")
    common = _common(f, ("n_routed_experts", "num_local_experts", "num_experts"), ("moe_intermediate_size",))
    count = f.int("n_shared_experts", "num_shared_experts", default=shared, minimum=0)
    return dict(common, activation=_activation(f),
                routing=_sigmoid(renormalize=renorm, scale=scale, groups=groups),
                shared=_shared(count, count * f.int(*shared_inter)))


def _ds_groups(f: _Fields, n_group: int, topk_group: int) -> tuple[int, int]:
    return (f.int("n_group", "num_expert_group", default=n_group), f.int("topk_group", default=topk_group))


def _ds_renorm(f: _Fields, default: bool) -> bool:
    return f.bool("norm_topk_prob", "moe_renormalize", default=default)


def _deepseek_v3(f: _Fields) -> dict[str, Any]:
    """V3 sigmoid routing with the e_score_correction_bias used for selection only (also Kimi-K2.5's and
    Sarvam-MLA's language model)."""
    _no_mlp_bias(f)
    return _deepseek_v3_like(f, renorm=f.bool("norm_topk_prob"), scale=f.float("routed_scaling_factor"),
                             groups=(f.int("n_group"), f.int("topk_group")), shared=0)


def _ds_family(renorm: bool, scale: float, groups: tuple[int, int] = (1, 1)) -> Callable[[_Fields], dict[str, Any]]:
    """A DeepSeek-V3 port whose transformers config class defaults to these routing values."""
    def parse(f: _Fields) -> dict[str, Any]:
        return _deepseek_v3_like(f, renorm=_ds_renorm(f, renorm),
                                 scale=f.float("routed_scaling_factor", default=scale),
                                 groups=_ds_groups(f, *groups))
    return parse


def _dots3_note(f: _Fields) -> dict[str, Any]:
    """dots.3 note: the V3 block with the shared experts sized by shared_experts_intermediate_size."""
    return _deepseek_v3_like(f, renorm=_ds_renorm(f, True), scale=f.float("routed_scaling_factor", default=1.0),
                             groups=_ds_groups(f, 1, 1),
                             shared_inter=("shared_experts_intermediate_size", "moe_shared_expert_intermediate_size"))


def _param2moe(f: _Fields) -> dict[str, Any]:
    """Param2-MoE: GLM-4.5's block (transformers builds it with Glm4MoeForCausalLM). Its released code also reads
    score_function, moe_router_enable_expert_bias and moe_shared_expert_intermediate_size, which transformers'
    port ignores: a config without the correction bias routes without it, and one whose shared size is not
    n_shared_experts * moe_intermediate_size is refused."""
    f.choice("score_function", ("sigmoid",), "sigmoid")
    spec = _ds_family(True, 2.5)(f)
    spec["routing"] = replace(spec["routing"], correction_bias=f.bool("moe_router_enable_expert_bias", default=True))
    if spec["shared"].count:
        f.same("moe_shared_expert_intermediate_size", spec["shared"].intermediate_size,
               "transformers' Param2-MoE sizes its shared experts n_shared_experts * moe_intermediate_size")
    return spec


def _beam(f: _Fields) -> dict[str, Any]:
    """Beam: the V3 router without shared experts; it scales the routed output, which is the same."""
    spec = _deepseek_v3_like(f, renorm=_ds_renorm(f, True), scale=f.float("routed_scaling_factor", default=2.5),
                             groups=(f.int("n_group", default=8), f.int("topk_group", default=4)))
    spec["shared"] = SharedExperts()
    return spec


def _axk2(f: _Fields) -> dict[str, Any]:
    """A.X K2: the V3 block, but group-masked experts score 0 instead of being excluded, so a negative
    biased score can lose to a masked expert; only ungrouped configs are the V3 math."""
    groups, keep = f.data.get("n_group"), f.data.get("topk_group")
    if groups is not None and keep != groups:
        raise MoeBuildError("topk_group", f"{keep!r} of n_group={groups}: A.X K2 scores experts of dropped "
                            "groups 0 rather than excluding them, which moe-build does not implement",
                            "null (no grouping), or n_group")
    return _deepseek_v3_like(f, renorm=_ds_renorm(f, True), scale=f.float("routed_scaling_factor", default=2.5))


def _mimo_v2_flash(f: _Fields) -> dict[str, Any]:
    """MiMo-V2-Flash: the V3 router without shared experts (a null scaling factor means 1)."""
    spec = _deepseek_v3_like(f, renorm=_ds_renorm(f, True), scale=f.float("routed_scaling_factor", default=1.0),
                             groups=_ds_groups(f, 1, 1))
    spec["shared"] = SharedExperts()
    return spec


def _afmoe(f: _Fields) -> dict[str, Any]:
    """AFMoE (Arcee Trinity): sigmoid + expert_bias selection, always renormalised, scaled by route_scale."""
    common = _common(f, ("num_experts",), ("moe_intermediate_size",))
    count = f.int("num_shared_experts", default=2, minimum=0)
    return dict(common, activation=_activation(f),
                routing=_sigmoid(renormalize=True, scale=f.float("route_scale", default=1.0)),
                shared=_shared(count, count * common["intermediate_size"]))


def _hy_v3(f: _Fields) -> dict[str, Any]:
    """HY-V3: sigmoid + expert_bias selection, always renormalised, scaled by router_scaling_factor."""
    _no_mlp_bias(f)
    common = _common(f, ("num_experts", "num_local_experts"), ("moe_intermediate_size",))
    count = f.int("num_shared_experts", default=1, minimum=0)
    return dict(common, activation=_activation(f),
                routing=_sigmoid(renormalize=True, scale=f.float("router_scaling_factor", default=2.826)),
                shared=_shared(count, count * common["intermediate_size"]))


def _minimax_m2(f: _Fields) -> dict[str, Any]:
    """MiniMax-M2: sigmoid + e_score_correction_bias selection, always renormalised, no shared expert."""
    f.choice("scoring_func", ("sigmoid",), "sigmoid")
    f.same("shared_intermediate_size", 0, "MiniMax's shared expert is not in transformers' MiniMax-M2 block")
    return dict(_common(f, ("num_local_experts", "num_experts"), ("intermediate_size",)), activation=_activation(f),
                routing=_sigmoid(renormalize=True, bias=f.bool("use_routing_bias", default=True)))


def _minimax_m3(f: _Fields) -> dict[str, Any]:
    """MiniMax-M3: the M2 router, scaled, with GPT-OSS's clamped SwiGLU in routed and shared experts alike
    (hidden_act is not used by either)."""
    common = _common(f, ("num_local_experts", "num_experts"), ("intermediate_size",))
    return dict(common, activation=Activation.SWIGLU_CLAMP,
                swiglu_alpha=f.float("swiglu_alpha", default=1.702), swiglu_limit=f.float("swiglu_limit", default=7.0),
                routing=_sigmoid(renormalize=True, scale=f.float("routed_scaling_factor", default=2.0)),
                shared=_shared(1, f.int("shared_intermediate_size", default=3072, minimum=0)))


def _laguna(f: _Fields) -> dict[str, Any]:
    """Laguna: sigmoid + correction bias, always renormalised, routed output scaled; a tanh softcap on the
    router logits or router weights applied to the input are not in the spec."""
    cap = f.data.get("moe_router_logit_softcapping")
    if cap not in (None, 0):
        raise MoeBuildError("moe_router_logit_softcapping", f"{cap!r}: a tanh softcap on the router logits is "
                            "not supported", "0")
    if f.bool("moe_apply_router_weight_on_input", default=False):
        raise MoeBuildError("moe_apply_router_weight_on_input", "router weights applied to the input before the "
                            "experts are not supported", "false")
    common = _common(f, ("num_experts", "num_local_experts"), ("moe_intermediate_size",))
    return dict(common, activation=_activation(f),
                routing=_sigmoid(renormalize=True, scale=f.float("moe_routed_scaling_factor", default=1.0)),
                shared=_shared(1, f.int("shared_expert_intermediate_size", default=512, minimum=0)))


def _lfm2_moe(f: _Fields) -> dict[str, Any]:
    """LFM2-MoE: sigmoid, optional expert_bias selection, optional renormalisation, scaling; experts are
    always SiLU-gated. Its renormalisation divides by (sum + 1e-6), below bf16 resolution of the weights
    unless the chosen sigmoid scores sum to under ~1e-3."""
    return dict(_common(f, ("num_experts",), ("moe_intermediate_size",)), activation=Activation.SWIGLU,
                routing=_sigmoid(renormalize=f.bool("norm_topk_prob", default=True),
                                 scale=f.float("routed_scaling_factor", default=1.0),
                                 bias=f.bool("use_expert_bias", default=True)))


def _flint(f: _Fields) -> dict[str, Any]:
    """Flint: top-k of the sigmoid scores (no bias), optionally renormalised, plus an ungated shared expert."""
    return dict(_common(f, ("num_experts",), ("moe_intermediate_size",)), activation=_activation(f),
                routing=_sigmoid(renormalize=f.bool("norm_topk_prob", default=True), bias=False),
                shared=_shared(1, f.int("shared_expert_intermediate_size", default=1024, minimum=0)))


def _step_layers(f: _Fields) -> list[int]:
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


def _step3p5(f: _Fields) -> dict[str, Any]:
    """Step-3.5 / Step-3.7: sigmoid + router_bias selection, renormalised, scaled by moe_router_scaling_factor,
    and a shared expert of share_expert_dim; hidden_act is always SiLU. Its routed and shared experts may clamp
    act(gate) and up with per-layer limits (swiglu_limits, swiglu_limits_shared); a clamp after the activation
    is not in the spec, so every MoE layer's limits must be unset (0 or null)."""
    _no_mlp_bias(f)
    moe_layers = _STEP_MOE_LAYERS(f)
    for key in ("swiglu_limits", "swiglu_limits_shared"):
        limits = f.data.get(key) or []
        if not isinstance(limits, list):
            raise MoeBuildError(key, f"must be a per-layer list, got {limits!r}", "a list of numbers or nulls")
        clamped = [i for i in moe_layers if i < len(limits) and limits[i]]
        if clamped:
            raise MoeBuildError(key, f"MoE layers {clamped} clamp after the activation, which is not supported",
                                "0 or null for every MoE layer")
    common = _common(f, ("n_routed_experts", "moe_num_experts", "num_local_experts"), ("moe_intermediate_size",),
                     _EXPERTS_PER_TOKEN + ("moe_top_k",))
    return dict(common, activation=Activation.SWIGLU,
                routing=_sigmoid(renormalize=True, scale=f.float("moe_router_scaling_factor", default=1.0)),
                shared=_shared(1, f.int("share_expert_dim", "share_expert_dims", default=1280, minimum=0)))


def _cohere2_moe(f: _Fields) -> dict[str, Any]:
    """Command A MoE: top-k on the logits, then softmax over the k or sigmoid (optionally renormalised); the
    shared experts are summed with the routed output, or averaged with it, which is not in the spec."""
    selection = f.choice("expert_selection_fn", ("softmax", "sigmoid"), "softmax")
    routing = Routing(RoutingMethod.TOPK_SOFTMAX) if selection == "softmax" else \
        _sigmoid(renormalize=f.bool("norm_topk_prob", default=True), bias=False)
    count = f.int("num_shared_experts", default=0, minimum=0)
    strategy = f.data.get("shared_expert_combination_strategy") or "average"
    if count and strategy != "sum":
        raise MoeBuildError("shared_expert_combination_strategy", f"{strategy!r}: averaging the shared and routed "
                            "outputs is not supported", "sum")
    common = _common(f, ("num_experts",), ("intermediate_size",))
    return dict(common, activation=_activation(f), routing=routing,
                shared=_shared(count, count * common["intermediate_size"]))


# ---- which decoder layers hold the MoE block ----------------------------------------------------------------

def _all_layers(f: _Fields) -> list[int]:
    return list(f.layers())


def _first_dense(key: str, default: int) -> Callable[[_Fields], list[int]]:
    """The first `key` layers are dense MLPs, the rest MoE."""
    def layers(f: _Fields) -> list[int]:
        first = f.int(key, default=default, minimum=0)
        return [i for i in f.layers() if i >= first]
    return layers


def _leading_dense(count: int) -> Callable[[_Fields], list[int]]:
    """The first `count` layers are dense MLPs, whatever the config says (its config class has no key for it)."""
    def layers(f: _Fields) -> list[int]:
        return [i for i in f.layers() if i >= count]
    return layers


def _layer_types(default: Callable[[_Fields], list[int]]) -> Callable[[_Fields], list[int]]:
    """`mlp_layer_types` ("dense" / "sparse" per layer), as transformers writes it; configs without it get the
    layout their config class derives."""
    def layers(f: _Fields) -> list[int]:
        kinds = f.data.get("mlp_layer_types")
        if kinds is None:
            return default(f)
        n = len(f.layers())
        if not isinstance(kinds, list) or len(kinds) != n or any(k not in ("dense", "sparse") for k in kinds):
            raise MoeBuildError("mlp_layer_types", f"must list 'dense' or 'sparse' for each of the {n} layers",
                                "dense, sparse")
        return [i for i, kind in enumerate(kinds) if kind == "sparse"]
    return layers


def _required_layer_types(f: _Fields) -> list[int]:
    raise MoeBuildError("mlp_layer_types", "missing from the config (this family has no default layout)",
                        "a list of 'dense' / 'sparse' per layer")


def _qwen_layers(f: _Fields) -> list[int]:
    """Qwen-MoE: every decoder_sparse_step-th layer, minus mlp_only_layers."""
    step = f.int("decoder_sparse_step", default=1)
    dense = set(f.int_list("mlp_only_layers"))
    return [i for i in f.layers() if i not in dense and (i + 1) % step == 0]


def _flint_layers(f: _Fields) -> list[int]:
    """Flint: Qwen's rule, but an absent mlp_only_layers means [0, 1]."""
    return _qwen_layers(_Fields({"mlp_only_layers": [0, 1], **{k: v for k, v in f.data.items() if v is not None}}))


def _deepseek_layers(first_default: int) -> Callable[[_Fields], list[int]]:
    """DeepSeek: dense before first_k_dense_replace, then every moe_layer_freq-th layer (the released code
    honours moe_layer_freq; transformers' port assumes 1)."""
    def layers(f: _Fields) -> list[int]:
        first = f.int("first_k_dense_replace", default=first_default, minimum=0)
        freq = f.int("moe_layer_freq", default=1)
        return [i for i in f.layers() if i >= first and i % freq == 0]
    return layers


def _layer_freq(first_default: int) -> Callable[[_Fields], list[int]]:
    """first_k_dense_replace plus moe_layer_freq as an interval or as a per-layer 0/1 list."""
    def layers(f: _Fields) -> list[int]:
        first = f.int("first_k_dense_replace", default=first_default, minimum=0)
        freq = f.data.get("moe_layer_freq", 1)
        if isinstance(freq, list):
            return [i for i in f.layers() if i >= first and i < len(freq) and freq[i]]
        step = f.int("moe_layer_freq", default=1)
        return [i for i in f.layers() if i >= first and i % step == 0]
    return layers


def _layer_flags(f: _Fields) -> list[int]:
    """MiniMax-M3: an optional per-layer moe_layer_freq list (1: MoE), else every layer."""
    freq = f.data.get("moe_layer_freq")
    if freq is None:
        return list(f.layers())
    if not isinstance(freq, list):
        raise MoeBuildError("moe_layer_freq", f"must be a per-layer list, got {freq!r}", "a list of 0 / 1")
    return [i for i in f.layers() if i < len(freq) and freq[i]]


def _jamba_layers(f: _Fields) -> list[int]:
    """Jamba: layer i is MoE when i % expert_layer_period == expert_layer_offset (and there are experts)."""
    period, offset = f.int("expert_layer_period", default=2), f.int("expert_layer_offset", default=1, minimum=0)
    if f.int("num_experts", default=16) <= 1:
        return []
    return [i for i in f.layers() if i % period == offset]


def _granite_hybrid_layers(f: _Fields) -> list[int]:
    return list(f.layers()) if f.int("num_local_experts", default=8, minimum=0) else []


@dataclass(frozen=True)
class _Family:
    """How one model_type's config becomes a spec, and which decoder layers hold its MoE block."""

    parse: Callable[[_Fields], dict[str, Any]]
    layers: Callable[[_Fields], list[int]] = _all_layers
    text: tuple[str, ...] = ()  # path of the language model's sub-config in a multimodal config


def _multimodal(family: _Family, path: tuple[str, ...] = ("text_config",)) -> _Family:
    """`family` as the language model of a multimodal config, whose text sub-config sits at `path`."""
    return replace(family, text=path)


_ARIA = _Family(_aria)
_QWEN3_VL_MOE = _Family(_always_renormalised, _qwen_layers)
_QWEN3_OMNI_MOE = _Family(_norm_topk(True), _qwen_layers)
_QWEN3_5_MOE = _Family(_with_shared(_always_renormalised, 512))
_QWEN4_EXP = _Family(_with_shared(_norm_topk(True), 512))
_MISTRAL_LARGE4 = _Family(lambda f: _grouped_softmax(f, renormalize=True),
                          _layer_types(_first_dense("first_k_dense_replace", 1)))
_DEEPSEEK_OCR = _Family(_deepseek_v2_like(2), _layer_types(_required_layer_types))
_UNLIMITED_OCR = _Family(_deepseek_v2_like(2), _layer_types(_first_dense("first_k_dense_replace", 1)))
_DEEPSEEK_V3 = _Family(_deepseek_v3, _deepseek_layers(0))
_GLM4_MOE = _Family(_ds_family(True, 1.0), _first_dense("first_k_dense_replace", 1))
_DOTS3_NOTE = _Family(_dots3_note, _layer_types(_layer_freq(1)))
_MINIMAX_M3 = _Family(_minimax_m3, _layer_types(_layer_flags))
_GRANITE_SHARED = _Family(_with_shared(_mixtral, 0, gated=False, key="shared_intermediate_size"))
_STEP_MOE_LAYERS = _layer_types(_step_layers)
_STEP3P5 = _Family(_step3p5, _STEP_MOE_LAYERS)

_FAMILIES: dict[str, _Family] = {
    # top-k logits -> softmax over k
    "mixtral": _Family(_mixtral),
    "minimax": _Family(_minimax),
    "granitemoe": _Family(_mixtral),  # its shared-MLP variants are the next three
    "granitemoeshared": _GRANITE_SHARED,
    "granitemoe_swa": _GRANITE_SHARED,
    "granitemoehybrid": _Family(_with_shared(_mixtral, 1024, gated=False, key="shared_intermediate_size"),
                                 _granite_hybrid_layers),
    "aria_text": _ARIA,
    "aria": _multimodal(_ARIA),
    "hunyuan_v1_moe": _Family(_hunyuan_v1_moe),
    "gpt_oss": _Family(_gpt_oss),
    "openai_privacy_filter": _Family(_openai_privacy_filter),
    "cohere2_moe": _Family(_cohere2_moe, _layer_types(_first_dense("first_k_dense_replace", 0))),
    # softmax over all -> top-k
    "qwen2_moe": _Family(_with_shared(_norm_topk(False), 0), _qwen_layers),
    "qwen3_moe": _Family(_norm_topk(False), _qwen_layers),
    "qwen3_next": _Family(_with_shared(_norm_topk(True), 512), _qwen_layers),
    "qwen3_vl_moe": _multimodal(_QWEN3_VL_MOE),
    "qwen3_omni_moe": _multimodal(_QWEN3_OMNI_MOE, ("thinker_config", "text_config")),
    "qwen3_5_moe_text": _QWEN3_5_MOE,
    "qwen3_5_moe": _multimodal(_QWEN3_5_MOE),
    "qwen4_exp_text": _QWEN4_EXP,
    "qwen4_exp": _multimodal(_QWEN4_EXP),
    "olmoe": _Family(_norm_topk(False, "intermediate_size")),  # OLMoE has no dense MLP layers
    "flex_olmo": _Family(_norm_topk(False, "intermediate_size")),
    "mellum": _Family(_norm_topk(True), _layer_types(_all_layers)),
    "lara_mini": _Family(_with_shared(_norm_topk(True), 512, gated=False)),
    "jamba": _Family(lambda f: _softmax_topk(f, "intermediate_size", False), _jamba_layers),
    "dbrx": _Family(_dbrx),
    "mistral4": _Family(lambda f: _grouped_softmax(f, renormalize=f.bool("norm_topk_prob", default=True)),
                        _first_dense("first_k_dense_replace", 0)),
    "mistral_large4": _multimodal(_MISTRAL_LARGE4),
    "deepseek_v2": _Family(_deepseek_v2_like(0), _deepseek_layers(0)),
    "deepseek_ocr2": _multimodal(_DEEPSEEK_OCR),
    "unlimited_ocr": _multimodal(_UNLIMITED_OCR),
    # sigmoid + correction bias, grouped top-k
    "deepseek_v3": _DEEPSEEK_V3,
    "kimi_k25": _multimodal(_DEEPSEEK_V3),
    "sarvam_mla": _Family(_ds_family(True, 2.5), _deepseek_layers(1)),
    "deepseek_v32": _Family(_ds_family(True, 2.5, (8, 4)), _layer_types(_first_dense("first_k_dense_replace", 3))),
    "glm_moe_dsa": _Family(_ds_family(True, 2.5), _layer_types(_first_dense("first_k_dense_replace", 3))),
    "glm4_moe": _GLM4_MOE,
    "glm4v_moe": _multimodal(_GLM4_MOE),
    "sarvam_moe": _Family(_ds_family(True, 2.5), _first_dense("first_k_dense_replace", 1)),
    "glm4_moe_lite": _Family(_ds_family(True, 1.8), _layer_types(_leading_dense(1))),
    "dots1": _Family(_ds_family(False, 1.0), _first_dense("first_k_dense_replace", 0)),
    "dots3_note_text": _DOTS3_NOTE,
    "dots3_note": _multimodal(_DOTS3_NOTE),
    "solar_open": _Family(_ds_family(True, 1.0)),
    "kimi_linear": _Family(_ds_family(True, 2.446), _layer_types(_first_dense("first_k_dense_replace", 1))),
    "bailing_hybrid": _Family(_ds_family(True, 2.5, (8, 4)), _layer_types(_first_dense("first_k_dense_replace", 2))),
    "mimo_v2_flash": _Family(_mimo_v2_flash, _layer_types(_leading_dense(1))),
    "exaone_moe": _Family(_ds_family(True, 2.5), _layer_types(_first_dense("first_k_dense_replace", 1))),
    "minicpm5_moe": _Family(_ds_family(True, 3.66), _layer_types(_first_dense("first_k_dense_replace", 1))),
    "param2moe": _Family(_param2moe, _first_dense("first_k_dense_replace", 1)),
    "beam": _Family(_beam, _layer_types(_leading_dense(3))),
    "axk2": _Family(_axk2, _layer_types(_layer_freq(1))),
    # sigmoid, other selection / scaling rules
    "afmoe": _Family(_afmoe, _first_dense("num_dense_layers", 1)),
    "hy_v3": _Family(_hy_v3, _layer_types(_leading_dense(1))),
    "minimax_m2": _Family(_minimax_m2),
    "minimax_m3_vl_text": _MINIMAX_M3,
    "minimax_m3_vl": _multimodal(_MINIMAX_M3),
    "laguna": _Family(_laguna, _layer_types(_leading_dense(1))),
    "lfm2_moe": _Family(_lfm2_moe, _first_dense("num_dense_layers", 2)),
    "flint": _Family(_flint, _flint_layers),
    "step3p5": _STEP3P5,
    "step3p7": _multimodal(_STEP3P5),
}
FAMILIES: tuple[str, ...] = tuple(_FAMILIES)

_CLAMPED_SILU = ("its experts clamp gate and up (swiglu_limit) around a plain SiLU gate, without GPT-OSS's "
                 "sigmoid(alpha * gate) and (up + 1)")
_SCALED_ROUTER = ("its router reads an RMS-normalised, learned-scale copy of the input and multiplies each chosen "
                  "expert's weight by a learned per-expert scale")
_JOINT_SHARED = ("its shared experts are weighted by the router together with the routed experts (log-sigmoid "
                 "scores normalised over both)")
_INPUT_SCALED = "its router score scales the input before the experts instead of the expert output"
_SOFTCAPPED = "its experts use a softcapped SwiGLU"
_MODALITY = ("text and image tokens go to separate expert sets, with a selection bias added to softmax "
             "probabilities")
_LOGIT_BIAS = "its correction bias is added to the raw router logits for selection, before the sigmoid"
_LATENT = ("its experts run in a projected latent space, with RMSNorms before the experts and on each expert's "
           "output")

# model_type -> (architecture, what its MoE block needs that MoESpec cannot say). Checked before any other key;
# the nested text model_types of refused multimodal models are listed too, so their configs say why as well.
REFUSED: dict[str, tuple[str, str]] = {
    "phimoe": ("Phi-3.5-MoE", "its router is sparsemixer (the second expert is picked after masking the first, "
               "each weighted by its own masked softmax), which moe-build does not implement"),
    "llama4": ("Llama 4", _INPUT_SCALED),
    "llama4_text": ("Llama 4", _INPUT_SCALED),
    "jetmoe": ("JetMoE", "its attention is a mixture of experts too (MoA), which moe-build does not build, and its "
               "MLP experts share one output bias added after the expert mix"),
    "ernie4_5_moe": ("ERNIE-4.5-MoE", "its selection bias (moe_statics.e_score_correction_bias) is added to "
                     "softmax probabilities; moe-build applies a correction bias only to sigmoid scores"),
    "ernie4_5_vl_moe": ("ERNIE-4.5-VL-MoE", _MODALITY),
    "ernie4_5_vl_moe_text": ("ERNIE-4.5-VL-MoE", _MODALITY),
    "kolibri1": ("Kolibri-1", _LOGIT_BIAS),
    "kolibri1_1": ("Kolibri-1.1", _LOGIT_BIAS),
    "longcat_flash": ("LongCat-Flash", "zero-computation (identity) experts are routed like real experts"),
    "deepseek_v4": ("DeepSeek-V4", f"{_CLAMPED_SILU}, and its first layers route by a token-id hash table"),
    "hy_v4": ("HY-V4", _CLAMPED_SILU),
    "hy_v4_vl": ("HY-V4-VL", _CLAMPED_SILU),
    "hy_v4_vl_text": ("HY-V4-VL", _CLAMPED_SILU),
    "glm5_next": ("GLM-5-Next", _CLAMPED_SILU),
    "glm5_next_text": ("GLM-5-Next", _CLAMPED_SILU),
    "gemma4": ("Gemma 4", _SCALED_ROUTER),
    "gemma4_text": ("Gemma 4", _SCALED_ROUTER),
    "diffusion_gemma": ("DiffusionGemma", _SCALED_ROUTER),
    "diffusion_gemma_text": ("DiffusionGemma", _SCALED_ROUTER),
    "inkling_mm_model": ("Inkling", _JOINT_SHARED),
    "inkling_text": ("Inkling", _JOINT_SHARED),
    "inkling2": ("Inkling-2", _SOFTCAPPED),
    "inkling2_text": ("Inkling-2", _SOFTCAPPED),
    "inkling2_loop": ("Inkling-2-Loop", _SOFTCAPPED),
    "inkling2_loop_text": ("Inkling-2-Loop", _SOFTCAPPED),
    "axk1": ("A.X K1", "its MoE block ends in an RMSNorm of the combined output (post_mlp_layernorm)"),
    "muse_spark": ("Muse Spark", _LATENT),
    "muse_spark_text": ("Muse Spark", _LATENT),
    "ergo": ("Ergo", "its experts are ungated squared-ReLU (relu2) MLPs whose outputs each go through the expert's "
             "own learned RMSNorm before the weighted sum (the shared expert's too)"),
    "nemotron_h": ("Nemotron-H", "its experts are ungated squared-ReLU (relu2) MLPs, optionally in a projected "
                   "latent space"),
    "doge": ("Doge", "product-key routing over single-neuron embedding experts (cross-domain MoE)"),
    "zaya": ("ZAYA", "an MLP router with a skip (null) expert and router state carried across layers"),
    "nllb-moe": ("NLLB-MoE", "its top-2 router drops tokens beyond each expert's capacity and may sample the second "
                 "expert (second_expert_policy)"),
    "switch_transformers": ("Switch Transformers", "its top-1 router drops tokens beyond each expert's capacity "
                            "(expert_capacity)"),
    "vitpose_backbone": ("ViTPose++", "its experts are chosen by a dataset index, not routed per token"),
}


# ---- FP8 checkpoints: quant and act_scale from the producer's quantization description ------------------------

MODELOPT_CONFIG = "hf_quant_config.json"  # NVIDIA ModelOpt's description, beside config.json
_Fp8 = tuple[Quant, ActScale]
_BLOCK = [128, 128]                        # the one weight block moe-build's FP8 kernels scale by


def _fp8_method(q: Mapping[str, Any]) -> _Fp8:
    """quant_method "fp8": DeepSeek-V3 and the Qwen3 -FP8 releases ({"quant_method": "fp8", "fmt": "e4m3",
    "weight_block_size": [128, 128], "activation_scheme": "dynamic"}); without weight_block_size (or null) one
    scale per weight matrix, as vLLM reads AutoFP8 checkpoints, with static or dynamic activations."""
    g = _Fields(q)
    if q.get("fmt") is not None:
        g.choice("fmt", ("e4m3",))
    if q.get("expert_dtype") is not None:
        g.choice("expert_dtype", ("fp8",))
    act = ActScale(g.choice("activation_scheme", ("dynamic", "static"), default="dynamic"))
    block = q.get("weight_block_size")
    if block is None:
        return Quant.FP8, act
    if not isinstance(block, (list, tuple)) or list(block) != _BLOCK:
        raise MoeBuildError("weight_block_size", f"{block!r}: moe-build's FP8 kernels scale 128 x 128 weight blocks",
                            "[128, 128], null (one scale per matrix)")
    if act is ActScale.STATIC:
        raise MoeBuildError("activation_scheme", "static with 128 x 128 weight blocks: fp8_block quantizes "
                            "activations per 1 x 128 group at run time", "dynamic")
    return Quant.FP8_BLOCK, ActScale.DYNAMIC


# ModelOpt's FP8 algorithms: FP8 is per-tensor weights with calibrated input scales; FP8_PER_CHANNEL_PER_TOKEN
# is per-row weight scales with dynamic per-token activations.
_MODELOPT_FP8: dict[str, _Fp8] = {"FP8": (Quant.FP8, ActScale.STATIC),
                                  "FP8_PER_CHANNEL_PER_TOKEN": (Quant.FP8, ActScale.DYNAMIC)}


def _modelopt(q: Mapping[str, Any]) -> _Fp8 | None:
    """NVIDIA ModelOpt (`quant_algo`); None for its algorithms without FP8. Its other FP8 algorithms (block-wise
    weight-only, FP8 mixed with FP4 or INT4, MXFP8) are refused."""
    algo = q.get("quant_algo")
    if isinstance(algo, str) and algo in _MODELOPT_FP8:
        return _MODELOPT_FP8[algo]
    layers = q.get("quantized_layers") if algo == "MIXED_PRECISION" else None
    algos = [v.get("quant_algo") for v in layers.values() if isinstance(v, Mapping)] \
        if isinstance(layers, Mapping) else [algo]
    if any(isinstance(a, str) and "FP8" in a.upper() for a in algos):
        raise MoeBuildError("quant_algo", f"{algo!r} is not an FP8 scheme moe-build runs", list(_MODELOPT_FP8))
    return None


def _is_float8(args: Any) -> bool:
    return isinstance(args, Mapping) and args.get("type") == "float" and args.get("num_bits") == 8


def _ct_weights(w: Mapping[str, Any]) -> Quant:
    """compressed-tensors weight args of an FP8 group (key names relative to it, for the caller to prefix)."""
    if not _is_float8(w):
        raise MoeBuildError("num_bits", f"{w.get('num_bits')}-bit {w.get('type')} weights with FP8 activations",
                            "8-bit float weights")
    _Fields(w).same("symmetric", True, "FP8 weights carry no zero point")
    _Fields(w).same("dynamic", False, "FP8 weights are quantized ahead of time")
    strategy = _Fields(w).choice("strategy", ("tensor", "channel", "block"))
    if strategy != "block":
        return Quant.FP8
    if list(w.get("block_structure") or ()) != _BLOCK:
        raise MoeBuildError("block_structure", f"{w.get('block_structure')!r}: moe-build's FP8 kernels scale "
                            "128 x 128 weight blocks", "[128, 128]")
    return Quant.FP8_BLOCK


def _ct_activations(a: Mapping[str, Any], quant: Quant) -> ActScale:
    """compressed-tensors input activation args: static per tensor, dynamic per token (per-tensor and per-channel
    weights) or dynamic per 1 x 128 group (block weights), the schemes moe-build's FP8 kernels compute."""
    if not _is_float8(a):
        raise MoeBuildError("num_bits", f"{a.get('num_bits')}-bit {a.get('type')} activations", "8-bit float")
    f = _Fields(a)
    f.same("symmetric", True, "FP8 activations carry no zero point")
    dynamic = f.bool("dynamic")
    if quant is Quant.FP8_BLOCK:
        f.same("dynamic", True, "block weights go with activations quantized per 1 x 128 group at run time")
        f.same("group_size", 128, "activations are quantized per 1 x 128 group")
    strategy, why = (("group", "activations of 128 x 128 block weights are scaled per 1 x 128 group")
                     if quant is Quant.FP8_BLOCK else
                     ("token", "dynamic activation scales are per token") if dynamic else
                     ("tensor", "static activation scales are one per tensor"))
    if a.get("strategy") != strategy:
        raise MoeBuildError("strategy", f"{a.get('strategy')!r}: moe-build's {why}", strategy)
    return ActScale.DYNAMIC if dynamic else ActScale.STATIC


def _compressed_tensors(q: Mapping[str, Any]) -> _Fp8 | None:
    """compressed-tensors / llm-compressor: one config group of 8-bit float weights and activations stored
    `float-quantized`; None when no group quantizes to 8-bit float. Several groups are refused, since moe-build
    would have to match their targets to module names to know which one the experts follow."""
    groups = q.get("config_groups") or {}
    if not isinstance(groups, Mapping):
        raise MoeBuildError("config_groups", f"must be an object, got {groups!r}", "an object of groups")
    fp8 = [name for name, g in groups.items() if isinstance(g, Mapping) and  # int weights: woq_config's W4AFP8
           (_is_float8(g.get("weights")) or (_is_float8(g.get("input_activations")) and not is_int(g.get("weights"))))]
    if not fp8:
        return None
    if len(groups) > 1:
        raise MoeBuildError("config_groups", f"{len(groups)} groups ({', '.join(groups)}): moe-build reads one FP8 "
                            "scheme for every expert", "one config group")
    group = groups[fp8[0]]
    fmt = group.get("format") or q.get("format")
    if fmt != "float-quantized":
        raise MoeBuildError("format", f"{fmt!r} is not how compressed-tensors stores FP8 weights", "float-quantized")
    _Fields(q).same("quantization_status", "compressed", "the weights are stored unquantized")
    with _prefixed(f"config_groups.{fp8[0]}"):
        if group.get("output_activations") is not None:
            raise MoeBuildError("output_activations", "quantized layer outputs are not supported", "null")
        if not isinstance(group.get("weights"), Mapping):
            raise MoeBuildError("weights", "absent: FP8 activations with unquantized weights", "8-bit float weights")
        with _prefixed("weights"):
            quant = _ct_weights(group["weights"])
        if not isinstance(group.get("input_activations"), Mapping):
            raise MoeBuildError("input_activations", "absent: weight-only FP8 (16-bit activations) is not run by "
                                "moe-build's FP8 kernels", "8-bit float input_activations")
        with _prefixed("input_activations"):
            act = _ct_activations(group["input_activations"], quant)
    return quant, act


_FP8_METHODS: dict[str, Callable[[Mapping[str, Any]], _Fp8 | None]] = {
    "fp8": _fp8_method, "modelopt": _modelopt, "compressed-tensors": _compressed_tensors}


def _refused_fbgemm(q: Mapping[str, Any]) -> _Fp8:
    raise MoeBuildError("quant_method", "'fbgemm_fp8' clamps its dynamic activation scales "
                        "(activation_scale_ub), which moe-build's FP8 kernels do not", list(_FP8_METHODS))


_QUANT_METHODS = {**_FP8_METHODS, "fbgemm_fp8": _refused_fbgemm}


@contextmanager
def _prefixed(prefix: str) -> Iterator[None]:
    """Name the keys a parser reports by their path from where it looked (quantization_config.fmt)."""
    try:
        yield
    except MoeBuildError as exc:
        raise MoeBuildError(f"{prefix}.{exc.field}", exc.problem, exc.allowed) from None


def _modelopt_file(source: ConfigSource) -> dict[str, Any] | None:
    """ModelOpt's hf_quant_config.json beside config.json, when the config came from a file and it is there."""
    if isinstance(source, Mapping):
        return None
    path = Path(source)
    path = (path if path.is_dir() else path.parent) / MODELOPT_CONFIG
    return read_json_object(path, MODELOPT_CONFIG) if path.is_file() else None


def _fp8_quant(data: Mapping[str, Any], family: str, source: ConfigSource) -> _Fp8 | None:
    """(quant, act_scale) of an FP8 checkpoint from its quantization_config (top level, else the language
    model's sub-config) or ModelOpt's hf_quant_config.json; None for an unquantized checkpoint or another
    quantization, which leaves the spec's quant none as before."""
    text = _text_fields(data, family).data
    path = ".".join((*_FAMILIES[family].text, "quantization_config"))
    for where, q in (("quantization_config", data.get("quantization_config")),
                     (path, text.get("quantization_config"))):
        if q is None:
            continue
        if not isinstance(q, Mapping):
            raise MoeBuildError(where, f"must be an object, got {q!r}", "an object")
        method = q.get("quant_method")
        parse = _QUANT_METHODS.get(method) if isinstance(method, str) else None
        with _prefixed(where):
            return None if parse is None else parse(q)
    stored = _modelopt_file(source)
    if stored is None:
        return None
    q = stored.get("quantization")
    with _prefixed(f"{MODELOPT_CONFIG} quantization"):
        if not isinstance(q, Mapping):
            raise MoeBuildError("quant_algo", "missing: no quantization object", "an object with quant_algo")
        return _modelopt(q)


def _woq_quant(data: Mapping[str, Any], family: str, source: ConfigSource) -> Woq | None:
    """(quant, group size, act_scale) of a weight-only quantized checkpoint (spec/woq_config.py), read from the same
    places as `_fp8_quant`; None where the checkpoint is not weight-only quantized."""
    text = _text_fields(data, family).data
    path = ".".join((*_FAMILIES[family].text, "quantization_config"))
    for where, q in (("quantization_config", data.get("quantization_config")),
                     (path, text.get("quantization_config"))):
        if isinstance(q, Mapping):
            with _prefixed(where):
                return woq_description(q)
    stored = _modelopt_file(source)
    q = None if stored is None else stored.get("quantization")
    if not isinstance(q, Mapping):
        return None
    with _prefixed(f"{MODELOPT_CONFIG} quantization"):
        return woq_description(q, modelopt_file=True)


def _family(data: Mapping[str, Any]) -> str:
    model_type = data.get("model_type")
    if model_type is None:
        raise MoeBuildError("model_type", "missing from the config", FAMILIES)
    if not isinstance(model_type, str):
        raise MoeBuildError("model_type", f"must be a string, got {model_type!r}", FAMILIES)
    if model_type in REFUSED:
        arch, missing = REFUSED[model_type]
        raise MoeBuildError("model_type", f"{model_type!r} ({arch}) is not supported: {missing}", FAMILIES)
    if model_type not in _FAMILIES:
        raise MoeBuildError("model_type", f"{model_type!r} is not a supported MoE model", FAMILIES)
    return model_type


def _text_fields(data: Mapping[str, Any], family: str) -> _Fields:
    """The fields of the config that describes the MoE layers: the config itself, or its language model's
    sub-config, which inherits the top-level dtype when it states none."""
    path = _FAMILIES[family].text
    if not path:
        return _Fields(data)
    text: Any = data
    for i, key in enumerate(path):
        text = text.get(key) if isinstance(text, Mapping) else None
        if not isinstance(text, Mapping):
            raise MoeBuildError(".".join(path[:i + 1]), "missing from the config", "an object")
    dtype = {k: data[k] for k in ("dtype", "torch_dtype") if data.get(k) is not None}
    return _Fields(text if _Fields(text).first("dtype", "torch_dtype") else {**text, **dtype})


def _name(data: Mapping[str, Any], source: ConfigSource, family: str) -> str:
    """The checkpoint's own name when known (hub id or folder), else the family."""
    if data.get("_name_or_path"):
        return str(data["_name_or_path"]).rstrip("/").split("/")[-1]
    if not isinstance(source, Mapping):
        path = Path(source)
        return (path if path.is_dir() else path.parent).resolve().name
    return family


# MoESpec's own checks name spec fields; report them under the config key the user can fix.
_CONFIG_KEYS = {"top_k": _EXPERTS_PER_TOKEN + ("moe_topk", "moe_top_k"),
                "num_groups": ("n_group", "num_expert_group"), "topk_groups": ("topk_group",)}


def _config_key(data: Mapping[str, Any], field: str) -> str:
    """The config key behind spec field `field` (DBRX nests its expert keys in ffn_config)."""
    for key in _CONFIG_KEYS.get(field, ()):
        if key in data:
            return key
        if isinstance(data.get("ffn_config"), Mapping) and key in data["ffn_config"]:
            return f"ffn_config.{key}"
    return field


@contextmanager
def _keys_of(family: str) -> Iterator[None]:
    """Name the keys of a multimodal config's language model by their full path (text_config.num_experts)."""
    try:
        yield
    except MoeBuildError as exc:
        path = _FAMILIES[family].text
        if not path:
            raise
        raise MoeBuildError(".".join((*path, exc.field)), exc.problem, exc.allowed) from None


def spec_from_hf_config(config: ConfigSource) -> MoESpec:
    """The MoESpec of one MoE layer of a Hugging Face MoE model (all its MoE layers are alike)."""
    data = load_config(config)
    family = _family(data)
    moe_layer_indices(data)  # a config whose layers are all dense is not an MoE model
    fields = _text_fields(data, family)
    fp8 = _fp8_quant(data, family, config)
    quant = {} if fp8 is None else dict(quant=fp8[0], act_scale=fp8[1])
    woq = None if fp8 is not None else _woq_quant(data, family, config)
    if woq is not None:
        quant = dict(quant=woq[0], quant_group_size=woq[1], act_scale=woq[2], **woq[3])
    with _keys_of(family):
        spec = _FAMILIES[family].parse(fields)
        try:
            return MoESpec(**spec, **quant, family=family, name=_name(data, config, family))
        except MoeBuildError as exc:
            raise MoeBuildError(_config_key(fields.data, exc.field), exc.problem, exc.allowed) from None


def moe_layer_indices(config: ConfigSource) -> list[int]:
    """Decoder layers whose MLP is the MoE block (the others are dense MLPs)."""
    data = load_config(config)
    family = _family(data)
    fields = _text_fields(data, family)
    with _keys_of(family):
        indices = _FAMILIES[family].layers(fields)
        if not indices:
            raise MoeBuildError("num_hidden_layers", "no decoder layer is an MoE layer, so this is not an MoE model",
                                "a config with at least one MoE layer")
    return indices


def select_moe_layers(config: ConfigSource, layer: int | None, all_layers: bool) -> list[int]:
    """The decoder layers a command works on: every MoE layer, decoder layer `layer` (refused unless
    it is an MoE layer), or the first MoE layer. Reads only the config, so a wrong `layer` is
    refused before any weight is read."""
    indices = moe_layer_indices(config)
    if all_layers:
        return indices
    if layer is None:
        return indices[:1]
    if layer not in indices:
        raise MoeBuildError("layer", f"decoder layer {layer} is not an MoE layer of {config}", indices)
    return [layer]
