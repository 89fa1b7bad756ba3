"""Each MoE family's config -> the MoESpec's fields, one parser per family, and the families refused by name.

Each family spells the same facts differently (expert count, routing, shared experts), so the
mapping is decided here once and the rest of moe-build reads only MoESpec. Where a family's
released code and transformers' port disagree, the released checkpoints' own code wins (noted
at the place it matters). A family whose MoE block needs math that MoESpec cannot say is refused
by name (`REFUSED`), and so is a supported family's config that switches such math on: an accepted
checkpoint never computes silently different math.

A multimodal family's `text` is the path of its language model's sub-config, whose MoE layer is the spec
(hf_config.py reads the fields there).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from ..errors import MoeBuildError
from .config_fields import ConfigFields
from .layer import Activation, DType, Routing, RoutingMethod, SharedExperts
from .moe_layers import (all_layers, deepseek_layers, first_dense, flint_layers, granite_hybrid_layers, jamba_layers,
                         layer_flags, layer_freq, layer_types, leading_dense, qwen_layers, required_layer_types,
                         step_layers)

_DTYPES = {"float32": DType.FP32, "float16": DType.FP16, "bfloat16": DType.BF16}
# Gated activations only: every supported family feeds act(gate) * up. The gelu entries are the
# tanh approximation, the variant the fused TensorRT-LLM kernels implement (FtGelu).
_ACTIVATIONS = {"silu": Activation.SWIGLU, "swish": Activation.SWIGLU,
                "gelu_pytorch_tanh": Activation.GEGLU, "gelu_new": Activation.GEGLU}
EXPERTS_PER_TOKEN = ("num_experts_per_tok", "experts_per_token", "num_experts_per_token")


def _dtype(f: ConfigFields) -> DType:
    """`dtype` (transformers 5) or `torch_dtype` (4.x); absent means bf16, the dtype of every released MoE."""
    hit = f.first("dtype", "torch_dtype")
    if hit is None:
        return DType.BF16
    key, value = hit
    name = str(value).removeprefix("torch.")
    if name not in _DTYPES:
        raise MoeBuildError(key, f"{value!r} is not a model dtype moe-build builds", list(_DTYPES))
    return _DTYPES[name]


def _activation(f: ConfigFields, key: str = "hidden_act", default: str = "silu") -> Activation:
    value = f.data.get(key) or default
    if not isinstance(value, str) or value not in _ACTIVATIONS:
        raise MoeBuildError(key, f"{value!r} is not supported for MoE experts", list(_ACTIVATIONS))
    return _ACTIVATIONS[value]


def _common(f: ConfigFields, experts: tuple[str, ...], inter: tuple[str, ...],
            top_k: tuple[str, ...] = EXPERTS_PER_TOKEN) -> dict[str, Any]:
    """Fields every family has, read under that family's key names."""
    return dict(hidden_size=f.int("hidden_size"), intermediate_size=f.int(*inter),
                num_experts=f.int(*experts), top_k=f.int(*top_k), dtype=_dtype(f))


def _shared(count: int, intermediate_size: int, sigmoid_gate: bool = False) -> SharedExperts:
    """`count` always-on experts of `intermediate_size` in total; a zero count or size means none."""
    if not count or not intermediate_size:
        return SharedExperts()
    return SharedExperts(count=count, intermediate_size=intermediate_size, sigmoid_gate=sigmoid_gate)


def _no_mlp_bias(f: ConfigFields, key: str = "mlp_bias") -> None:
    if f.bool(key, default=False):
        raise MoeBuildError(key, "shared-expert biases are not supported", "false")


# ---- top-k on the logits, softmax over the k (Mixtral, MiniMax, Granite-MoE, Aria, HunYuan) ----------------
# A softmax over all experts renormalised over the chosen k equals a softmax over the k chosen logits.

