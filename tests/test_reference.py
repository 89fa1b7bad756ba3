"""moe_reference against transformers' own MoE blocks, through our checkpoint loader.

Each family: a tiny random model built offline by transformers -> save_pretrained -> our loader
-> our reference, compared with the Hugging Face sparse-MoE block run in fp64 on fresh random
inputs. transformers' routers compute in fp32 (hence the 1e-6 end-to-end bound); with their
routing pinned the expert math must agree to fp64 round-off.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from moe_build.weights.checkpoint import LoadedLayer, load_moe_layer, load_moe_layers
from moe_build.errors import MoeBuildError
from moe_build.reference import moe_reference, route
from moe_build.spec import Activation, MoESpec, Routing, RoutingMethod, SharedExperts
from moe_build.weights import MoEWeights

transformers = pytest.importorskip("transformers")

_ATTN = dict(num_attention_heads=2, num_key_value_heads=2, vocab_size=64)
_MLA = dict(kv_lora_rank=8, q_lora_rank=None, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=4)


def _configs() -> dict[str, Any]:
    t = transformers
    return {
        "mixtral": t.MixtralConfig(**_ATTN, hidden_size=32, intermediate_size=16, num_local_experts=8,
                                   num_experts_per_tok=2, num_hidden_layers=1),
        "qwen2_moe": t.Qwen2MoeConfig(**_ATTN, hidden_size=32, intermediate_size=40, moe_intermediate_size=16,
                                      shared_expert_intermediate_size=24, num_experts=8, num_experts_per_tok=3,
                                      num_hidden_layers=1),
        "qwen3_moe": t.Qwen3MoeConfig(**_ATTN, hidden_size=32, intermediate_size=40, moe_intermediate_size=16,
                                      num_experts=8, num_experts_per_tok=3, norm_topk_prob=True, head_dim=16,
                                      num_hidden_layers=1),
        "qwen3_moe_geglu": t.Qwen3MoeConfig(**_ATTN, hidden_size=32, intermediate_size=40, moe_intermediate_size=16,
                                            num_experts=8, num_experts_per_tok=2, head_dim=16, num_hidden_layers=1,
                                            hidden_act="gelu_pytorch_tanh"),
        "olmoe": t.OlmoeConfig(**_ATTN, hidden_size=32, intermediate_size=16, num_experts=8, num_experts_per_tok=2,
                               num_hidden_layers=1),
        "deepseek_v2": t.DeepseekV2Config(**_ATTN, **_MLA, hidden_size=32, intermediate_size=40,
                                          moe_intermediate_size=16, n_routed_experts=16, num_experts_per_tok=3,
                                          n_shared_experts=2, first_k_dense_replace=1, num_hidden_layers=2,
                                          topk_method="group_limited_greedy", n_group=4, topk_group=2,
                                          routed_scaling_factor=2.0),
        "deepseek_v3": t.DeepseekV3Config(**_ATTN, **dict(_MLA, q_lora_rank=8), hidden_size=32, intermediate_size=40,
                                          moe_intermediate_size=16, n_routed_experts=16, num_experts_per_tok=4,
                                          n_shared_experts=1, first_k_dense_replace=1, num_hidden_layers=2,
                                          n_group=4, topk_group=2, routed_scaling_factor=2.5),
        "gpt_oss": t.GptOssConfig(**_ATTN, hidden_size=32, intermediate_size=16, num_local_experts=8,
                                  num_experts_per_tok=3, head_dim=16, num_hidden_layers=1,
                                  layer_types=["full_attention"], swiglu_limit=1.0),
    }


def _randomize_moe(model: torch.nn.Module) -> None:
    """Unit-scale random MoE weights (the init's std=0.02 would leave routing and clamps untested)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".mlp." in name:
                p.copy_(torch.randn_like(p) / (p.shape[-1] ** 0.5 if p.dim() > 1 else 2.0))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.1)


def build_hf(config: Any, folder: Path, **save: Any) -> torch.nn.Module:
    """A random transformers model saved to `folder` (fp32), returned in fp64 with eager experts."""
    model = transformers.AutoModelForCausalLM.from_config(config, experts_implementation="eager")
    _randomize_moe(model)
    model.save_pretrained(folder, **save)
    return model.double().eval()


