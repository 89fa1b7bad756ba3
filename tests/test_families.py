"""Every MoE family of transformers: supported ones match transformers' own block, the rest are refused.

Supported families: a tiny random model built offline by transformers -> save_pretrained (fp32
safetensors) -> our config parser and checkpoint loader -> moe_reference in fp64, against the
family's own MoE block run in fp64 on fresh random inputs (our router runs on the loaded router
weight). transformers' routers compute in fp32, so the bound is 1e-6 relative (tolerance per case
where a family's own math differs by more; the reason is stated there). Every size is distinct
(H=32, I=24, 2I=48, shared 20 or a multiple of I) so a transposed or swapped tensor cannot pass, and
the layer layout is checked against the modules transformers builds.

Refused families: every one is named with its missing feature, and the scan at the end checks that
no MoE model type of the installed transformers is left unclassified.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from moe_build.errors import MoeBuildError
from moe_build.reference import moe_reference
from moe_build.spec import Activation, RoutingMethod
from moe_build.spec.families import FAMILIES, REFUSED
from moe_build.spec.hf_config import moe_layer_indices, spec_from_hf_config
from moe_build.weights.checkpoint import load_moe_layer

transformers = pytest.importorskip("transformers")
t = transformers

H, I, E = 32, 24, 8
_A = dict(num_attention_heads=2, num_key_value_heads=2, vocab_size=64, hidden_size=H, pad_token_id=0)
_MLA = dict(kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=4)
_MOE = dict(moe_intermediate_size=I, num_experts_per_tok=3)
_DSA = dict(index_head_dim=8, index_n_heads=2)
_VISION_QWEN = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=H)
_VISION = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)
_MROPE = dict(rope_parameters=dict(rope_type="default", rope_theta=1e4, mrope_section=[2, 3, 3]))
_SAM = dict(hidden_size=16, output_channels=16, num_hidden_layers=1, num_attention_heads=2, global_attn_indexes=[0],
            mlp_dim=16, downsample_channels=[16, 16])


@dataclass(frozen=True)
class Case:
    """One family: a tiny config, the auto class that builds what its checkpoints hold, and where the
    decoder layers and their MoE block sit in that model."""

    config: Callable[[], Any]
    auto: str = "AutoModelForCausalLM"
    layers: str = "model.layers"
    block: str = "mlp"
    extra: str | None = None  # a layer-level module that is part of the MoE layer (Granite's shared MLP)
    tol: float = 1e-6


def _ds(cls: Any, **kw: Any) -> Callable[[], Any]:
    """A DeepSeek-V3-style config: one dense layer, then one MoE layer."""
    return lambda: cls(**{**_A, "intermediate_size": 40, "n_routed_experts": E, "num_hidden_layers": 2, **_MOE, **kw})


_VL = dict(auto="AutoModelForImageTextToText", layers="model.language_model.layers")

CASES: dict[str, Case] = {
    "minimax": Case(lambda: t.MiniMaxConfig(**_A, intermediate_size=I, num_local_experts=E, num_experts_per_tok=2,
                                            num_hidden_layers=1, head_dim=16, layer_types=["full_attention"])),
    "minimax_m2": Case(lambda: t.MiniMaxM2Config(**_A, intermediate_size=I, num_local_experts=E, num_experts_per_tok=3,
                                                 num_hidden_layers=1, head_dim=16)),
    "minimax_m3_vl_text": Case(lambda: t.MiniMaxM3VLTextConfig(
        **_A, intermediate_size=I, shared_intermediate_size=20, dense_intermediate_size=40, num_local_experts=E,
        num_experts_per_tok=3, num_hidden_layers=2, head_dim=16, rotary_dim=8, swiglu_limit=1.0,
        mlp_layer_types=["dense", "sparse"])),
    "minimax_m3_vl": Case(lambda: t.MiniMaxM3VLConfig(
        text_config=dict(**_A, intermediate_size=I, shared_intermediate_size=20, dense_intermediate_size=40,
                         num_local_experts=E, num_experts_per_tok=3, num_hidden_layers=1, head_dim=16, rotary_dim=8,
                         swiglu_limit=1.0), vision_config=_VISION), **_VL),
    "granitemoe": Case(lambda: t.GraniteMoeConfig(**_A, intermediate_size=I, num_local_experts=E, num_experts_per_tok=3,
                                                  num_hidden_layers=1), block="block_sparse_moe"),
    "granitemoeshared": Case(lambda: t.GraniteMoeSharedConfig(
        **_A, intermediate_size=I, num_local_experts=E, num_experts_per_tok=2, num_hidden_layers=1,
        shared_intermediate_size=20), block="block_sparse_moe", extra="shared_mlp"),
    "granitemoe_swa": Case(lambda: t.GraniteMoeSWAConfig(
        **_A, intermediate_size=I, num_local_experts=E, num_experts_per_tok=2, num_hidden_layers=1,
        shared_intermediate_size=20), block="block_sparse_moe", extra="shared_mlp"),
    "granitemoehybrid": Case(lambda: t.GraniteMoeHybridConfig(
        **_A, intermediate_size=I, num_local_experts=E, num_experts_per_tok=2, num_hidden_layers=1,
        shared_intermediate_size=20, layer_types=["full_attention"], mamba_n_heads=2, mamba_d_head=16,
        mamba_expand=1, mamba_n_groups=1, mamba_d_state=8), block="block_sparse_moe", extra="shared_mlp"),
    "aria_text": Case(lambda: t.AriaTextConfig(**_A, intermediate_size=I, moe_num_experts=E, moe_topk=2,
                                               moe_num_shared_experts=2, num_hidden_layers=1)),
    "aria": Case(lambda: t.AriaConfig(text_config=dict(**_A, intermediate_size=I, moe_num_experts=E, moe_topk=3,
                                                       moe_num_shared_experts=1, num_hidden_layers=1),
                                      vision_config=_VISION), **_VL),
    "hunyuan_v1_moe": Case(lambda: t.HunYuanMoEV1Config(**_A, intermediate_size=I, num_experts=E, moe_topk=3,
                                                        num_hidden_layers=1, head_dim=16)),
    "openai_privacy_filter": Case(lambda: t.OpenAIPrivacyFilterConfig(
        **_A, intermediate_size=I, num_local_experts=E, num_experts_per_tok=3, num_hidden_layers=1, head_dim=16,
        swiglu_limit=1.0), auto="AutoModelForTokenClassification"),
    "cohere2_moe": Case(lambda: t.Cohere2MoeConfig(
        **_A, intermediate_size=I, num_experts=E, num_experts_per_tok=2, num_hidden_layers=2, head_dim=16,
        num_shared_experts=1, shared_expert_combination_strategy="sum", first_k_dense_replace=1,
        prefix_dense_intermediate_size=40)),
    "cohere2_moe_sigmoid": Case(lambda: t.Cohere2MoeConfig(
        **_A, intermediate_size=I, num_experts=E, num_experts_per_tok=3, num_hidden_layers=1, head_dim=16,
        expert_selection_fn="sigmoid", norm_topk_prob=True)),
    "qwen3_next": Case(lambda: t.Qwen3NextConfig(
        **_A, intermediate_size=40, **_MOE, num_experts=E, num_hidden_layers=2, head_dim=16,
        shared_expert_intermediate_size=20, layer_types=["full_attention"] * 2, mlp_only_layers=[0])),
    "qwen3_vl_moe": Case(lambda: t.Qwen3VLMoeConfig(
        text_config=dict(**_A, intermediate_size=40, **_MOE, num_experts=E, num_hidden_layers=2, head_dim=16,
                         decoder_sparse_step=2, **_MROPE),
        vision_config=dict(_VISION_QWEN, deepstack_visual_indexes=[])), **_VL),
    "qwen3_omni_moe": Case(lambda: t.Qwen3OmniMoeConfig(enable_audio_output=False, thinker_config=dict(
        text_config=dict(**_A, intermediate_size=40, **_MOE, num_experts=E, num_hidden_layers=2, head_dim=16,
                         decoder_sparse_step=2, norm_topk_prob=False, **_MROPE),
        vision_config=dict(_VISION_QWEN, deepstack_visual_indexes=[]),
        audio_config=dict(encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=16, d_model=16, output_dim=H,
                          downsample_hidden_size=8))),
        auto="AutoModelForMultimodalLM", layers="thinker.model.language_model.layers"),
    "qwen3_5_moe_text": Case(lambda: t.Qwen3_5MoeTextConfig(
        **_A, **_MOE, shared_expert_intermediate_size=20, num_experts=E, num_hidden_layers=1, head_dim=16,
        layer_types=["full_attention"])),
    "qwen3_5_moe": Case(lambda: t.Qwen3_5MoeConfig(
        text_config=dict(**_A, **_MOE, shared_expert_intermediate_size=20, num_experts=E, num_hidden_layers=1,
                         head_dim=16, layer_types=["full_attention"]), vision_config=_VISION_QWEN), **_VL),
    "qwen4_exp_text": Case(lambda: t.Qwen4ExpTextConfig(
        **_A, **_MOE, shared_expert_intermediate_size=20, num_experts=E, num_hidden_layers=1, head_dim=16,
        layer_types=["linear_attention"], linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
        linear_num_value_heads=2, hc_count=2, hc_lowrank=4, ngram_vocab_size_base=64, split_ngram_parts=1,
        heads_per_ngram=2, ple_layer_ids=[])),
    "qwen4_exp": Case(lambda: t.Qwen4ExpConfig(text_config=dict(
        **_A, **_MOE, shared_expert_intermediate_size=20, num_experts=E, num_hidden_layers=1, head_dim=16,
        layer_types=["linear_attention"], linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
        linear_num_value_heads=2, hc_count=2, hc_lowrank=4, ngram_vocab_size_base=64, split_ngram_parts=1,
        heads_per_ngram=2, ple_layer_ids=[], norm_topk_prob=False), vision_config=_VISION_QWEN), **_VL),
    "flex_olmo": Case(lambda: t.FlexOlmoConfig(**_A, intermediate_size=I, num_experts=E, num_experts_per_tok=3,
                                               num_hidden_layers=1, norm_topk_prob=True)),
    "mellum": Case(lambda: t.MellumConfig(**_A, intermediate_size=40, **_MOE, num_experts=E, num_hidden_layers=2,
                                          head_dim=16, mlp_layer_types=["dense", "sparse"])),
    "lara_mini": Case(lambda: t.LaraMiniConfig(**_A, intermediate_size=40, **_MOE, num_experts=E, num_hidden_layers=1,
                                               head_dim=16, shared_expert_intermediate_size=20)),
    "jamba": Case(lambda: t.JambaConfig(**_A, intermediate_size=I, num_experts=E, num_experts_per_tok=2,
                                        num_hidden_layers=2, attn_layer_period=2, attn_layer_offset=1,
                                        expert_layer_period=2, expert_layer_offset=1, mamba_d_state=4,
                                        mamba_expand=1), block="feed_forward"),
    "dbrx": Case(lambda: t.DbrxConfig(d_model=H, n_heads=2, n_layers=1, vocab_size=64,
                                      attn_config=dict(kv_n_heads=2, rope_theta=1e4),
                                      ffn_config=dict(ffn_hidden_size=I, moe_num_experts=E, moe_top_k=3)),
                 layers="transformer.blocks", block="ffn"),
    "mistral4": Case(_ds(t.Mistral4Config, **_MLA, first_k_dense_replace=1, routed_scaling_factor=1.5),
                     auto="AutoModelForImageTextToText"),
    "mistral_large4": Case(lambda: t.MistralLarge4Config(
        text_config=dict(**_A, **_MLA, intermediate_size=40, **_MOE, n_routed_experts=E, num_hidden_layers=2,
                         routed_scaling_factor=1.5),
        vision_config=dict(_VISION, head_dim=8)), **_VL),
    "deepseek_ocr2": Case(lambda: t.DeepseekOcr2Config(
        text_config=dict(**_A, intermediate_size=40, **_MOE, n_routed_experts=E, num_hidden_layers=2,
                         mlp_layer_types=["dense", "sparse"], routed_scaling_factor=1.5),
        vision_config=dict(sam_config=_SAM, encoder_config=dict(_VISION, num_key_value_heads=2, vocab_size=64))),
        **_VL),
    "unlimited_ocr": Case(lambda: t.UnlimitedOcrConfig(
        text_config=dict(**_A, intermediate_size=40, **_MOE, n_routed_experts=E, num_hidden_layers=2,
                         topk_method="group_limited_greedy", n_group=4, topk_group=2),
        vision_config=dict(sam_config=_SAM, encoder_config=_VISION)), **_VL),
    "deepseek_v32": Case(_ds(t.DeepseekV32Config, **_MLA, **_DSA, first_k_dense_replace=1, n_group=4, topk_group=2)),
    "glm_moe_dsa": Case(_ds(t.GlmMoeDsaConfig, **_MLA, **_DSA, first_k_dense_replace=1, norm_topk_prob=False)),
    "glm4_moe": Case(_ds(t.Glm4MoeConfig, head_dim=16, n_group=2, topk_group=1, routed_scaling_factor=2.5)),
    "glm4_moe_lite": Case(_ds(t.Glm4MoeLiteConfig, **_MLA, n_shared_experts=2)),
    "glm4v_moe": Case(lambda: t.Glm4vMoeConfig(
        text_config=dict(**_A, intermediate_size=40, **_MOE, n_routed_experts=E, num_hidden_layers=2, head_dim=16),
        vision_config=_VISION_QWEN), **_VL),
    "sarvam_moe": Case(_ds(t.SarvamMoEConfig, head_dim=16)),
    "sarvam_mla": Case(_ds(t.SarvamMLAConfig, **dict(_MLA, q_lora_rank=None))),
    "dots1": Case(_ds(t.Dots1Config, n_shared_experts=2, first_k_dense_replace=1)),
    "dots3_note_text": Case(_ds(t.Dots3NoteTextConfig, **_MLA, **_DSA, head_dim=8, shared_experts_intermediate_size=20,
                                use_dsa=False, use_sliding_window=False)),
    "dots3_note": Case(lambda: t.Dots3NoteConfig(
        text_config=dict(**_A, **_MLA, **_DSA, **_MOE, intermediate_size=40, n_routed_experts=E, num_hidden_layers=2,
                         head_dim=8, shared_experts_intermediate_size=20, use_dsa=False, use_sliding_window=False),
        vision_config=dict(_VISION, mlp_layer_types=["dense"], adapter_in_dim=16, adapter_out_dim=H,
                           moe_intermediate_size=8, num_local_experts=2),
        audio_config=dict(_VISION, num_key_value_heads=2, head_dim=8, adapter_input_size=16, adapter_out_dim=H,
                          downsample_hidden_size=8, conv_output_size=16)), **_VL),
    "solar_open": Case(lambda: t.SolarOpenConfig(**_A, **_MOE, n_routed_experts=E, num_hidden_layers=1, head_dim=16)),
    "kimi_linear": Case(lambda: t.KimiLinearConfig(**_A, **_MLA, intermediate_size=40, **_MOE, num_local_experts=E,
                                                   num_hidden_layers=2, n_group=2, topk_group=1)),
    "kimi_k25": Case(lambda: t.Kimi_K25Config(
        text_config=dict(model_type="deepseek_v3", **_A, **_MLA, intermediate_size=40, **_MOE, n_routed_experts=E,
                         num_hidden_layers=2, first_k_dense_replace=1, n_group=4, topk_group=2),
        vision_config=_VISION), **_VL),
    "bailing_hybrid": Case(lambda: t.BailingHybridConfig(**_A, intermediate_size=40, **_MOE, num_local_experts=E,
                                                         num_hidden_layers=2, first_k_dense_replace=1, n_group=4,
                                                         topk_group=2)),
    "mimo_v2_flash": Case(_ds(t.MiMoV2FlashConfig, head_dim=16)),
    "minicpm5_moe": Case(_ds(t.MiniCPM5MoeConfig, head_dim=16, n_shared_experts=2, routed_scaling_factor=1.5)),
    "param2moe": Case(_ds(t.Param2MoeConfig, head_dim=16, n_group=4, topk_group=2)),
    "exaone_moe": Case(lambda: t.ExaoneMoeConfig(**_A, intermediate_size=40, **_MOE, num_experts=E,
                                                 num_hidden_layers=2, head_dim=16, num_shared_experts=2)),
    "beam": Case(lambda: t.BeamConfig(**_A, intermediate_size=40, **_MOE, num_experts=E, num_hidden_layers=4,
                                      head_dim=16, n_group=2, topk_group=1)),
    "axk2": Case(_ds(t.AXK2Config, **_MLA)),
    "afmoe": Case(lambda: t.AfmoeConfig(**_A, intermediate_size=40, **_MOE, num_experts=E, num_hidden_layers=2,
                                        head_dim=16, route_scale=1.5, num_shared_experts=1)),
    "hy_v3": Case(lambda: t.HYV3Config(**_A, intermediate_size=40, **_MOE, num_experts=E, num_hidden_layers=2,
                                       head_dim=16)),
    "laguna": Case(lambda: t.LagunaConfig(**_A, intermediate_size=40, **_MOE, num_experts=E, num_hidden_layers=2,
                                          head_dim=16, shared_expert_intermediate_size=20,
                                          moe_routed_scaling_factor=1.5)),
    "lfm2_moe": Case(lambda: t.Lfm2MoeConfig(**_A, intermediate_size=40, **_MOE, num_experts=E, num_hidden_layers=2,
                                             num_dense_layers=1, layer_types=["full_attention", "conv"],
                                             routed_scaling_factor=1.5), block="feed_forward",
                     # its renormalisation divides by (sum + 1e-6): a relative difference of 1e-6 / sum(weights)
                     tol=3e-6),
    "step3p7": Case(lambda: t.Step3p7Config(
        text_config=dict(**_A, intermediate_size=40, **_MOE, share_expert_dim=20, n_routed_experts=E,
                         num_hidden_layers=2, head_dim=16, moe_layers_enum="1", moe_router_scaling_factor=1.5),
        vision_config=dict(_VISION, image_size=28, patch_size=14)), **_VL),
    "flint": Case(lambda: t.FlintConfig(**_A, intermediate_size=40, **_MOE, num_experts=E, num_hidden_layers=3,
                                        head_dim=16, shared_expert_intermediate_size=20)),
}

# Covered by test_reference.py against transformers' blocks the same way.
_EXISTING = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3", "gpt_oss")
# transformers has no model class of its own for it: test_step3p5_text_checkpoint
_TEXT_ONLY = ("step3p5",)


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _is_moe(layer: torch.nn.Module) -> bool:
    return any(name.rsplit(".", 1)[-1] == "experts" for name, _ in layer.named_modules())


def _randomize(modules: list[torch.nn.Module]) -> None:
    """Unit-scale random MoE weights and 0.1-scale selection biases (the init would leave routing untested)."""
    with torch.no_grad():
        for module in modules:
            for name, p in [*module.named_parameters(), *module.named_buffers()]:
                if not p.is_floating_point():
                    continue
                if name.endswith(("e_score_correction_bias", "expert_bias")):
                    p.copy_(torch.randn_like(p) * 0.1)
                else:
                    p.copy_(torch.randn_like(p) / (p.shape[-1] ** 0.5 if p.dim() > 1 else 2.0))


def _build(case: Case, folder: Path) -> tuple[torch.nn.Module, list[torch.nn.Module]]:
    """The random model saved to `folder` in fp32, returned in fp64 with its decoder layers."""
    model = getattr(transformers, case.auto).from_config(case.config(), experts_implementation="eager")
    layers = list(_get(model, case.layers))
    _randomize([m for layer in layers if _is_moe(layer)
                for m in (getattr(layer, case.block), getattr(layer, case.extra) if case.extra else None) if m])
    model.save_pretrained(folder)
    return model.double().eval(), layers


def _hf_layer(case: Case, layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = getattr(layer, case.block)(x)
        out = out[0] if isinstance(out, tuple) else out
        return out + getattr(layer, case.extra)(x) if case.extra else out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("name", list(CASES))
def test_matches_transformers_block(tmp_path: Path, name: str) -> None:
    torch.manual_seed(0)
    case = CASES[name]
    model, layers = _build(case, tmp_path)
    family = model.config.model_type
    assert moe_layer_indices(tmp_path) == [i for i, layer in enumerate(layers) if _is_moe(layer)]
    loaded = load_moe_layer(tmp_path)
    assert loaded.spec.family == family and loaded.spec.num_experts == E
    x = torch.randn(3, 7, H, dtype=torch.float64)
    expected = _hf_layer(case, layers[loaded.layer], x)
    assert _rel(moe_reference(loaded.spec, loaded.weights, x), expected) < case.tol


def _same_weights(a: Any, b: Any) -> None:
    assert [n for n, _ in a.named()] == [n for n, _ in b.named()]
    for (name, x), (_, y) in zip(a.named(), b.named()):
        assert torch.equal(x, y), name


def _transpose_experts(tensors: dict[str, torch.Tensor]) -> None:
    """Qwen3-VL-MoE as released: stacked experts as x @ W ([E, H, 2I], [E, I, H])."""
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        tensors[name] = tensors[name].transpose(1, 2).contiguous()


def _rename(old: str, new: str) -> Callable[[dict[str, torch.Tensor]], None]:
    def edit(tensors: dict[str, torch.Tensor]) -> None:
        for name in [n for n in tensors if old in n]:
            tensors[name.replace(old, new)] = tensors.pop(name)
    return edit


@pytest.mark.parametrize("name, edit", [
    ("qwen3_vl_moe", _transpose_experts),
    ("kimi_k25", _rename("language_model.model.blocks.", "language_model.model.layers.")),
    ("aria", _rename("language_model.model.layers.", "model.language_model.layers.")),
    ("minimax_m3_vl", _rename("language_model.model.layers.", "model.language_model.layers.")),
], ids=["qwen3_vl_moe-released", "kimi_k25-released", "aria-in-memory", "minimax_m3_vl-in-memory"])
def test_other_spellings_of_a_layer_load_the_same(tmp_path: Path, name: str,
                                                  edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    """What transformers' conversions read besides what save_pretrained writes (the released files' layouts)."""
    from safetensors.torch import load_file, save_file
    torch.manual_seed(0)
    _build(CASES[name], tmp_path)
    saved = load_moe_layer(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    edit(tensors)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    other = load_moe_layer(tmp_path)
    assert other.sha256 != saved.sha256  # another file, the same layer
    _same_weights(saved.weights, other.weights)


def test_step3p5_text_checkpoint(tmp_path: Path) -> None:
    """Step-3.5 is Step-3.7's language model alone (transformers builds it only inside Step-3.7): the same
    tensors under model.layers, described by the text config."""
    torch.manual_seed(0)
    case = CASES["step3p7"]
    _, layers = _build(case, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config["text_config"], "model_type": "step3p5"}))
    loaded = load_moe_layer(tmp_path)
    assert loaded.spec.family == "step3p5" and moe_layer_indices(tmp_path) == [1]
    x = torch.randn(3, 7, H, dtype=torch.float64)
    assert _rel(moe_reference(loaded.spec, loaded.weights, x), _hf_layer(case, layers[1], x)) < case.tol


def test_multimodal_text_config_inherits_the_dtype() -> None:
    config = CASES["qwen3_vl_moe"].config().to_dict()
    config["text_config"].pop("dtype", None)
    assert spec_from_hf_config(dict(config, dtype="float16")).dtype.value == "fp16"
    config["text_config"]["dtype"] = "float32"
    assert spec_from_hf_config(dict(config, dtype="float16")).dtype.value == "fp32"


def test_every_supported_family_has_a_case() -> None:
    families = {case.config().model_type for case in CASES.values()}
    assert families | set(_EXISTING) | set(_TEXT_ONLY) == set(FAMILIES)


def test_routing_features_are_exercised() -> None:
    """The cases cover each routing method, grouping, correction biases, shared-expert kinds and activations."""
    specs = {name: spec_from_hf_config(case.config().to_dict()) for name, case in CASES.items()}
    assert {s.routing.method for s in specs.values()} == set(RoutingMethod)
    assert any(s.routing.num_groups > s.routing.topk_groups > 1 for s in specs.values())
    assert any(s.routing.correction_bias and s.routing.method is RoutingMethod.SIGMOID_GROUPED for s in specs.values())
    assert any(not s.routing.correction_bias and s.routing.method is RoutingMethod.SIGMOID_GROUPED
               for s in specs.values())
    assert any(s.shared.sigmoid_gate for s in specs.values()) and any(s.shared.count > 1 for s in specs.values())
    m3 = specs["minimax_m3_vl_text"]
    assert m3.activation is Activation.SWIGLU_CLAMP and m3.shared.count
    assert specs["openai_privacy_filter"].expert_bias and specs["openai_privacy_filter"].routing.router_bias


# ---- configs that a supported family refuses --------------------------------------------------------------

def _dict(name: str, **changes: Any) -> dict[str, Any]:
    config = CASES[name].config().to_dict()
    text = config.get("text_config", config)
    text.update(changes)
    return config


@pytest.mark.parametrize("config, field", [
    (_dict("cohere2_moe", shared_expert_combination_strategy="average"), "shared_expert_combination_strategy"),
    (_dict("dbrx", ffn_config={"ffn_hidden_size": I, "moe_num_experts": E, "moe_top_k": 2,
                               "moe_normalize_expert_weights": 2.0}), "ffn_config.moe_normalize_expert_weights"),
    (_dict("mistral4", n_group=4, topk_group=2), "topk_group"),
    (_dict("axk2", n_group=4, topk_group=2), "topk_group"),
    (_dict("laguna", moe_router_logit_softcapping=30.0), "moe_router_logit_softcapping"),
    (_dict("hunyuan_v1_moe", moe_topk=[2, 3]), "moe_topk"),
    (_dict("hunyuan_v1_moe", moe_intermediate_size=48), "moe_intermediate_size"),
    (_dict("hunyuan_v1_moe", num_shared_expert=2), "num_shared_expert"),
    (_dict("minimax", shared_intermediate_size=64), "shared_intermediate_size"),
    (_dict("aria_text", hidden_act="gelu_pytorch_tanh"), "hidden_act"),
    (_dict("hy_v3", mlp_bias=True), "mlp_bias"),
    (_dict("deepseek_ocr2", mlp_layer_types=None), "text_config.mlp_layer_types"),
    (_dict("qwen3_5_moe", num_experts_per_tok=9), "text_config.num_experts_per_tok"),
    (_dict("dbrx", ffn_config={"ffn_hidden_size": I, "moe_num_experts": E, "moe_top_k": 9}), "ffn_config.moe_top_k"),
    (_dict("glm4_moe", scoring_func="softmax"), "scoring_func"),
    (_dict("param2moe", score_function="softmax"), "score_function"),
    (_dict("param2moe", moe_shared_expert_intermediate_size=I), "moe_shared_expert_intermediate_size"),
    ({"model_type": "qwen3_vl_moe"}, "text_config"),
    (_dict("step3p7", swiglu_limits=[0.0, 7.0]), "text_config.swiglu_limits"),
    (_dict("step3p7", swiglu_limits_shared=[None, 16.0]), "text_config.swiglu_limits_shared"),
])
def test_supported_family_refuses_what_it_cannot_express(config: dict[str, Any], field: str) -> None:
    with pytest.raises(MoeBuildError) as err:
        spec_from_hf_config(config)
    assert err.value.field == field and err.value.exit_code == 2 and "\n" not in str(err.value)


def test_what_a_supported_family_accepts() -> None:
    """Released HunYuan configs spell some keys per layer (equal entries are one value); a Step clamp on a
    dense layer does not touch the MoE layers; Param2's released router keys that agree with transformers' port."""
    spec = spec_from_hf_config(_dict("hunyuan_v1_moe", moe_topk=[3], moe_intermediate_size=[I], num_shared_expert=[1]))
    assert (spec.top_k, spec.intermediate_size, spec.shared.intermediate_size) == (3, I, I)
    assert spec_from_hf_config(_dict("step3p7", swiglu_limits=[7.0, None], swiglu_limits_shared=[16.0, 0])).shared.count
    # without the correction bias, Param2's released code routes by the sigmoid scores alone
    spec = spec_from_hf_config(_dict("param2moe", score_function="sigmoid", moe_shared_expert_intermediate_size=2 * I))
    assert spec.routing.correction_bias and spec.shared.intermediate_size == 2 * I
    assert not spec_from_hf_config(_dict("param2moe", moe_router_enable_expert_bias=False)).routing.correction_bias


# ---- refused families ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_refused_family_names_its_missing_feature(model_type: str) -> None:
    architecture, missing = REFUSED[model_type]
    for config in ({"model_type": model_type}, {"model_type": model_type, "num_hidden_layers": 4}):
        for parse in (spec_from_hf_config, moe_layer_indices):
            with pytest.raises(MoeBuildError) as err:
                parse(config)
            text = str(err.value)
            assert err.value.field == "model_type" and err.value.exit_code == 2 and "\n" not in text
            assert text.startswith(f"model_type: {model_type!r} ({architecture}) is not supported: {missing}")
            assert "mixtral" in text  # the supported families are listed


# Model types in transformers' MoE model folders that are no MoE model of their own: the vision, audio and
# speech towers of multimodal models, and nested text configs without a causal-LM class (their language
# model is reached through the top-level model_type); and Bamba, whose layer class hard-codes one expert.
_TOWER = re.compile(r"_(vision|vision_model|vision_encoder|audio|audio_encoder|encoder|sam_vision_model|"
                    r"talker_text|talker_code_predictor|thinker)$")
_NO_EXPERTS = {"bamba"}


def _moe_model_types() -> set[str]:
    """Every model_type whose transformers folder has an experts module, or whose causal LM is built by such a
    folder's classes (Sarvam's configs reuse DeepSeek-V3's and GLM-4.5's models)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES, model_type_to_module_name
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as CAUSAL_LM
    root = Path(transformers.__file__).parent / "models"
    sources = {d.name: "".join(f.read_text(encoding="utf-8") for f in d.glob("modeling_*.py"))
               for d in root.iterdir() if d.is_dir()}
    moe_dirs = {name for name, text in sources.items() if "experts" in text}
    moe_classes = {c for name in moe_dirs for c in re.findall(r"^class (\w+)\(", sources[name], re.M)}
    return {mt for mt in CONFIG_MAPPING_NAMES
            if model_type_to_module_name(mt) in moe_dirs or CAUSAL_LM.get(mt) in moe_classes}


def test_every_transformers_moe_family_is_supported_or_refused() -> None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as CAUSAL_LM
    unclassified = {mt for mt in _moe_model_types() - set(FAMILIES) - set(REFUSED) - _NO_EXPERTS
                    if not _TOWER.search(mt) and not (mt.endswith("_text") and mt not in CAUSAL_LM)}
    assert not unclassified, f"MoE model types neither supported nor refused: {sorted(unclassified)}"
    assert not set(FAMILIES) & set(REFUSED)