def _mixtral(f: ConfigFields) -> dict[str, Any]:
    return dict(_common(f, ("num_local_experts", "num_experts"), ("intermediate_size",)),
                activation=_activation(f), routing=Routing(RoutingMethod.TOPK_SOFTMAX))


def _minimax(f: ConfigFields) -> dict[str, Any]:
    """MiniMax-Text-01: Mixtral's block. Its released code adds a shared expert when shared_intermediate_size
    is set; transformers' port has none, so such a config is refused rather than built without it."""
    f.same("shared_intermediate_size", 0, "MiniMax's shared expert is not in transformers' MiniMax block")
    return _mixtral(f)


def _aria(f: ConfigFields) -> dict[str, Any]:
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


def _per_layer(f: ConfigFields, key: str) -> Any:
    """HunYuan lets some keys be per-layer lists; one spec serves every layer, so the list must be uniform."""
    value = f.data.get(key)
    if isinstance(value, list):
        if not value or any(v != value[0] for v in value):
            raise MoeBuildError(key, f"differs between layers ({value!r}); moe-build builds one layer spec "
                                "for all MoE layers", "one value, or a list of equal values")
        return value[0]
    return value


def _hunyuan_v1_moe(f: ConfigFields) -> dict[str, Any]:
    """HunYuan-A13B: softmax top-k renormalised, one shared MLP of intermediate_size. transformers' port sizes
    routed and shared experts by intermediate_size; the released keys that would size them otherwise must
    agree with it."""
    per_layer = {k: _per_layer(f, k) for k in ("num_experts", "moe_topk", "moe_intermediate_size",
                                               "num_shared_expert")}
    g = ConfigFields({**f.data, **{k: v for k, v in per_layer.items() if v is not None}})
    inter = g.int("intermediate_size")
    g.same("moe_intermediate_size", inter, "transformers' HunYuan experts use intermediate_size")
    g.same("num_shared_expert", 1, "transformers' HunYuan block has exactly one shared MLP")
    g.same("use_mixed_mlp_moe", True, "transformers' HunYuan block always adds the shared MLP")
    return dict(_common(g, ("num_experts", "num_local_experts"), ("intermediate_size",),
                        ("moe_topk", "num_experts_per_tok")),
                activation=_activation(g), routing=Routing(RoutingMethod.TOPK_SOFTMAX), shared=_shared(1, inter))


def _openai_privacy_filter(f: ConfigFields) -> dict[str, Any]:
    """OpenAI privacy filter: GPT-OSS's biased router and clamped SwiGLU experts (gate/up not interleaved).
    Its scores are divided by top_k and the block output multiplied by top_k again, which cancels."""
    return dict(_common(f, ("num_local_experts", "num_experts"), ("intermediate_size",)),
                activation=Activation.SWIGLU_CLAMP, expert_bias=True,
                routing=Routing(RoutingMethod.TOPK_SOFTMAX, router_bias=True),
                swiglu_alpha=f.float("swiglu_alpha", default=1.702), swiglu_limit=f.float("swiglu_limit", default=7.0))


def _gpt_oss(f: ConfigFields) -> dict[str, Any]:
    """GPT-OSS: fixed clamped SwiGLU (hidden_act is not used by its experts), biased router and experts."""
    return dict(_common(f, ("num_local_experts", "num_experts"), ("intermediate_size",)),
                activation=Activation.SWIGLU_CLAMP, expert_bias=True,
                routing=Routing(RoutingMethod.TOPK_SOFTMAX, router_bias=True),
                swiglu_alpha=f.float("swiglu_alpha", default=1.702), swiglu_limit=f.float("swiglu_limit"))


# ---- softmax over all experts, then top-k, optionally renormalised (Qwen-MoE, OLMoE, Jamba, DBRX) ----------

def _softmax_topk(f: ConfigFields, inter: str, renormalize: bool) -> dict[str, Any]:
    return dict(_common(f, ("num_experts", "num_local_experts"), (inter,)), activation=_activation(f),
                routing=Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=renormalize))


