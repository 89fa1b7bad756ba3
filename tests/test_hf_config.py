"""config.json -> MoESpec for each supported family, MoE-layer selection, and user errors."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from moe_build.errors import MoeBuildError
from moe_build.spec.hf_config import moe_layer_indices, spec_from_hf_config
from moe_build.spec.presets import PRESETS, get_preset
from moe_build.spec import Activation, DType, Quant, RoutingMethod

transformers = pytest.importorskip("transformers")

# The MoE-relevant part of each model's published config.json, as the hub serves it.
PUBLISHED: dict[str, dict[str, Any]] = {
    "mixtral-8x7b": {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_act": "silu",
        "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2, "rope_theta": 1e6,
        "router_aux_loss_coef": 0.02, "sliding_window": None, "torch_dtype": "bfloat16", "vocab_size": 32000},
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "decoder_sparse_step": 1,
        "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144,
        "mlp_only_layers": [], "moe_intermediate_size": 768, "norm_topk_prob": True, "num_experts": 128,
        "num_experts_per_tok": 8, "num_hidden_layers": 48, "torch_dtype": "bfloat16", "vocab_size": 151936},
    "deepseek-v2-lite": {
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "first_k_dense_replace": 1,
        "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 10944, "kv_lora_rank": 512,
        "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
        "n_shared_experts": 2, "norm_topk_prob": False, "num_experts_per_tok": 6, "num_hidden_layers": 27,
        "q_lora_rank": None, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": True,
        "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16"},
    "deepseek-v3": {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "first_k_dense_replace": 3,
        "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
        "norm_topk_prob": True, "num_experts_per_tok": 8, "num_hidden_layers": 61,
        "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_group": 4, "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16",
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "weight_block_size": [128, 128]}},
    "gpt-oss-20b": {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "experts_per_token": 4,
        "hidden_act": "silu", "hidden_size": 2880, "intermediate_size": 2880, "num_experts_per_tok": 4,
        "num_hidden_layers": 24, "num_local_experts": 32, "swiglu_limit": 7.0, "torch_dtype": "bfloat16",
        "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router"],
                                "quant_method": "mxfp4"}},
    "olmoe-1b-7b": {
        "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "hidden_act": "silu", "hidden_size": 2048,
        "intermediate_size": 1024, "norm_topk_prob": False, "num_experts": 64, "num_experts_per_tok": 8,
        "num_hidden_layers": 16, "torch_dtype": "bfloat16"},
    "qwen2-moe-a2.7b": {
        "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "decoder_sparse_step": 1,
        "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408,
        "norm_topk_prob": False, "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 24,
        "shared_expert_intermediate_size": 5632, "torch_dtype": "bfloat16"},
}


def _write(tmp_path: Path, config: dict[str, Any], folder: str = "ckpt") -> Path:
    path = tmp_path / folder
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_published_config_matches_preset(tmp_path: Path, preset: str) -> None:
    spec = spec_from_hf_config(_write(tmp_path, PUBLISHED[preset], folder=preset))
    assert spec.name == preset
    want = get_preset(preset)
    if preset == "gpt-oss-20b":  # released with MXFP4 experts, which load as MXFP4 (wfp4a16, 32 per exponent)
        want = dataclasses.replace(want, quant=Quant.WFP4A16, quant_group_size=32)
    assert spec == want


def test_family_specific_fields() -> None:
    v3 = spec_from_hf_config(PUBLISHED["deepseek-v3"])
    assert v3.routing.method is RoutingMethod.SIGMOID_GROUPED and v3.routing.correction_bias
    assert (v3.routing.num_groups, v3.routing.topk_groups, v3.routing.routed_scaling_factor) == (8, 4, 2.5)
    oss = spec_from_hf_config(PUBLISHED["gpt-oss-20b"])
    assert oss.activation is Activation.SWIGLU_CLAMP and oss.expert_bias and oss.routing.router_bias
    assert (oss.swiglu_alpha, oss.swiglu_limit) == (1.702, 7.0)
    q2 = spec_from_hf_config(PUBLISHED["qwen2-moe-a2.7b"])
    assert (q2.shared.count, q2.shared.intermediate_size, q2.shared.sigmoid_gate) == (1, 5632, True)
    assert moe_layer_indices(PUBLISHED["deepseek-v3"]) == list(range(3, 61))


def test_deepseek_v2_group_limited_greedy() -> None:
    config = dict(PUBLISHED["deepseek-v2-lite"], topk_method="group_limited_greedy", n_group=8, topk_group=3,
                  routed_scaling_factor=16.0)
    r = spec_from_hf_config(config).routing
    assert (r.method, r.num_groups, r.topk_groups, r.routed_scaling_factor) == (RoutingMethod.SOFTMAX_TOPK, 8, 3, 16.0)
    # released DeepSeek-V2 code: renormalising replaces the scaling
    r = spec_from_hf_config(dict(config, norm_topk_prob=True)).routing
    assert r.renormalize and r.routed_scaling_factor == 1.0


def test_dtype_keys() -> None:
    base = PUBLISHED["olmoe-1b-7b"]
    assert spec_from_hf_config(dict(base, torch_dtype="float16")).dtype is DType.FP16
    assert spec_from_hf_config({**{k: v for k, v in base.items() if k != "torch_dtype"}, "dtype": "float32"}).dtype \
        is DType.FP32
    with pytest.raises(MoeBuildError) as err:
        spec_from_hf_config(dict(base, dtype="float16"))  # disagrees with torch_dtype=bfloat16
    assert err.value.field == "torch_dtype"


def _tiny_configs() -> list[Any]:
    """Real transformers config objects (tiny sizes) for every family, with sparse-layer layouts."""
    common = dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, vocab_size=64, num_hidden_layers=4)
    return [
        transformers.MixtralConfig(**common, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2),
        transformers.Qwen2MoeConfig(**common, intermediate_size=40, moe_intermediate_size=16, num_experts=6,
                                    num_experts_per_tok=2, shared_expert_intermediate_size=24, norm_topk_prob=True,
                                    decoder_sparse_step=2, mlp_only_layers=[3]),
        transformers.Qwen3MoeConfig(**common, intermediate_size=40, moe_intermediate_size=16, num_experts=6,
                                    num_experts_per_tok=3, head_dim=16, mlp_only_layers=[0]),
        transformers.OlmoeConfig(**common, intermediate_size=16, num_experts=4, num_experts_per_tok=2),
        transformers.DeepseekV2Config(**common, intermediate_size=40, moe_intermediate_size=16, n_routed_experts=8,
                                      num_experts_per_tok=2, n_shared_experts=2, first_k_dense_replace=1,
                                      topk_method="group_limited_greedy", n_group=4, topk_group=2,
                                      routed_scaling_factor=1.5, kv_lora_rank=8, q_lora_rank=None,
                                      qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=4),
        transformers.DeepseekV3Config(**common, intermediate_size=40, moe_intermediate_size=16, n_routed_experts=8,
                                      num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=2, n_group=2,
                                      topk_group=1, kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=4,
                                      qk_nope_head_dim=4, v_head_dim=4),
        transformers.GptOssConfig(**common, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2,
                                  head_dim=16, swiglu_limit=5.0, layer_types=["full_attention"] * 4),
    ]


@pytest.mark.parametrize("config", _tiny_configs(), ids=lambda c: c.model_type)
def test_transformers_config_to_dict(config: Any) -> None:
    """Parse what transformers itself serialises, and check layer selection against the model it builds."""
    spec = spec_from_hf_config(config.to_dict())
    assert spec.family == config.model_type and spec.dtype is DType.BF16  # to_dict() carries dtype=None
    assert (spec.hidden_size, spec.top_k) == (config.hidden_size, config.num_experts_per_tok)
    experts = config.num_local_experts if hasattr(config, "num_local_experts") else config.num_experts
    assert spec.num_experts == experts
    assert spec.intermediate_size == getattr(config, "moe_intermediate_size", config.intermediate_size)
    if hasattr(config, "norm_topk_prob") and config.model_type != "deepseek_v2":
        assert spec.routing.renormalize == config.norm_topk_prob
    if config.model_type == "deepseek_v2":
        assert (spec.routing.num_groups, spec.routing.routed_scaling_factor) == (4, 1.5)
        assert spec.shared.intermediate_size == 2 * config.moe_intermediate_size
    model = transformers.AutoModelForCausalLM.from_config(config)
    is_moe = [i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "experts")]
    assert moe_layer_indices(config.to_dict()) == is_moe


def _bad(base: str, **changes: Any) -> dict[str, Any]:
    config = dict(PUBLISHED[base])
    for key, value in changes.items():
        if value is _DROP:
            config.pop(key)
        else:
            config[key] = value
    return config


_DROP = object()


@pytest.mark.parametrize("config, field", [
    ({"model_type": "llama", "hidden_size": 4096}, "model_type"),
    ({"hidden_size": 4096}, "model_type"),
    (_bad("qwen2-moe-a2.7b", num_experts=0), "num_experts"),
    (_bad("qwen3-30b-a3b", mlp_only_layers=list(range(48))), "num_hidden_layers"),
    (_bad("mixtral-8x7b", hidden_act="relu2"), "hidden_act"),
    (_bad("mixtral-8x7b", num_experts_per_tok=9), "num_experts_per_tok"),
    (_bad("mixtral-8x7b", hidden_size=-4096), "hidden_size"),
    (_bad("qwen3-30b-a3b", moe_intermediate_size=_DROP), "moe_intermediate_size"),
    (_bad("qwen3-30b-a3b", num_local_experts=64), "num_local_experts"),
    (_bad("olmoe-1b-7b", torch_dtype="float8_e4m3fn"), "torch_dtype"),
    (_bad("olmoe-1b-7b", norm_topk_prob="yes"), "norm_topk_prob"),
    (_bad("deepseek-v3", topk_method="greedy"), "topk_method"),
    (_bad("deepseek-v3", n_group=7), "n_group"),
    (_bad("deepseek-v3", topk_group=9), "topk_group"),
    (_bad("deepseek-v3", n_group=_DROP), "n_group"),
    (_bad("deepseek-v2-lite", scoring_func="sigmoid"), "scoring_func"),
    (_bad("deepseek-v2-lite", topk_method="group_limited_greedy", n_group=_DROP), "n_group"),
    (_bad("deepseek-v2-lite", routed_scaling_factor=-1.0), "routed_scaling_factor"),
    (_bad("deepseek-v2-lite", mlp_bias=True), "mlp_bias"),
    (_bad("gpt-oss-20b", swiglu_limit=0), "swiglu_limit"),
    (_bad("gpt-oss-20b", experts_per_token=2), "experts_per_token"),
])
def test_bad_config_names_the_field(config: dict[str, Any], field: str) -> None:
    with pytest.raises(MoeBuildError) as err:
        spec_from_hf_config(config)
    assert err.value.field == field
    assert err.value.exit_code == 2 and "\n" not in str(err.value)


def test_bad_config_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(MoeBuildError) as err:
        spec_from_hf_config(tmp_path)
    assert err.value.field == "config"
    with pytest.raises(MoeBuildError):
        spec_from_hf_config(tmp_path / "absent")


def test_presets() -> None:
    tiny = get_preset("tiny")
    assert (tiny.hidden_size, tiny.intermediate_size, tiny.num_experts, tiny.top_k) == (64, 128, 8, 2)
    assert tiny.dtype is DType.FP16 and tiny.routing.method is RoutingMethod.TOPK_SOFTMAX
    assert all(s.dtype is DType.BF16 for n, s in PRESETS.items() if n != "tiny")
    assert set(PUBLISHED) | {"tiny"} == set(PRESETS)
    assert all(dataclasses.replace(s) == s for s in PRESETS.values())  # all pass MoESpec validation
    with pytest.raises(MoeBuildError) as err:
        get_preset("mixtral")
    assert err.value.field == "preset" and "mixtral-8x7b" in str(err.value)
