"""The OOTB ONNX graph against the fp64 reference, one export per routing/activation/shared variant.

fp32/fp16 graphs run in onnxruntime; onnxruntime's CPU provider has no bf16 kernels, so bf16
graphs run in ONNX's own reference evaluator (onnx.reference).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from moe_build.errors import MoeBuildError
from moe_build.ootb_graph import TORCH_DTYPES, export_onnx
from moe_build.planner import make_plan
from moe_build.reference import moe_reference
from moe_build.spec import Activation, DType, MoESpec, Routing, RoutingMethod, SharedExperts
from moe_build.target import Flavour, MoePlugin, Target
from moe_build.weights import MoEWeights

TOL = {DType.FP32: 1e-5, DType.FP16: 1e-2, DType.BF16: 1e-2}
TOKENS = 13  # differs from the export's example batch, so the dynamic token dim is exercised
# The ONNX graph is flavour-independent; full TensorRT (plugin disabled) admits both expert-compute choices.
TARGET = Target(sm=89, flavour=Flavour.TENSORRT, moe_plugin=MoePlugin.DISABLE)


def _spec(**kw: object) -> MoESpec:
    base: dict[str, object] = dict(hidden_size=32, intermediate_size=48, num_experts=8, top_k=2, dtype=DType.FP32)
    base.update(kw)
    return MoESpec(**base)  # type: ignore[arg-type]


def _run(path: Path, spec: MoESpec, feeds: dict[str, torch.Tensor]) -> np.ndarray:
    if spec.dtype is DType.BF16:
        import ml_dtypes
        from onnx.reference import ReferenceEvaluator
        arrays = {k: v.float().numpy().astype(ml_dtypes.bfloat16) for k, v in feeds.items()}
        return np.asarray(ReferenceEvaluator(str(path)).run(None, arrays)[0], dtype=np.float64)
    import onnxruntime as ort
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {k: v.numpy() for k, v in feeds.items()})[0].astype(np.float64)


def _check(tmp_path: Path, spec: MoESpec, expert_compute: str, seed: int, routing_input: str = "hidden") -> float:
    """Export with fresh random weights, run on fresh random tokens, return the norm-wise rel error."""
    dtype = TORCH_DTYPES[spec.dtype]
    weights = MoEWeights.random(spec, seed=seed).to(dtype=dtype)  # the reference sees the rounded weights
    plan = make_plan(spec, TARGET, force={"expert_compute": expert_compute})
    path = export_onnx(spec, weights, plan, tmp_path / "moe.onnx", routing_input=routing_input)
    g = torch.Generator().manual_seed(seed + 1)
    hidden = torch.randn(TOKENS, spec.hidden_size, generator=g).to(dtype)
    feeds = {"hidden": hidden}
    routing: dict[str, torch.Tensor] = {}
    if routing_input == "logits":
        routing["router_logits"] = torch.randn(TOKENS, spec.num_experts, generator=g).to(dtype)
    elif routing_input == "topk":  # distinct experts per token, random positive weights
        routing["topk_ids"] = torch.stack([torch.randperm(spec.num_experts, generator=g)[: spec.top_k]
                                           for _ in range(TOKENS)]).int()
        routing["topk_weights"] = torch.rand(TOKENS, spec.top_k, generator=g)
    feeds.update(routing)
    got = _run(path, spec, feeds)
    ref_kw = {k: (v.long() if k == "topk_ids" else v) for k, v in routing.items()}
    want = moe_reference(spec, weights, hidden, **ref_kw).numpy()
    assert got.shape == want.shape
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


CASES = {
    "softmax_topk": _spec(routing=Routing(RoutingMethod.SOFTMAX_TOPK)),
    "softmax_topk_renorm": _spec(routing=Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=True), top_k=3),
    "softmax_topk_grouped": _spec(routing=Routing(RoutingMethod.SOFTMAX_TOPK, num_groups=4, topk_groups=2)),
    "topk_softmax": _spec(routing=Routing(RoutingMethod.TOPK_SOFTMAX)),
    "sigmoid_grouped": _spec(num_experts=16, top_k=4,
                             routing=Routing(RoutingMethod.SIGMOID_GROUPED, renormalize=True, num_groups=4,
                                             topk_groups=2, routed_scaling_factor=2.5, correction_bias=True)),
    "geglu": _spec(activation=Activation.GEGLU),
    "silu": _spec(activation=Activation.SILU),
    "gelu": _spec(activation=Activation.GELU),
    "relu": _spec(activation=Activation.RELU),
    "identity": _spec(activation=Activation.IDENTITY),
    "gpt_oss": _spec(activation=Activation.SWIGLU_CLAMP, expert_bias=True, swiglu_limit=0.5,
                     routing=Routing(RoutingMethod.TOPK_SOFTMAX, router_bias=True)),
    "qwen2_shared": _spec(shared=SharedExperts(count=1, intermediate_size=64, sigmoid_gate=True)),
    "deepseek_shared_fp16": _spec(dtype=DType.FP16, shared=SharedExperts(count=2, intermediate_size=96),
                                  routing=Routing(RoutingMethod.SIGMOID_GROUPED, correction_bias=True)),
    "bf16": _spec(dtype=DType.BF16, routing=Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=True)),
}
# Each case runs one expert-compute choice (alternating), to keep the suite fast; both choices
# see gated/non-gated, shared, grouped routing and a 16-bit dtype.
CHOICES = {name: ("dense_masked", "per_expert_gather")[i % 2] for i, name in enumerate(CASES)}


@pytest.mark.parametrize("name", list(CASES))
def test_onnx_matches_reference(tmp_path: Path, name: str) -> None:
    spec = CASES[name]
    err = _check(tmp_path, spec, CHOICES[name], seed=len(name))
    assert err < TOL[spec.dtype], f"{name}: rel err {err:.2e}"


@pytest.mark.parametrize("expert_compute", ["dense_masked", "per_expert_gather"])
@pytest.mark.parametrize("routing_input", ["logits", "topk"])
def test_precomputed_routing_inputs(tmp_path: Path, expert_compute: str, routing_input: str) -> None:
    spec = _spec(dtype=DType.FP16, routing=Routing(RoutingMethod.TOPK_SOFTMAX))
    assert _check(tmp_path, spec, expert_compute, seed=3, routing_input=routing_input) < TOL[DType.FP16]


def test_graph_follows_plan_and_has_dynamic_tokens(tmp_path: Path) -> None:
    spec = _spec()
    weights = MoEWeights.random(spec)
    ops = {}
    for choice in ("dense_masked", "per_expert_gather"):
        plan = make_plan(spec, TARGET, force={"expert_compute": choice})
        model = onnx.load(str(export_onnx(spec, weights, plan, tmp_path / f"{choice}.onnx")))
        ops[choice] = [n.op_type for n in model.graph.node]
        (inp,) = model.graph.input
        dims = inp.type.tensor_type.shape.dim
        assert inp.name == "hidden" and dims[0].dim_param and dims[1].dim_value == spec.hidden_size
        assert {i.name for i in model.graph.initializer} >= {"w1", "w2", "router_weight"}
    assert "NonZero" not in ops["dense_masked"]
    assert ops["per_expert_gather"].count("NonZero") == spec.num_experts


def test_export_refuses_plugin_plan(tmp_path: Path) -> None:
    spec = _spec()
    plugin_plan = make_plan(spec, Target(sm=90, flavour=Flavour.TENSORRT, moe_plugin=MoePlugin.AUTO))
    assert plugin_plan.path == "plugin"
    with pytest.raises(MoeBuildError, match="path"):
        export_onnx(spec, MoEWeights.random(spec), plugin_plan, tmp_path / "x.onnx")


@pytest.mark.parametrize("dtype,elem", [(DType.FP16, onnx.TensorProto.FLOAT16), (DType.BF16, onnx.TensorProto.BFLOAT16),
                                        (DType.FP32, onnx.TensorProto.FLOAT)])
def test_graph_output_has_the_spec_dtype(tmp_path: Path, dtype: DType, elem: int) -> None:
    spec = _spec(dtype=dtype)
    plan = make_plan(spec, TARGET, force={"expert_compute": "dense_masked"})
    model = onnx.load(str(export_onnx(spec, MoEWeights.random(spec), plan, tmp_path / "m.onnx")))
    (out,) = model.graph.output
    assert out.type.tensor_type.elem_type == elem
    assert model.graph.input[0].type.tensor_type.elem_type == elem