def _norm_topk(default: bool, inter: str = "moe_intermediate_size") -> Callable[[ConfigFields], dict[str, Any]]:
    """Renormalised when norm_topk_prob says so; `default` is the config class's (false for Qwen2/3-MoE and
    OLMoE, true for the later Qwen and Mellum)."""
    def parse(f: ConfigFields) -> dict[str, Any]:
        return _softmax_topk(f, inter, f.bool("norm_topk_prob", default=default))
    return parse


def _with_shared(parse: Callable[[ConfigFields], dict[str, Any]], default: int, gated: bool = True,
                 key: str = "shared_expert_intermediate_size") -> Callable[[ConfigFields], dict[str, Any]]:
    """Plus Qwen2-MoE's shared expert of `key`'s size, its output scaled by sigmoid(x @ w_gate)
    (Lara-mini's has no gate). Granite-MoE-Shared, -Hybrid and -SWA: an ungated shared MLP of
    shared_intermediate_size beside the block in the decoder layer, reading the same input, so
    layer output = routed + shared (the residual multiplier acts outside)."""
    def parse_shared(f: ConfigFields) -> dict[str, Any]:
        spec = parse(f)
        spec["shared"] = _shared(1, f.int(key, default=default, minimum=0), sigmoid_gate=gated)
        return spec
    return parse_shared


def _always_renormalised(f: ConfigFields) -> dict[str, Any]:
    """Qwen3-VL-MoE and Qwen3.5-MoE: the router always renormalises (they have no norm_topk_prob)."""
    return _softmax_topk(f, "moe_intermediate_size", True)


def _dbrx(f: ConfigFields) -> dict[str, Any]:
    """DBRX: the expert fields sit in `ffn_config`. Top-k weights are divided by their p-norm with
    p = moe_normalize_expert_weights; p = 1 is renormalisation, any other p is not in the spec."""
    ffn = f.data.get("ffn_config")
    if not isinstance(ffn, Mapping):
        raise MoeBuildError("ffn_config", "missing from the config", "an object")
    g = ConfigFields(ffn)
    p = ffn.get("moe_normalize_expert_weights", 1.0)
    if p is not None and (isinstance(p, bool) or p != 1):
        raise MoeBuildError("ffn_config.moe_normalize_expert_weights", f"{p!r}: dividing the top-k weights by "
                            "their p-norm for p != 1 is not supported", "1, null")
    act = ffn.get("ffn_act_fn") or {}
    key = "ffn_config.ffn_act_fn.name"
    activation = _activation(ConfigFields({key: act.get("name") if isinstance(act, Mapping) else act}), key)
    return dict(hidden_size=f.int("d_model", "hidden_size"), intermediate_size=g.int("ffn_hidden_size"),
                num_experts=g.int("moe_num_experts"), top_k=g.int("moe_top_k"), dtype=_dtype(f),
                activation=activation, routing=Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=p is not None))


def _grouped_softmax(f: ConfigFields, renormalize: bool) -> dict[str, Any]:
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


def _deepseek_shared(f: ConfigFields, inter: int, default: int = 0) -> SharedExperts:
    _no_mlp_bias(f)
    count = f.int("n_shared_experts", default=default, minimum=0)
    return _shared(count, count * inter)


def _deepseek_v2_like(shared_default: int) -> Callable[[ConfigFields], dict[str, Any]]:
    """V2 softmax routing. Its released code scales by routed_scaling_factor only when it does not
    renormalise (transformers' port always scales and never renormalises; they agree for the
    released configs, which all have norm_topk_prob=false). DeepSeek-OCR(-2)'s language model is this."""
    def parse(f: ConfigFields) -> dict[str, Any]:
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


