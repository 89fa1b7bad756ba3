"""The OOTB ONNX graph against the fp64 reference, one export per routing/activation/shared variant.

The comparison runs through Polygraphy's Comparator: the exported graph in one runner (onnxruntime,
or ONNX's own reference evaluator for bf16, which onnxruntime's CPU provider cannot run), and
`moe_reference` in fp64 in another, on fresh random inputs. Each output must pass Polygraphy's
element-wise check (per element, |got - want| <= ELEMENTWISE_TOL * rms(want) or <= ELEMENTWISE_TOL
* |want|) and the norm-wise bound ||got - want|| / ||want|| < TOL.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from polygraphy.backend.base import BaseRunner
from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
from polygraphy.common import TensorMetadata
from polygraphy.comparator import Comparator, SimpleCompareFunc
from polygraphy.logger import G_LOGGER

from moe_build.errors import MoeBuildError
from moe_build.graph.ootb import export_onnx
from moe_build.planner import make_plan
from moe_build.reference import moe_reference
from moe_build.spec import Activation, DType, MoESpec, Routing, RoutingMethod, SharedExperts
from moe_build.target import Flavour, MoePlugin, Target
from moe_build.weights import MoEWeights
from moe_build.weights.dtypes import TORCH_DTYPE

TOL = {DType.FP32: 1e-5, DType.FP16: 1e-2, DType.BF16: 1e-2}
# Per element: bf16's unit roundoff (2^-8) is 8x fp16's, and its GEMMs round every intermediate, so
# its worst element sits near 3 bf16 ulps (measured 1.1e-2); 4e-2 is about 10 ulps.
ELEMENTWISE_TOL = {DType.FP32: 1e-5, DType.FP16: 1e-2, DType.BF16: 4e-2}
TOKENS = 13  # differs from the export's example batch, so the dynamic token dim is exercised
# The ONNX graph is flavour-independent; full TensorRT (plugin disabled) admits both expert-compute choices.
TARGET = Target(sm=89, flavour=Flavour.TENSORRT, moe_plugin=MoePlugin.DISABLE)


def _spec(**kw: object) -> MoESpec:
    base: dict[str, object] = dict(hidden_size=32, intermediate_size=48, num_experts=8, top_k=2, dtype=DType.FP32)
    base.update(kw)
    return MoESpec(**base)  # type: ignore[arg-type]


def _metadata(feeds: dict[str, torch.Tensor]) -> TensorMetadata:
    """The feeds' names and dtypes, with a dynamic token dimension."""
    meta = TensorMetadata()
    for name, t in feeds.items():
        meta.add(name, t.dtype, (None, *t.shape[1:]))
    return meta


class ReferenceRunner(BaseRunner):
    """`moe_reference` in fp64 as a Polygraphy runner: the expected output, computed without the graph."""

    def __init__(self, spec: MoESpec, weights: MoEWeights, feeds: dict[str, torch.Tensor]):
        super().__init__(name="moe_reference-fp64")
        self.spec, self.weights, self.meta = spec, weights, _metadata(feeds)

    def get_input_metadata_impl(self) -> TensorMetadata:
        return self.meta

    def infer_impl(self, feed_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        start = time.perf_counter()
        routing = {k: (v.long() if k == "topk_ids" else v) for k, v in feed_dict.items() if k != "hidden"}
        out = moe_reference(self.spec, self.weights, feed_dict["hidden"], **routing)
        self.inference_time = time.perf_counter() - start
        return {"output": out}


class OnnxReferenceEvaluatorRunner(BaseRunner):
    """The graph in ONNX's own evaluator (onnx.reference): it runs bf16, which onnxruntime's CPU
    provider does not; bf16 crosses into numpy as ml_dtypes.bfloat16."""

    def __init__(self, path: Path, feeds: dict[str, torch.Tensor]):
        super().__init__(name="onnx-reference-evaluator")
        self.path, self.meta = path, _metadata(feeds)

    def activate_impl(self) -> None:
        from onnx.reference import ReferenceEvaluator
        self.evaluator = ReferenceEvaluator(str(self.path))

    def get_input_metadata_impl(self) -> TensorMetadata:
        return self.meta

    def infer_impl(self, feed_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        import ml_dtypes

        def numpy(t: torch.Tensor) -> np.ndarray:
            return t.float().numpy().astype(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16 else t.numpy()

        start = time.perf_counter()
        (out,) = self.evaluator.run(None, {k: numpy(v) for k, v in feed_dict.items()})
        self.inference_time = time.perf_counter() - start
        return {"output": torch.from_numpy(np.asarray(out, dtype=np.float32))}


def _graph_runner(path: Path, spec: MoESpec, feeds: dict[str, torch.Tensor]) -> BaseRunner:
    if spec.dtype is DType.BF16:
        return OnnxReferenceEvaluatorRunner(path, feeds)
    return OnnxrtRunner(SessionFromOnnx(str(path), providers=["CPUExecutionProvider"]))


def _check(tmp_path: Path, spec: MoESpec, expert_compute: str, seed: int, routing_input: str = "hidden") -> float:
    """Export with fresh random weights, compare on fresh random tokens (Polygraphy's element-wise check,
    asserted here), and return the norm-wise relative error."""
    dtype = TORCH_DTYPE[spec.dtype]
    weights = MoEWeights.random(spec, seed=seed).to(dtype=dtype)  # the reference sees the rounded weights
    plan = make_plan(spec, TARGET, force={"expert_compute": expert_compute})
    path = export_onnx(spec, weights, plan, tmp_path / "moe.onnx", routing_input=routing_input)
    g = torch.Generator().manual_seed(seed + 1)
    feeds = {"hidden": torch.randn(TOKENS, spec.hidden_size, generator=g).to(dtype)}
    if routing_input == "logits":
        feeds["router_logits"] = torch.randn(TOKENS, spec.num_experts, generator=g).to(dtype)
    elif routing_input == "topk":  # distinct experts per token, random positive weights
        feeds["topk_ids"] = torch.stack([torch.randperm(spec.num_experts, generator=g)[: spec.top_k]
                                         for _ in range(TOKENS)]).int()
        feeds["topk_weights"] = torch.rand(TOKENS, spec.top_k, generator=g)
    with G_LOGGER.verbosity(G_LOGGER.ERROR):
        results = Comparator.run([_graph_runner(path, spec, feeds), ReferenceRunner(spec, weights, feeds)],
                                 data_loader=[feeds])
        (_, (graph_out,)), (_, (want_out,)) = results.items()
        got, want = graph_out["output"].double(), want_out["output"]
        assert got.shape == want.shape == (TOKENS, spec.hidden_size)
        tol, rms = ELEMENTWISE_TOL[spec.dtype], float(want.pow(2).mean().sqrt())
        accuracy = Comparator.compare_accuracy(results, compare_func=SimpleCompareFunc(rtol=tol, atol=tol * rms))
    assert accuracy, f"element-wise: some |got - want| exceed both {tol * rms:.2e} and {tol:.0e} * |want|"
    return float(torch.linalg.norm(got - want) / torch.linalg.norm(want))


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