def _hf_block(model: torch.nn.Module, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The HF block's output and its router's (ids, weights) for x [B, S, H]."""
    mlp = model.model.layers[layer].mlp
    router = mlp.router if hasattr(mlp, "router") else mlp.gate
    with torch.no_grad():
        out = mlp(x)
        _, weights, ids = router(x.reshape(-1, x.shape[-1]))
    return (out[0] if isinstance(out, tuple) else out), ids, weights


def _sorted(ids: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    order = ids.argsort(dim=-1)
    return ids.gather(1, order), weights.gather(1, order)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("family", list(_configs()))
def test_matches_transformers_block(tmp_path: Path, family: str) -> None:
    config = _configs()[family]
    model = build_hf(config, tmp_path)
    loaded = load_moe_layer(tmp_path)
    x = torch.randn(3, 7, config.hidden_size, dtype=torch.float64)
    hf_out, hf_ids, hf_w = _hf_block(model, loaded.layer, x)

    assert _rel(moe_reference(loaded.spec, loaded.weights, x), hf_out) < 1e-6

    # same experts and weights from our router, given the HF router's logits
    w = loaded.weights.to(dtype=torch.float64)
    logits = torch.nn.functional.linear(x.reshape(-1, config.hidden_size), w.router_weight, w.router_bias)
    ids, weights = route(loaded.spec, logits, w.correction_bias)
    (a, wa), (b, wb) = _sorted(ids, weights), _sorted(hf_ids.long(), hf_w.double())
    assert torch.equal(a, b)
    torch.testing.assert_close(wa, wb, rtol=1e-6, atol=1e-7)

    # with HF's routing pinned, the expert math agrees to fp64 round-off
    pinned = moe_reference(loaded.spec, loaded.weights, x.reshape(-1, config.hidden_size),
                           topk_ids=hf_ids, topk_weights=hf_w)
    assert _rel(pinned, hf_out.reshape(-1, config.hidden_size)) < 1e-12


def test_gpt_oss_clamp_is_exercised(tmp_path: Path) -> None:
    """The GPT-OSS comparison only tests the clamp if pre-activations actually exceed the limit."""
    config = _configs()["gpt_oss"]
    build_hf(config, tmp_path)
    loaded = load_moe_layer(tmp_path)
    x = torch.randn(64, config.hidden_size, dtype=torch.float64)
    pre = torch.einsum("th,enh->ten", x, loaded.weights.w1.double()) + loaded.weights.b1.double()
    assert (pre > config.swiglu_limit).any() and (pre < -config.swiglu_limit).any()


def test_every_moe_layer(tmp_path: Path) -> None:
    config = transformers.DeepseekV3Config(**_ATTN, **dict(_MLA, q_lora_rank=8), hidden_size=32, intermediate_size=40,
                                           moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2,
                                           n_shared_experts=1, first_k_dense_replace=1, num_hidden_layers=3,
                                           n_group=2, topk_group=1)
    model = build_hf(config, tmp_path)
    layers = load_moe_layers(tmp_path)
    assert [ld.layer for ld in layers] == [1, 2] and layers[0].sha256 != layers[1].sha256
    x = torch.randn(9, config.hidden_size, dtype=torch.float64)
    for ld in layers:
        assert _rel(moe_reference(ld.spec, ld.weights, x), _hf_block(model, ld.layer, x[None])[0][0]) < 1e-6


# ---- reference-only behaviour ------------------------------------------------------------


def _spec(**kw: Any) -> MoESpec:
    return MoESpec(**{**dict(hidden_size=16, intermediate_size=8, num_experts=4, top_k=2, dtype="fp32"), **kw})


@pytest.mark.parametrize("activation, module", [
    (Activation.SILU, torch.nn.SiLU()), (Activation.GELU, torch.nn.GELU(approximate="tanh")),
    (Activation.RELU, torch.nn.ReLU()), (Activation.IDENTITY, torch.nn.Identity())])
def test_ungated_single_expert_is_a_plain_mlp(activation: Activation, module: torch.nn.Module) -> None:
    """With one expert chosen with weight 1, the layer is Linear -> act -> Linear."""
    spec = _spec(num_experts=1, top_k=1, activation=activation, routing=Routing(RoutingMethod.TOPK_SOFTMAX))
    w = MoEWeights.random(spec, seed=int(torch.randint(0, 2**31, ())), dtype=torch.float64)
    fc1, fc2 = torch.nn.Linear(16, 8, bias=False).double(), torch.nn.Linear(8, 16, bias=False).double()
    with torch.no_grad():
        fc1.weight.copy_(w.w1[0]), fc2.weight.copy_(w.w2[0])
        x = torch.randn(5, 16, dtype=torch.float64)
        assert _rel(moe_reference(spec, w, x), torch.nn.Sequential(fc1, module, fc2)(x)) < 1e-14


def test_shapes_dtypes_and_pinned_routing() -> None:
    spec = _spec(shared=SharedExperts(count=1, intermediate_size=8, sigmoid_gate=True))
    w = MoEWeights.random(spec, seed=int(torch.randint(0, 2**31, ())))
    x = torch.randn(2, 3, 16)
    out = moe_reference(spec, w, x)
    assert out.shape == x.shape and out.dtype == torch.float64
    assert moe_reference(spec, w, x, dtype=torch.float32).dtype == torch.float32
    logits = torch.nn.functional.linear(x.reshape(6, 16).double(), w.router_weight.double())
    assert torch.equal(moe_reference(spec, w, x.reshape(6, 16), router_logits=logits), out.reshape(6, 16))
    ids, weights = route(spec, logits)
    assert ids.dtype == torch.int64 and ids.shape == weights.shape == (6, 2)
    assert torch.equal(moe_reference(spec, w, x.reshape(6, 16), topk_ids=ids, topk_weights=weights), out.reshape(6, 16))


@pytest.mark.parametrize("kwargs, field", [
    (dict(hidden=torch.randn(4, 15)), "hidden"),
    (dict(topk_ids=torch.zeros(4, 2, dtype=torch.long)), "topk_ids"),
    (dict(topk_ids=torch.full((4, 2), 4), topk_weights=torch.ones(4, 2)), "topk_ids"),
    (dict(router_logits=torch.randn(4, 3)), "router_logits"),
])
def test_bad_reference_inputs(kwargs: dict[str, Any], field: str) -> None:
    spec = _spec()
    args = {"hidden": torch.randn(4, 16), **kwargs}
    with pytest.raises(MoeBuildError) as err:
        moe_reference(spec, MoEWeights.random(spec), **args)
    assert err.value.field == field


def test_loaded_layer_type(tmp_path: Path) -> None:
    build_hf(_configs()["olmoe"], tmp_path)
    assert isinstance(load_moe_layer(tmp_path), LoadedLayer)


@pytest.mark.parametrize("routing", [Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=True),
                                     Routing(RoutingMethod.TOPK_SOFTMAX),
                                     Routing(RoutingMethod.SIGMOID_GROUPED, num_groups=4, topk_groups=2,
                                             renormalize=True)], ids=["softmax_topk", "topk_softmax", "grouped"])
def test_routing_ties_break_toward_the_lower_expert(routing: Routing) -> None:
    """Exact ties (bf16 router logits have them often) pick the lower expert id, larger first otherwise: the routing
    kernel's order (cpp/src/stages/routing.cu; tests/gpu/test_stage_kernels.py holds the kernel to it). Here experts
    3 and 10 tie for the last of 4 slots, and with groups (4 of 4 experts, the best 2 by their top-2 sum) groups 0
    and 2 tie for the second group."""
    spec = MoESpec(64, 64, 16, 4, routing=routing)
    logits = torch.full((1, 16), -3.0, dtype=torch.float64)
    logits[0, [0, 1, 2, 3, 10]] = torch.tensor([2.0, 1.5, 1.25, 1.0, 1.0], dtype=torch.float64)
    if routing.num_groups > 1:  # group 1 is best (3.0 + 2.5); groups 0 and 2 tie for second (2.0 + 1.5 each)
        logits = torch.full((1, 16), -3.0, dtype=torch.float64)
        logits[0, [0, 1, 8, 9, 4, 5]] = torch.tensor([2.0, 1.5, 2.0, 1.5, 3.0, 2.5], dtype=torch.float64)
        assert route(spec, logits)[0].tolist() == [[4, 5, 0, 1]]
        return
    assert route(spec, logits)[0].tolist() == [[0, 1, 2, 3]]
    assert route(spec, logits.flip(-1))[0].tolist() == [[15, 14, 13, 5]]  # 12 and 5 tie: 5 first