def _deepseek_v3_like(f: ConfigFields, *, renorm: bool, scale: float, groups: tuple[int, int] = (1, 1),
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


def _ds_groups(f: ConfigFields, n_group: int, topk_group: int) -> tuple[int, int]:
    return (f.int("n_group", "num_expert_group", default=n_group), f.int("topk_group", default=topk_group))


def _ds_renorm(f: ConfigFields, default: bool) -> bool:
    return f.bool("norm_topk_prob", "moe_renormalize", default=default)


def _deepseek_v3(f: ConfigFields) -> dict[str, Any]:
    """V3 sigmoid routing with the e_score_correction_bias used for selection only (also Kimi-K2.5's and
    Sarvam-MLA's language model)."""
    _no_mlp_bias(f)
    return _deepseek_v3_like(f, renorm=f.bool("norm_topk_prob"), scale=f.float("routed_scaling_factor"),
                             groups=(f.int("n_group"), f.int("topk_group")), shared=0)


def _ds_family(renorm: bool, scale: float, groups: tuple[int, int] = (1, 1)) -> Callable[[ConfigFields], dict[str, Any]]:
    """A DeepSeek-V3 port whose transformers config class defaults to these routing values."""
    def parse(f: ConfigFields) -> dict[str, Any]:
        return _deepseek_v3_like(f, renorm=_ds_renorm(f, renorm),
                                 scale=f.float("routed_scaling_factor", default=scale),
                                 groups=_ds_groups(f, *groups))
    return parse


def _dots3_note(f: ConfigFields) -> dict[str, Any]:
    """dots.3 note: the V3 block with the shared experts sized by shared_experts_intermediate_size."""
    return _deepseek_v3_like(f, renorm=_ds_renorm(f, True), scale=f.float("routed_scaling_factor", default=1.0),
                             groups=_ds_groups(f, 1, 1),
                             shared_inter=("shared_experts_intermediate_size", "moe_shared_expert_intermediate_size"))


def _param2moe(f: ConfigFields) -> dict[str, Any]:
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


def _beam(f: ConfigFields) -> dict[str, Any]:
    """Beam: the V3 router without shared experts; it scales the routed output, which is the same."""
    spec = _deepseek_v3_like(f, renorm=_ds_renorm(f, True), scale=f.float("routed_scaling_factor", default=2.5),
                             groups=(f.int("n_group", default=8), f.int("topk_group", default=4)))
    spec["shared"] = SharedExperts()
    return spec


def _axk2(f: ConfigFields) -> dict[str, Any]:
    """A.X K2: the V3 block, but group-masked experts score 0 instead of being excluded, so a negative
    biased score can lose to a masked expert; only ungrouped configs are the V3 math."""
    groups, keep = f.data.get("n_group"), f.data.get("topk_group")
    if groups is not None and keep != groups:
        raise MoeBuildError("topk_group", f"{keep!r} of n_group={groups}: A.X K2 scores experts of dropped "
                            "groups 0 rather than excluding them, which moe-build does not implement",
                            "null (no grouping), or n_group")
    return _deepseek_v3_like(f, renorm=_ds_renorm(f, True), scale=f.float("routed_scaling_factor", default=2.5))


def _mimo_v2_flash(f: ConfigFields) -> dict[str, Any]:
    """MiMo-V2-Flash: the V3 router without shared experts (a null scaling factor means 1)."""
    spec = _deepseek_v3_like(f, renorm=_ds_renorm(f, True), scale=f.float("routed_scaling_factor", default=1.0),
                             groups=_ds_groups(f, 1, 1))
    spec["shared"] = SharedExperts()
    return spec


def _afmoe(f: ConfigFields) -> dict[str, Any]:
    """AFMoE (Arcee Trinity): sigmoid + expert_bias selection, always renormalised, scaled by route_scale."""
    common = _common(f, ("num_experts",), ("moe_intermediate_size",))
    count = f.int("num_shared_experts", default=2, minimum=0)
    return dict(common, activation=_activation(f),
                routing=_sigmoid(renormalize=True, scale=f.float("route_scale", default=1.0)),
                shared=_shared(count, count * common["intermediate_size"]))


def _hy_v3(f: ConfigFields) -> dict[str, Any]:
    """HY-V3: sigmoid + expert_bias selection, always renormalised, scaled by router_scaling_factor."""
    _no_mlp_bias(f)
    common = _common(f, ("num_experts", "num_local_experts"), ("moe_intermediate_size",))
    count = f.int("num_shared_experts", default=1, minimum=0)
    return dict(common, activation=_activation(f),
                routing=_sigmoid(renormalize=True, scale=f.float("router_scaling_factor", default=2.826)),
                shared=_shared(count, count * common["intermediate_size"]))


def _minimax_m2(f: ConfigFields) -> dict[str, Any]:
    """MiniMax-M2: sigmoid + e_score_correction_bias selection, always renormalised, no shared expert."""
    f.choice("scoring_func", ("sigmoid",), "sigmoid")
    f.same("shared_intermediate_size", 0, "MiniMax's shared expert is not in transformers' MiniMax-M2 block")
    return dict(_common(f, ("num_local_experts", "num_experts"), ("intermediate_size",)), activation=_activation(f),
                routing=_sigmoid(renormalize=True, bias=f.bool("use_routing_bias", default=True)))


def _minimax_m3(f: ConfigFields) -> dict[str, Any]:
    """MiniMax-M3: the M2 router, scaled, with GPT-OSS's clamped SwiGLU in routed and shared experts alike
    (hidden_act is not used by either)."""
    common = _common(f, ("num_local_experts", "num_experts"), ("intermediate_size",))
    return dict(common, activation=Activation.SWIGLU_CLAMP,
                swiglu_alpha=f.float("swiglu_alpha", default=1.702), swiglu_limit=f.float("swiglu_limit", default=7.0),
                routing=_sigmoid(renormalize=True, scale=f.float("routed_scaling_factor", default=2.0)),
                shared=_shared(1, f.int("shared_intermediate_size", default=3072, minimum=0)))


def _laguna(f: ConfigFields) -> dict[str, Any]:
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


def _lfm2_moe(f: ConfigFields) -> dict[str, Any]:
    """LFM2-MoE: sigmoid, optional expert_bias selection, optional renormalisation, scaling; experts are
    always SiLU-gated. Its renormalisation divides by (sum + 1e-6), below bf16 resolution of the weights
    unless the chosen sigmoid scores sum to under ~1e-3."""
    return dict(_common(f, ("num_experts",), ("moe_intermediate_size",)), activation=Activation.SWIGLU,
                routing=_sigmoid(renormalize=f.bool("norm_topk_prob", default=True),
                                 scale=f.float("routed_scaling_factor", default=1.0),
                                 bias=f.bool("use_expert_bias", default=True)))


def _flint(f: ConfigFields) -> dict[str, Any]:
    """Flint: top-k of the sigmoid scores (no bias), optionally renormalised, plus an ungated shared expert."""
    return dict(_common(f, ("num_experts",), ("moe_intermediate_size",)), activation=_activation(f),
                routing=_sigmoid(renormalize=f.bool("norm_topk_prob", default=True), bias=False),
                shared=_shared(1, f.int("shared_expert_intermediate_size", default=1024, minimum=0)))



def _step3p5(f: ConfigFields) -> dict[str, Any]:
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
                     EXPERTS_PER_TOKEN + ("moe_top_k",))
    return dict(common, activation=Activation.SWIGLU,
                routing=_sigmoid(renormalize=True, scale=f.float("moe_router_scaling_factor", default=1.0)),
                shared=_shared(1, f.int("share_expert_dim", "share_expert_dims", default=1280, minimum=0)))


