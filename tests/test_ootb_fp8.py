"""The OOTB graph of FP8 layers (quant fp8 / fp8_block): its numbers against the fp64 reference, its FP8
initializers, real TensorRT-RTX engines for SM 89 and SM 120 with the manifest's quant record, and the
planner's refusals.

Error bound of the numerics tests, per token row (row error = ||got_t - want_t|| / ||want_t||):
- the graph runs the expert GEMMs in fp32, `moe_reference` in fp64 with the same FP8 emulation
  (moe_build/weights/fp8.py), so a row agrees to fp32 accumulation (measured <= 3.6e-6 per row, 3e-7..1e-6
  norm-wise; ROW_TOL 1e-5), or to the output's rounding in a bf16 graph (2^-9; measured 1.8e-3 per row;
  ROW_TOL 4e-3, two bf16 ulps);
- except where fp32 and fp64 values of one GEMM input element straddle an FP8 rounding boundary: there the
  two quantize to neighbouring FP8 values, and that token's row moves by up to ~1e-1 (one FP8 step, 1/16 to
  1/8 of the largest element, of a row of ~200 elements; measured by forcing one flip: 1e-2..3e-2 norm-wise
  over 13..64 rows). Such a flip needs the two values within ~1e-7 relative of a boundary 1/16 apart, so it
  is rare (none in these seeded cases here) but can come with another machine's fp32 summation order: at
  most MAX_FLIP_ROWS rows may exceed ROW_TOL, and never FLIP_ROW_TOL.
The bound is tight enough to see the FP8 math itself: leaving the activations unquantized (FP8 weights
only) moves nearly every row by more than SEEN x ROW_TOL (measured 1.8e-2..4e-1 per row; asserted beside
each case).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from cli_process import run_moe_build

from moe_build.engine.build import build_engine
from moe_build.engine.inspect import inspect_engine
from moe_build.engine.manifest import verify
from moe_build.engine.options import BuildOptions
from moe_build.errors import UnsupportedCombination
from moe_build.graph.ootb import export_onnx
from moe_build.planner import make_plan
from moe_build.reference import moe_reference
from moe_build.spec import ActScale, Activation, DType, MoESpec, Quant, Routing, RoutingMethod, SharedExperts
from moe_build.target import Flavour, MoePlugin, Target, TokenProfile
from moe_build.weights import MoEWeights
from moe_build.weights.dtypes import TORCH_DTYPE
from moe_build.weights.fp8 import ScaleGranularity

ROW_TOL = {DType.FP32: 1e-5, DType.BF16: 4e-3}
MAX_FLIP_ROWS = 1
FLIP_ROW_TOL = 0.25
SEEN = 5
TOKENS = 21  # not the export's example batch: the dynamic token dimension is exercised
# Static activation scales small enough that some GEMM inputs saturate at +-448 (|x| > 2.7, |h| > 3.6).
A1_SCALE, A2_SCALE = 0.006, 0.008
# The ONNX graph does not depend on the flavour; full TensorRT (plugin disabled) admits both expert computes.
FULL_TRT = Target(sm=89, flavour=Flavour.TENSORRT, moe_plugin=MoePlugin.DISABLE)


@dataclasses.dataclass(frozen=True)
class Case:
    base: MoESpec                   # the layer without quantization (what MoEWeights.random makes)
    granularity: ScaleGranularity
    static: bool
    expert_compute: str
    routing_input: str = "hidden"

    @property
    def spec(self) -> MoESpec:
        quant = Quant.FP8_BLOCK if self.granularity is ScaleGranularity.BLOCK128 else Quant.FP8
        act_scale = ActScale.STATIC if self.static else ActScale.DYNAMIC
        return dataclasses.replace(self.base, quant=quant, act_scale=act_scale)

    def weights(self, seed: int) -> MoEWeights:
        dtype = TORCH_DTYPE[self.base.dtype]  # the reference sees the graph's rounded router / shared weights
        return (MoEWeights.random(self.base, seed).to(dtype=dtype)
                .quantized_fp8(self.granularity, static=self.static, a1_scale=A1_SCALE, a2_scale=A2_SCALE))


def _base(hidden: int, inter: int, experts: int, top_k: int, **kw: object) -> MoESpec:
    return MoESpec(hidden, inter, experts, top_k, dtype=kw.pop("dtype", DType.FP32), **kw)  # type: ignore[arg-type]


G = ScaleGranularity
CASES = {
    "tensor_static_top2_dense": Case(_base(256, 128, 8, 2), G.TENSOR, True, "dense_masked"),
    "tensor_dynamic_top1_gather_off128": Case(_base(200, 136, 8, 1), G.TENSOR, False, "per_expert_gather"),
    "tensor_dynamic_top4_topk_input": Case(_base(192, 96, 16, 4), G.TENSOR, False, "dense_masked", "topk"),
    "channel_dynamic_top2_dense_off128_shared": Case(
        _base(200, 136, 4, 2, shared=SharedExperts(count=1, intermediate_size=64)), G.CHANNEL, False, "dense_masked"),
    "channel_static_top3_gather_biases": Case(
        _base(128, 256, 8, 3, activation=Activation.SWIGLU_CLAMP, expert_bias=True,
              routing=Routing(RoutingMethod.TOPK_SOFTMAX, router_bias=True)), G.CHANNEL, True, "per_expert_gather"),
    "block128_dynamic_top2_dense": Case(_base(256, 384, 4, 2), G.BLOCK128, False, "dense_masked"),
    "block128_dynamic_top1_gather_off128": Case(_base(200, 136, 8, 1), G.BLOCK128, False, "per_expert_gather"),
    "block128_bf16_top2_dense_off128": Case(_base(320, 72, 8, 2, dtype=DType.BF16), G.BLOCK128, False, "dense_masked"),
}


def _feeds(case: Case, seed: int) -> dict[str, torch.Tensor]:
    spec, g = case.spec, torch.Generator().manual_seed(seed + 1)
    feeds = {"hidden": torch.randn(TOKENS, spec.hidden_size, generator=g).to(TORCH_DTYPE[spec.dtype])}
    if case.routing_input == "topk":  # distinct experts per token, random positive weights
        feeds["topk_ids"] = torch.stack([torch.randperm(spec.num_experts, generator=g)[: spec.top_k]
                                         for _ in range(TOKENS)]).int()
        feeds["topk_weights"] = torch.rand(TOKENS, spec.top_k, generator=g)
    return feeds


def _run_graph(path: Path, dtype: DType, feeds: dict[str, torch.Tensor]) -> torch.Tensor:
    """onnxruntime (CPU) for fp32 graphs; ONNX's own evaluator for bf16, which onnxruntime's CPU provider lacks."""
    if dtype is DType.BF16:
        import ml_dtypes
        from onnx.reference import ReferenceEvaluator
        inputs = {k: v.float().numpy().astype(ml_dtypes.bfloat16) if v.dtype == torch.bfloat16 else v.numpy()
                  for k, v in feeds.items()}
        (out,) = ReferenceEvaluator(str(path)).run(None, inputs)
    else:
        import onnxruntime as ort
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (out,) = session.run(None, {k: v.numpy() for k, v in feeds.items()})
    return torch.from_numpy(np.asarray(out, dtype=np.float64))


def _row_errors(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    return (got - want).norm(dim=1) / want.norm(dim=1)


def _reference(spec: MoESpec, weights: MoEWeights, feeds: dict[str, torch.Tensor]) -> torch.Tensor:
    routing = {k: (v.long() if k == "topk_ids" else v) for k, v in feeds.items() if k != "hidden"}
    return moe_reference(spec, weights, feeds["hidden"], **routing)


@pytest.mark.parametrize("name", CASES)
def test_fp8_graph_matches_the_fp8_reference(name: str, tmp_path: Path) -> None:
    case, seed = CASES[name], 7
    spec, weights = case.spec, case.weights(seed)
    plan = make_plan(spec, FULL_TRT, force={"expert_compute": case.expert_compute})
    path = export_onnx(spec, weights, plan, tmp_path / "moe.onnx", routing_input=case.routing_input)
    feeds = _feeds(case, seed)
    got, want = _run_graph(path, spec.dtype, feeds), _reference(spec, weights, feeds)
    rows = _row_errors(got, want)
    tol = ROW_TOL[spec.dtype]
    off = int((rows > tol).sum())
    norm_wise = float((got - want).norm() / want.norm())
    assert off <= MAX_FLIP_ROWS and float(rows.max()) < FLIP_ROW_TOL, \
        f"{off} rows beyond {tol:.0e} (worst {float(rows.max()):.2e}); norm-wise {norm_wise:.2e}"
    # The FP8 activation quantization is visible at this bound: without it (FP8 weights only) rows fail.
    unquantized = _reference(case.base, weights.dequantized(torch.float64), feeds)
    assert float((_row_errors(unquantized, want) > SEEN * tol).float().mean()) > 0.9


def _initializers(path: Path) -> list[onnx.TensorProto]:
    return list(onnx.load(str(path)).graph.initializer)


@pytest.mark.parametrize("granularity,expert_compute", [(G.TENSOR, "dense_masked"), (G.CHANNEL, "per_expert_gather"),
                                                        (G.BLOCK128, "dense_masked")])
def test_expert_weights_are_fp8_initializers_read_through_dequantize_linear(
        granularity: ScaleGranularity, expert_compute: str, tmp_path: Path) -> None:
    case = Case(_base(200, 136, 4, 2, dtype=DType.BF16), granularity, False, expert_compute)
    spec, weights = case.spec, case.weights(0)
    path = export_onnx(spec, weights, make_plan(spec, FULL_TRT, force={"expert_compute": expert_compute}),
                       tmp_path / "moe.onnx")
    model = onnx.load(str(path))
    assert model.opset_import[0].version == 21
    inits = _initializers(path)
    fp8 = sorted(int(np.prod(t.dims)) for t in inits if t.data_type == onnx.TensorProto.FLOAT8E4M3FN)
    E, H, I = spec.num_experts, spec.hidden_size, spec.intermediate_size
    per_matrix = [H * I] * E + [H * 2 * I] * E if expert_compute == "per_expert_gather" else [E * H * I, E * H * 2 * I]
    assert fp8 == sorted(per_matrix)  # W1 and W2, FP8, nothing else
    # no dequantized copy: every other initializer is far smaller than one expert matrix
    assert max(int(np.prod(t.dims)) for t in inits if t.data_type != onnx.TensorProto.FLOAT8E4M3FN) < H * I
    ops = [n.op_type for n in model.graph.node]
    gemm_inputs = 1 + (E if expert_compute == "per_expert_gather" else 1)  # GEMM2's input is quantized per expert
    assert ops.count("QuantizeLinear") == gemm_inputs
    assert ops.count("DequantizeLinear") == gemm_inputs + len(per_matrix)
    blocks = {a.i for n in model.graph.node if n.op_type == "DequantizeLinear" for a in n.attribute
              if a.name == "block_size" and a.i}
    want_blocks = {128} if granularity is G.BLOCK128 else {H, I} if expert_compute == "dense_masked" and \
        granularity is G.CHANNEL else set()
    assert blocks == want_blocks


def test_static_scales_are_the_stored_ones(tmp_path: Path) -> None:
    case = CASES["tensor_static_top2_dense"]
    path = export_onnx(case.spec, case.weights(0), make_plan(case.spec, FULL_TRT), tmp_path / "moe.onnx")
    model = onnx.load(str(path))
    values = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    scales = {float(values[n.input[1]]) for n in model.graph.node if n.op_type == "QuantizeLinear"}
    assert scales == {np.float32(A1_SCALE), np.float32(A2_SCALE)}
    assert "ReduceMax" not in {n.op_type for n in model.graph.node}  # static: no scale computed in the graph


# ---- planner --------------------------------------------------------------------------------------

@pytest.mark.parametrize("quant", [Quant.W8A16, Quant.W4A16_AWQ, Quant.WFP4A16])
@pytest.mark.parametrize("flavour", [Flavour.TENSORRT, Flavour.TENSORRT_RTX])
def test_weight_only_quant_is_still_refused_on_ootb(quant: Quant, flavour: Flavour) -> None:
    spec = dataclasses.replace(_base(256, 128, 8, 2), quant=quant)
    with pytest.raises(UnsupportedCombination) as info:
        make_plan(spec, Target(sm=89, flavour=flavour, moe_plugin=MoePlugin.DISABLE))
    assert info.value.rule == "ootb_weight_only_quant"


@pytest.mark.parametrize("sm,flavour", [(89, Flavour.TENSORRT_RTX), (120, Flavour.TENSORRT_RTX),
                                        (121, Flavour.TENSORRT_RTX), (89, Flavour.TENSORRT), (90, Flavour.TENSORRT)])
def test_fp8_plans_ootb_where_the_target_has_fp8(sm: int, flavour: Flavour) -> None:
    for quant in (Quant.FP8, Quant.FP8_BLOCK):
        plan = make_plan(dataclasses.replace(_base(256, 128, 8, 2), quant=quant),
                         Target(sm=sm, flavour=flavour, moe_plugin=MoePlugin.DISABLE))
        gates = {g.name: g.held for g in plan.path_gates}
        assert plan.path == "ootb" and gates["ootb_fp8_sm"] and gates["ootb_quant_implemented"]


# ---- engines: real TensorRT-RTX builds on this CPU ------------------------------------------------

@pytest.mark.trt
@pytest.mark.parametrize("sm,quant,granularity", [("89", "fp8", "tensor"), ("120", "fp8", "tensor"),
                                                  ("120", "fp8_block", "block128")])
def test_cli_builds_a_tensorrt_rtx_fp8_engine(sm: str, quant: str, granularity: str, tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx_bindings")
    r = run_moe_build("build", "--quant", quant, "--sm", sm, "--flavour", "tensorrt-rtx", "--hidden", "200",
                      "--inter", "136", "--experts", "8", "--top-k", "2", "--dtype", "bf16", "--name", "fp8",
                      "--max-tokens", "64", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((tmp_path / "fp8.json").read_text())
    assert m["quant"] == {"mode": quant, "weight_scale_granularity": granularity, "act_scale": "dynamic",
                          "weight_storage": None}
    assert m["target"] == {"sm": int(sm), "compute_capability": f"SM{sm}"} and m["flavour"]["name"] == "tensorrt-rtx"
    assert m["graph"]["inputs"] == [{"name": "hidden", "dtype": "BF16", "shape": [-1, 200]}]
    layers = [layer["type"] for layer in m["graph"]["layers"]]
    assert layers.count("QUANTIZE") == 2 and layers.count("DEQUANTIZE") == 4
    r = run_moe_build("inspect", str(tmp_path / "fp8.engine"))
    assert r.returncode == 0, r.stderr
    assert f"{quant}: {granularity} weight scales, dynamic activation scales" in r.stdout


@pytest.mark.trt
def test_static_channel_engine_records_its_quant(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx_bindings")
    case = CASES["channel_dynamic_top2_dense_off128_shared"]
    base = dataclasses.replace(case.base, dtype=DType.BF16, name="fp8-static")
    case = dataclasses.replace(case, static=True, base=base)
    plan = make_plan(case.spec, Target(sm=89, flavour=Flavour.TENSORRT_RTX, profile=TokenProfile(1, 8, 64)))
    result = build_engine(case.spec, case.weights(0), plan, BuildOptions(output_dir=tmp_path, progress=False))
    assert result.manifest["quant"] == {"mode": "fp8", "weight_scale_granularity": "channel", "act_scale": "static",
                                       "weight_storage": None}
    manifest, _ = verify(result.engine_path)
    assert manifest["quant"] == result.manifest["quant"]
    assert inspect_engine(result.engine_path)["quant"]["act_scale"] == "static"


@pytest.mark.parametrize("sm", ["80", "86"])
def test_cli_refuses_ootb_fp8_below_sm89_in_one_line(sm: str, tmp_path: Path) -> None:
    r = run_moe_build("build", "--quant", "fp8", "--sm", sm, "--flavour", "tensorrt-rtx",
                      "--out", str(tmp_path / "out"))
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("moe-build: error: sm:")
    assert f"ootb_fp8_sm=quant=fp8 sm={sm} fails 'not fp8 or sm >= 89'" in line
    assert "; --quant none builds it with the experts dequantized exactly to the model dtype, or --sm 89+ [" in line
    assert not (tmp_path / "out").exists()