def _cohere2_moe(f: ConfigFields) -> dict[str, Any]:
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


@dataclass(frozen=True)
class Family:
    """How one model_type's config becomes a spec, and which decoder layers hold its MoE block."""

    parse: Callable[[ConfigFields], dict[str, Any]]
    layers: Callable[[ConfigFields], list[int]] = all_layers
    text: tuple[str, ...] = ()  # path of the language model's sub-config in a multimodal config


def _multimodal(family: Family, path: tuple[str, ...] = ("text_config",)) -> Family:
    """`family` as the language model of a multimodal config, whose text sub-config sits at `path`."""
    return replace(family, text=path)


_ARIA = Family(_aria)
_QWEN3_VL_MOE = Family(_always_renormalised, qwen_layers)
_QWEN3_OMNI_MOE = Family(_norm_topk(True), qwen_layers)
_QWEN3_5_MOE = Family(_with_shared(_always_renormalised, 512))
_QWEN4_EXP = Family(_with_shared(_norm_topk(True), 512))
_MISTRAL_LARGE4 = Family(lambda f: _grouped_softmax(f, renormalize=True),
                          layer_types(first_dense("first_k_dense_replace", 1)))
_DEEPSEEK_OCR = Family(_deepseek_v2_like(2), layer_types(required_layer_types))
_UNLIMITED_OCR = Family(_deepseek_v2_like(2), layer_types(first_dense("first_k_dense_replace", 1)))
_DEEPSEEK_V3 = Family(_deepseek_v3, deepseek_layers(0))
_GLM4_MOE = Family(_ds_family(True, 1.0), first_dense("first_k_dense_replace", 1))
_DOTS3_NOTE = Family(_dots3_note, layer_types(layer_freq(1)))
_MINIMAX_M3 = Family(_minimax_m3, layer_types(layer_flags))
_GRANITE_SHARED = Family(_with_shared(_mixtral, 0, gated=False, key="shared_intermediate_size"))
_STEP_MOE_LAYERS = layer_types(step_layers)
_STEP3P5 = Family(_step3p5, _STEP_MOE_LAYERS)

_FAMILIES: dict[str, Family] = {
    # top-k logits -> softmax over k
    "mixtral": Family(_mixtral),
    "minimax": Family(_minimax),
    "granitemoe": Family(_mixtral),  # its shared-MLP variants are the next three
    "granitemoeshared": _GRANITE_SHARED,
    "granitemoe_swa": _GRANITE_SHARED,
    "granitemoehybrid": Family(_with_shared(_mixtral, 1024, gated=False, key="shared_intermediate_size"),
                                 granite_hybrid_layers),
    "aria_text": _ARIA,
    "aria": _multimodal(_ARIA),
    "hunyuan_v1_moe": Family(_hunyuan_v1_moe),
    "gpt_oss": Family(_gpt_oss),
    "openai_privacy_filter": Family(_openai_privacy_filter),
    "cohere2_moe": Family(_cohere2_moe, layer_types(first_dense("first_k_dense_replace", 0))),
    # softmax over all -> top-k
    "qwen2_moe": Family(_with_shared(_norm_topk(False), 0), qwen_layers),
    "qwen3_moe": Family(_norm_topk(False), qwen_layers),
    "qwen3_next": Family(_with_shared(_norm_topk(True), 512), qwen_layers),
    "qwen3_vl_moe": _multimodal(_QWEN3_VL_MOE),
    "qwen3_omni_moe": _multimodal(_QWEN3_OMNI_MOE, ("thinker_config", "text_config")),
    "qwen3_5_moe_text": _QWEN3_5_MOE,
    "qwen3_5_moe": _multimodal(_QWEN3_5_MOE),
    "qwen4_exp_text": _QWEN4_EXP,
    "qwen4_exp": _multimodal(_QWEN4_EXP),
    "olmoe": Family(_norm_topk(False, "intermediate_size")),  # OLMoE has no dense MLP layers
    "flex_olmo": Family(_norm_topk(False, "intermediate_size")),
    "mellum": Family(_norm_topk(True), layer_types(all_layers)),
    "lara_mini": Family(_with_shared(_norm_topk(True), 512, gated=False)),
    "jamba": Family(lambda f: _softmax_topk(f, "intermediate_size", False), jamba_layers),
    "dbrx": Family(_dbrx),
    "mistral4": Family(lambda f: _grouped_softmax(f, renormalize=f.bool("norm_topk_prob", default=True)),
                        first_dense("first_k_dense_replace", 0)),
    "mistral_large4": _multimodal(_MISTRAL_LARGE4),
    "deepseek_v2": Family(_deepseek_v2_like(0), deepseek_layers(0)),
    "deepseek_ocr2": _multimodal(_DEEPSEEK_OCR),
    "unlimited_ocr": _multimodal(_UNLIMITED_OCR),
    # sigmoid + correction bias, grouped top-k
    "deepseek_v3": _DEEPSEEK_V3,
    "kimi_k25": _multimodal(_DEEPSEEK_V3),
    "sarvam_mla": Family(_ds_family(True, 2.5), deepseek_layers(1)),
    "deepseek_v32": Family(_ds_family(True, 2.5, (8, 4)), layer_types(first_dense("first_k_dense_replace", 3))),
    "glm_moe_dsa": Family(_ds_family(True, 2.5), layer_types(first_dense("first_k_dense_replace", 3))),
    "glm4_moe": _GLM4_MOE,
    "glm4v_moe": _multimodal(_GLM4_MOE),
    "sarvam_moe": Family(_ds_family(True, 2.5), first_dense("first_k_dense_replace", 1)),
    "glm4_moe_lite": Family(_ds_family(True, 1.8), layer_types(leading_dense(1))),
    "dots1": Family(_ds_family(False, 1.0), first_dense("first_k_dense_replace", 0)),
    "dots3_note_text": _DOTS3_NOTE,
    "dots3_note": _multimodal(_DOTS3_NOTE),
    "solar_open": Family(_ds_family(True, 1.0)),
    "kimi_linear": Family(_ds_family(True, 2.446), layer_types(first_dense("first_k_dense_replace", 1))),
    "bailing_hybrid": Family(_ds_family(True, 2.5, (8, 4)), layer_types(first_dense("first_k_dense_replace", 2))),
    "mimo_v2_flash": Family(_mimo_v2_flash, layer_types(leading_dense(1))),
    "exaone_moe": Family(_ds_family(True, 2.5), layer_types(first_dense("first_k_dense_replace", 1))),
    "minicpm5_moe": Family(_ds_family(True, 3.66), layer_types(first_dense("first_k_dense_replace", 1))),
    "param2moe": Family(_param2moe, first_dense("first_k_dense_replace", 1)),
    "beam": Family(_beam, layer_types(leading_dense(3))),
    "axk2": Family(_axk2, layer_types(layer_freq(1))),
    # sigmoid, other selection / scaling rules
    "afmoe": Family(_afmoe, first_dense("num_dense_layers", 1)),
    "hy_v3": Family(_hy_v3, layer_types(leading_dense(1))),
    "minimax_m2": Family(_minimax_m2),
    "minimax_m3_vl_text": _MINIMAX_M3,
    "minimax_m3_vl": _multimodal(_MINIMAX_M3),
    "laguna": Family(_laguna, layer_types(leading_dense(1))),
    "lfm2_moe": Family(_lfm2_moe, first_dense("num_dense_layers", 2)),
    "flint": Family(_flint, flint_layers),
    "step3p5": _STEP3P5,
    "step3p7": _multimodal(_STEP3P5),
}
FAMILIES: tuple[str, ...] = tuple(_FAMILIES)


def family_of(model_type: str) -> Family:
    """The supported family `model_type` (one of FAMILIES)."""
    return _FAMILIES[model_type]

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
