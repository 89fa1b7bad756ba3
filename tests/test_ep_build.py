"""Expert parallelism on the build side: per-rank OOTB graphs against the fp64 reference, `moe-build build
--ep-size` (real TensorRT-RTX engines, one per rank), the manifest's `ep` record, `inspect` of a rank and of a
layer's folder, and the plugin's ep fields.

The numerics: each rank's graph (onnxruntime, fp32) must equal the reference restricted to that rank's experts,
computed here by routing with the reference and zeroing, by hand, the routing weights of every expert outside
the rank's range (rank 0 alone adds the shared experts); the ranks' outputs must add up to the whole layer's
reference. Tolerance: fp32 against fp64, as tests/test_ootb_onnx.py (norm-wise 1e-5).
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from cli_process import run_moe_build

from moe_build.engine import jobs as jobs_module
from moe_build.engine.build import BuildResult
from moe_build.engine.inspect import inspect_path
from moe_build.engine.jobs import BuildJob, run_build_jobs
from moe_build.engine.manifest import MANIFEST_SCHEMA, verify
from moe_build.engine.options import BuildOptions
from moe_build.errors import MoeBuildError, VerificationError
from moe_build.graph.ootb import export_onnx
from moe_build.planner import make_plan
from moe_build.reference import moe_reference, route
from moe_build.spec import DType, MoESpec, Quant, Routing, RoutingMethod, SharedExperts
from moe_build.target import Flavour, MoePlugin, Target, TokenProfile
from moe_build.weights import MoEWeights
from moe_build.weights.fp8 import ScaleGranularity
from moe_build.plugins import moe_plugin as mp
from moe_build.plugins.enqueue import _make_runner, check_local_dispatch
from moe_build.plugins.fields import decode_fields, encode_fields, fields_from_collection
from moe_build.plugins.slots import input_slots

TOL = 1e-5
TOKENS = 19
# The ONNX graph is flavour-independent; full TensorRT (plugin disabled) admits both expert-compute choices.
FULL_TRT = Target(sm=89, flavour=Flavour.TENSORRT, moe_plugin=MoePlugin.DISABLE)
DEEPSEEK_LIKE = MoESpec(hidden_size=32, intermediate_size=48, num_experts=8, top_k=3, dtype=DType.FP32,
                        expert_bias=True, shared=SharedExperts(count=1, intermediate_size=40, sigmoid_gate=True),
                        routing=Routing(RoutingMethod.SIGMOID_GROUPED, renormalize=True, num_groups=4, topk_groups=2,
                                        routed_scaling_factor=2.5, correction_bias=True))
MIXTRAL_LIKE = MoESpec(hidden_size=32, intermediate_size=48, num_experts=8, top_k=2, dtype=DType.FP32,
                       routing=Routing(RoutingMethod.TOPK_SOFTMAX))


@dataclasses.dataclass(frozen=True)
class Case:
    spec: MoESpec            # the whole layer, ep_size set
    expert_compute: str
    fp8: bool = False

    def weights(self, seed: int) -> MoEWeights:
        w = MoEWeights.random(self.spec, seed)
        return w.quantized_fp8(ScaleGranularity.TENSOR, static=False) if self.fp8 else w


CASES = {
    "grouped_shared_ep4_dense": Case(dataclasses.replace(DEEPSEEK_LIKE, ep_size=4), "dense_masked"),
    "grouped_shared_ep2_gather": Case(dataclasses.replace(DEEPSEEK_LIKE, ep_size=2), "per_expert_gather"),
    "fp8_ep2_gather": Case(dataclasses.replace(MIXTRAL_LIKE, ep_size=2, quant=Quant.FP8), "per_expert_gather",
                           fp8=True),
}


def _run(path: Path, hidden: torch.Tensor) -> torch.Tensor:
    import onnxruntime as ort
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"hidden": hidden.numpy()})
    return torch.from_numpy(np.asarray(out, dtype=np.float64))


def _restricted_reference(spec: MoESpec, weights: MoEWeights, hidden: torch.Tensor, lo: int, hi: int,
                          with_shared: bool) -> torch.Tensor:
    """The layer's output from experts lo..hi-1 only: routed over all experts by the reference, then every other
    expert's routing weight set to zero here; the shared experts only where `with_shared`."""
    w = weights.dequantized(torch.float64, "cpu")
    x = hidden.double()
    logits = x @ w.router_weight.t() + (0 if w.router_bias is None else w.router_bias)
    ids, topk_weights = route(spec, logits, w.correction_bias)
    mine = (ids >= lo) & (ids < hi)
    topk_weights = torch.where(mine, topk_weights, torch.zeros_like(topk_weights))
    if not with_shared:
        spec = dataclasses.replace(spec, shared=SharedExperts())
        weights = dataclasses.replace(weights, shared_w1=None, shared_w2=None, shared_gate=None)
    return moe_reference(spec, weights, hidden, topk_ids=ids, topk_weights=topk_weights)


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float(torch.linalg.norm(got - want) / torch.linalg.norm(want))


@pytest.mark.parametrize("name", list(CASES))
def test_rank_graphs_add_up_to_the_layer(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    spec, ep = case.spec, case.spec.ep_size
    per_rank = spec.num_experts // ep
    weights = case.weights(seed=3)
    hidden = torch.randn(TOKENS, spec.hidden_size, generator=torch.Generator().manual_seed(4))
    outputs = []
    for rank in range(ep):
        rank_spec = spec.for_rank(rank)
        plan = make_plan(rank_spec, FULL_TRT, force={"expert_compute": case.expert_compute})
        assert plan.stage("dispatch").choice == "allreduce"
        path = export_onnx(rank_spec, weights.for_rank(spec, rank), plan, tmp_path / f"rank{rank}.onnx")
        got = _run(path, hidden)
        want = _restricted_reference(spec, weights, hidden, rank * per_rank, (rank + 1) * per_rank,
                                     with_shared=rank == 0)
        assert want.abs().max() > 0 and _rel(got, want) < TOL, (rank, _rel(got, want))
        outputs.append(got)
        if case.expert_compute == "dense_masked":  # the graph holds this rank's experts only
            stacked = {tuple(i.dims)[0] for i in onnx.load(str(path)).graph.initializer if len(i.dims) == 3}
            assert stacked == {per_rank}, stacked
    whole = moe_reference(spec, weights, hidden)
    assert _rel(sum(outputs), whole) < TOL
    # each rank contributes: no rank's output is (near) zero, so the sum is not one rank's output
    assert all(_rel(o, whole) > 1e-2 for o in outputs)


# ---- the build jobs without TensorRT --------------------------------------------------------------

def test_rank_jobs_get_their_slice_and_plan_and_a_failed_rank_leaves_no_folder(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rank is built from its own spec, plan and experts' weights into out/<name>/rank<r>; a rank interrupted
    mid-build leaves no folder of its own, the ranks built before it stay."""
    spec = dataclasses.replace(MIXTRAL_LIKE, ep_size=2, name="layer")
    seen: list[tuple[int | None, int | None, int, Path]] = []

    def fake_build(s: MoESpec, w: MoEWeights, plan, options: BuildOptions, progress) -> BuildResult:
        folder = Path(options.output_dir)
        folder.mkdir(parents=True, exist_ok=True)  # as build_engine does before its work
        seen.append((s.ep_rank, plan.spec["ep_rank"], w.w1.shape[0], folder))
        if s.ep_rank == 1:
            raise KeyboardInterrupt
        engine = folder / f"{options.name}.engine"
        engine.write_bytes(b"x")
        return BuildResult(engine, engine.with_suffix(".json"), {})

    monkeypatch.setattr(jobs_module, "build_engine", fake_build)
    target = Target(sm=89, flavour=Flavour.TENSORRT_RTX, profile=TokenProfile(1, 8, 32))
    weights = MoEWeights.random(spec, 0)
    ranks = [(r, make_plan(spec.for_rank(r), target, 8)) for r in range(2)]
    job = BuildJob("layer", spec, make_plan(spec, target, 8), lambda: (weights, "digest"), "test", tuple(ranks))
    with pytest.raises(KeyboardInterrupt):
        run_build_jobs([job], BuildOptions(output_dir=tmp_path, progress=False))
    assert seen == [(0, 0, 4, tmp_path / "layer" / "rank0"), (1, 1, 4, tmp_path / "layer" / "rank1")]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == \
        ["layer", "layer/rank0", "layer/rank0/layer.engine"]


# ---- real builds (TensorRT-RTX on the CPU) --------------------------------------------------------

@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """`moe-build build --ep-size 2` of the embedded tiny default (8 experts): rank0 and rank1."""
    pytest.importorskip("tensorrt_rtx_bindings")
    cwd = tmp_path_factory.mktemp("ep2")
    return cwd / "engines", run_moe_build("build", "--ep-size", "2", cwd=cwd)


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and not p.name.startswith(("moe-build.", ".moe-build")))


@pytest.mark.trt
def test_ep_build_writes_one_engine_per_rank(built: tuple[Path, object]) -> None:
    out, r = built
    assert r.returncode == 0, r.stderr
    assert _files(out) == ["tiny/rank0/tiny.engine", "tiny/rank0/tiny.json", "tiny/rank1/tiny.engine",
                           "tiny/rank1/tiny.json"]
    assert "[1/2] built engines/tiny/rank0/tiny.engine" in r.stdout
    assert "[2/2] built engines/tiny/rank1/tiny.engine" in r.stdout
    for rank in (0, 1):  # progress lines per rank
        assert f"[1/1] tiny rank {rank} of 2: exporting ONNX" in r.stderr
        assert f"[1/1] tiny rank {rank} of 2: writing engine + manifest" in r.stderr
    m0, m1 = (json.loads((out / f"tiny/rank{k}/tiny.json").read_text()) for k in (0, 1))
    assert m0["schema"] == m1["schema"] == "moe-build.manifest/14"
    assert m0["ep"] == {"size": 2, "rank": 0, "experts": [0, 4], "dispatch": "allreduce"}
    assert m1["ep"] == {"size": 2, "rank": 1, "experts": [4, 8], "dispatch": "allreduce"}
    assert m0["weights_sha256"] != m1["weights_sha256"] and m0["engine_sha256"] != m1["engine_sha256"]
    assert m1["spec"]["ep_rank"] == 1 and m1["plan"]["spec"]["ep_rank"] == 1
    dispatch = next(s for s in m1["plan"]["stages"] if s["stage"] == "dispatch")
    assert dispatch["choice"] == "allreduce"


@pytest.mark.trt
def test_inspect_shows_a_rank_and_the_whole_group(built: tuple[Path, object]) -> None:
    out, _ = built
    r = run_moe_build("inspect", str(out / "tiny/rank1/tiny.engine"))
    assert r.returncode == 0, r.stderr
    assert "rank 1 of 2: experts 4..7" in r.stdout and "partial sum" in r.stdout
    r = run_moe_build("inspect", str(out / "tiny"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"verified {out / 'tiny'}: 2 of 2 ranks")
    assert any("0..3" in line and "rank0/tiny.engine" in line for line in lines)
    assert any("4..7" in line and "rank1/tiny.engine" in line for line in lines)
    r = run_moe_build("inspect", str(out))  # the build's folder, holding this one layer: the same view
    assert r.returncode == 0 and r.stdout.splitlines()[0].startswith(f"verified {out / 'tiny'}: 2 of 2 ranks"), r.stderr
    doc = inspect_path(out / "tiny")  # what --json prints
    assert [x["ep"]["rank"] for x in doc["ranks"]] == [0, 1] and doc["missing"] == [] and doc["ep_size"] == 2
    assert [Path(x["engine"]) for x in doc["ranks"]] == [out / "tiny/rank0/tiny.engine", out / "tiny/rank1/tiny.engine"]


@pytest.mark.trt
def test_inspect_refuses_a_rank_folder_holding_another_rank(built: tuple[Path, object], tmp_path: Path) -> None:
    out, _ = built
    group = tmp_path / "tiny"
    shutil.copytree(out / "tiny/rank1", group / "rank0")
    shutil.copytree(out / "tiny/rank1", group / "rank1")
    r = run_moe_build("inspect", str(group))
    assert r.returncode == 1 and "holds rank 1's engine, not rank 0's" in r.stderr, r.stderr


@pytest.mark.trt
@pytest.mark.parametrize("edit, message", [
    (lambda ep: ep.update(rank=0), "ep rank: 0 vs 1"),
    (lambda ep: ep.update(experts=[0, 4]), "ep experts"),
    (lambda ep: ep.update(size=4), "ep size"),
    (lambda ep: ep.update(dispatch="nccl"), "ep dispatch"),
    (lambda ep: ep.update(extra=1), "disagree on ep: "),
])
def test_manifest_ep_record_is_verified(built: tuple[Path, object], tmp_path: Path, edit, message: str) -> None:
    out, _ = built
    folder = shutil.copytree(out / "tiny/rank1", tmp_path / "rank1")
    manifest, _ = verify(folder / "tiny.engine")  # the round trip: written, read back, verified
    assert manifest["schema"] == MANIFEST_SCHEMA and manifest["ep"]["experts"] == [4, 8]
    edit(manifest["ep"])
    (folder / "tiny.json").write_text(json.dumps(manifest))
    with pytest.raises(VerificationError, match=message):
        verify(folder / "tiny.engine")


@pytest.mark.trt
def test_manifest_without_or_with_a_null_ep_record_is_refused(built: tuple[Path, object], tmp_path: Path) -> None:
    out, _ = built
    folder = shutil.copytree(out / "tiny/rank0", tmp_path / "rank0")
    manifest = json.loads((folder / "tiny.json").read_text())
    (folder / "tiny.json").write_text(json.dumps({**manifest, "ep": None}))
    with pytest.raises(VerificationError, match="expert parallelism"):
        verify(folder / "tiny.engine")
    del manifest["ep"]
    (folder / "tiny.json").write_text(json.dumps(manifest))
    with pytest.raises(VerificationError, match="'ep'"):
        verify(folder / "tiny.engine")


@pytest.mark.trt
def test_ep_rank_builds_only_that_rank(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx_bindings")
    r = run_moe_build("build", "--ep-size", "2", "--ep-rank", "1", "--out", str(tmp_path / "out"),
                      "--max-tokens", "32")
    assert r.returncode == 0, r.stderr
    assert _files(tmp_path / "out") == ["tiny/rank1/tiny.engine", "tiny/rank1/tiny.json"]
    assert "[1/1] built" in r.stdout and "rank 0" not in r.stderr
    r = run_moe_build("inspect", str(tmp_path / "out/tiny"), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [x["ep"]["rank"] for x in doc["ranks"]] == [1] and doc["missing"] == [0]


@pytest.mark.parametrize("args, field", [
    (["--ep-size", "3"], "ep_size: 3 does not divide num_experts=8"),
    (["--ep-size", "0"], "ep_size"),
    (["--ep-size", "2", "--ep-rank", "2"], "ep_rank: 2 is not a rank of ep_size=2"),
])
def test_bad_ep_options_exit_2_and_leave_nothing(args: list[str], field: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    r = run_moe_build("build", *args, "--out", str(out))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert field in r.stderr and len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""
    assert list(out.iterdir()) == []


# ---- the plugin's ep fields (pure, and through TensorRT-RTX's IPluginV3 classes) --------------------

PLUGIN_TARGET = Target(sm=90, flavour=Flavour.TENSORRT, profile=TokenProfile(min=1, opt=16, max=512))
PLUGIN_SPEC = MoESpec(hidden_size=64, intermediate_size=32, num_experts=8, top_k=2, dtype=DType.BF16, ep_size=2)


def _rank_plugin_fields(rank: int | None) -> tuple[MoESpec, object, dict[str, bytes]]:
    spec = PLUGIN_SPEC if rank is None else PLUGIN_SPEC.for_rank(rank)
    plan = make_plan(spec, PLUGIN_TARGET, tokens=16)
    return spec, plan, encode_fields(spec, plan)


def test_plugin_fields_carry_ep_size_and_rank() -> None:
    spec, plan, fields = _rank_plugin_fields(1)
    assert plan.path == "plugin" and plan.stage("dispatch").choice in ("nvlink", "nccl")
    assert (fields["ep_size"], fields["ep_rank"]) == (b"2", b"1")
    spec2, plan2 = decode_fields(fields)
    assert (spec2.ep_size, spec2.ep_rank) == (2, 1) and spec2 == spec
    assert decode_fields(_rank_plugin_fields(None)[2])[0].ep_rank is None  # the whole layer: null
    # a rank's plugin takes that rank's experts' weights, and the router's logits over all experts
    slots = {s.name: s.shape for s in input_slots(spec)}
    assert slots["w1"] == (4, 64, 64) and slots["w2"] == (4, 64, 32) and slots["router_logits"] == (None, 8)


@pytest.mark.parametrize("edit, message", [
    ({"ep_rank": b"0"}, "'ep_rank'.*is 0 but the 'spec' field says ep_rank=1"),
    ({"ep_size": b"4"}, "'ep_size'.*is 4 but"),
    ({"ep_rank": b"true"}, "'ep_rank'.*not an integer"),
    ({"ep_size": b"\xff"}, "'ep_size'.*not a JSON integer"),
])
def test_plugin_ep_fields_disagreeing_with_the_spec_are_refused(edit: dict[str, bytes], message: str) -> None:
    _, _, fields = _rank_plugin_fields(1)
    with pytest.raises(MoeBuildError, match=message):
        decode_fields({**fields, **edit})
    del fields["ep_rank"]
    with pytest.raises(MoeBuildError, match="'ep_rank'.*missing"):
        decode_fields(fields)


@pytest.mark.parametrize("force", [{}, {"dispatch": "nccl"}])
def test_plugin_runner_refuses_a_dispatching_plan_in_one_line(force: dict[str, str]) -> None:
    spec = PLUGIN_SPEC.for_rank(1)
    plan = make_plan(spec, PLUGIN_TARGET, tokens=16, force=force)
    choice = plan.stage("dispatch").choice
    assert choice != "none"
    with pytest.raises(MoeBuildError) as info:
        _make_runner(spec, plan, {})  # refused before any weight is wrapped or CUDA is touched
    text = str(info.value)
    assert text.startswith(f"dispatch: {choice}: ") and "ExpertParallelMoE" in text and "\n" not in text
    check_local_dispatch(make_plan(dataclasses.replace(PLUGIN_SPEC, ep_size=1), PLUGIN_TARGET, tokens=16))


def test_plugin_ep_fields_round_trip_through_the_creator() -> None:
    trt = pytest.importorskip("tensorrt_rtx_bindings")
    spec, plan, _ = _rank_plugin_fields(1)
    p = mp.plugin_classes(trt).MoEPlugin(spec, plan)
    fields = p.get_fields_to_serialize()
    raw = fields_from_collection(fields)
    assert (raw["ep_size"], raw["ep_rank"]) == (b"2", b"1")
    q = mp.plugin_classes(trt).MoEPluginCreator().create_plugin("moe", fields, trt.TensorRTPhase.RUNTIME)
    assert q.spec == spec and (q.spec.ep_size, q.spec.ep_rank) == (2, 1)


def test_plugin_path_build_of_an_expert_parallel_rank_is_refused_before_loading_anything(monkeypatch) -> None:
    """An engine whose plugin would refuse to run is not built: the preflight names `dispatch` and the way out
    (a full TensorRT that could add the plugin layer is stood in for: the refusal comes before it is used)."""
    from moe_build.engine import preflight
    from moe_build.engine.options import BuildOptions
    monkeypatch.setattr(preflight, "_backend_for", lambda plan, target: object())
    spec = PLUGIN_SPEC.for_rank(0)
    with pytest.raises(MoeBuildError) as info:
        preflight.prepare_build(spec, make_plan(spec, PLUGIN_TARGET, tokens=16), BuildOptions())
    assert info.value.field == "dispatch" and "--moe-plugin disable" in str(info.value)
    whole = dataclasses.replace(PLUGIN_SPEC, ep_size=1)
    with pytest.raises(AttributeError):  # a single-GPU plan passes the checks and reaches the backend
        preflight.prepare_build(whole, make_plan(whole, PLUGIN_TARGET, tokens=16), BuildOptions())


# ---- the ep_format stage (moe_build/planner/plan.py:_ep_format): how rows reach a rank's experts -------------

def _format(spec: MoESpec, deterministic: bool = False, **force: str) -> object:
    target = dataclasses.replace(PLUGIN_TARGET, deterministic=deterministic)
    return make_plan(spec, target, tokens=16, force=force or None)


def test_ep_format_is_contiguous_unless_deterministic_and_none_without_ep() -> None:
    rank = PLUGIN_SPEC.for_rank(0)
    assert _format(dataclasses.replace(PLUGIN_SPEC, ep_size=1)).stage("ep_format").choice == "none"
    assert _format(rank).stage("ep_format").choice == "contiguous"
    assert _format(rank, dispatch="nccl").stage("ep_format").choice == "contiguous"
    det = _format(rank, deterministic=True)
    assert det.stage("ep_format").choice == "permuted"
    # the tokens' ranks do the finalize: GEMM2 stores plainly on the experts' rank
    assert det.stage("finalize").choice == "separate"
    assert {g.name: g.held for g in det.stage("finalize").gates}["finalize_where_experts_run"] is False
    assert _format(rank, ep_format="batched").stage("ep_format").choice == "batched"
    # both dispatches have the grouped formats
    assert _format(rank, deterministic=True, dispatch="nccl").stage("ep_format").choice == "permuted"
    assert _format(rank, dispatch="nccl", ep_format="batched").stage("ep_format").choice == "batched"


@pytest.mark.parametrize("change, gate", [({"expert_bias": True}, "ep_unpermute_no_fc2_bias"),
                                          ({"quant": Quant.FP8}, "ep_unpermute_16bit")])
def test_grouped_formats_need_a_16bit_layer_without_fc2_bias(change: dict, gate: str) -> None:
    spec = dataclasses.replace(PLUGIN_SPEC, **change).for_rank(1)
    plan = _format(spec, deterministic=True)
    assert plan.stage("ep_format").choice == "contiguous"
    assert {g.name: g.held for g in plan.stage("ep_format").gates}[gate] is False
    with pytest.raises(MoeBuildError) as info:
        _format(spec, ep_format="permuted")
    assert info.value.field == "force" and gate in str(info.value) and "\n" not in str(info.value)
    assert info.value.exit_code == 2


def test_grouped_formats_refused_without_ep() -> None:
    with pytest.raises(MoeBuildError, match="ep_format=permuted does not apply with dispatch=none"):
        _format(dataclasses.replace(PLUGIN_SPEC, ep_size=1), ep_format="permuted")


def test_deterministic_16bit_plans_keep_the_tiled_gemm_at_every_count() -> None:
    """The decode kernel's K slices would make a row's output depend on the batch: deterministic plans never take
    it (tactics/dense.py kernel_rule); the same layer planned without the request does, at decode sizes."""
    spec = MoESpec(hidden_size=2048, intermediate_size=768, num_experts=128, top_k=8, dtype=DType.BF16)
    for stage in ("gemm1_tactic", "gemm2_tactic"):
        loose = _format(spec).stage(stage)
        strict = _format(spec, deterministic=True).stage(stage)
        assert loose.bands[0].choice.startswith("decode:")
        assert all(not b.choice.startswith("decode:") for b in strict.bands), strict.bands


def test_grouped_experts_run_their_gemms_only() -> None:
    """Rows that arrive grouped by expert skip the experts' prologue, expansion and finalize
    (sequence.grouped_sequence); a contiguous plan is refused in one line."""
    from moe_build.runner import sequence as S
    rank = PLUGIN_SPEC.for_rank(0)
    steps = S.grouped_sequence(_format(rank, deterministic=True), 16)
    assert steps in (["gemm1:sm90_gated", "gemm2:sm90"], ["gemm1:sm90", "fc1_activation", "gemm2:sm90"]), steps
    with pytest.raises(MoeBuildError) as info:
        S.grouped_sequence(_format(rank), 16)
    assert info.value.field == "ep_format" and "\n" not in str(info.value)


# ---- the nccl_exchange stage (moe_build/planner/plan.py:_nccl_exchange): how the nccl dispatch sizes its exchanges

def test_nccl_exchange_all_gathers_contiguous_rows_within_the_pool_and_is_exact_past_it() -> None:
    """Up to 256 MiB of every rank's token rows (PLUGIN_SPEC's hidden: t_max tokens of all ranks together) the
    all-gather form, above it the two-phase exact sizes; the band is in the plan, so a call past it reads 'exact'."""
    from moe_build.planner import rules as R
    rank = PLUGIN_SPEC.for_rank(0)
    t_max = (256 << 20) // (PLUGIN_SPEC.hidden_size * 2)
    assert R.nccl_all_gather_max_tokens(rank) == t_max
    stage = _format(rank, dispatch="nccl").stage("nccl_exchange")
    assert stage.choice == "all_gather" and stage.fallback == "exact"
    assert [(b.lo, b.hi, b.choice) for b in stage.bands] == [(1, t_max, "all_gather"), (t_max + 1, None, "exact")]
    assert stage.choice_for(t_max) == "all_gather" and stage.choice_for(t_max + 1) == "exact"
    past = make_plan(rank, PLUGIN_TARGET, tokens=t_max + 1, force={"dispatch": "nccl"}).stage("nccl_exchange")
    assert past.choice == "exact"
    assert {g.name: g.held for g in past.gates} == {"nccl_all_gather_contiguous": True, "nccl_all_gather_pool": False}


def test_nccl_exchange_is_exact_for_grouped_formats_and_none_without_nccl() -> None:
    rank = PLUGIN_SPEC.for_rank(1)
    grouped = _format(rank, deterministic=True, dispatch="nccl").stage("nccl_exchange")
    assert grouped.choice == "exact" and [b.choice for b in grouped.bands] == ["exact"]
    assert {g.name: g.held for g in grouped.gates}["nccl_all_gather_contiguous"] is False
    assert _format(rank).stage("nccl_exchange").choice == "none"  # nvlink
    assert _format(dataclasses.replace(PLUGIN_SPEC, ep_size=1)).stage("nccl_exchange").choice == "none"
    assert _format(rank, dispatch="nccl", nccl_exchange="exact").stage("nccl_exchange").choice == "exact"


@pytest.mark.parametrize("force, message", [
    ({"nccl_exchange": "all_gather"}, "nccl_exchange=all_gather does not apply with dispatch=nvlink"),
    ({"dispatch": "nccl", "nccl_exchange": "none"}, "nccl_exchange=none does not apply with dispatch=nccl"),
    ({"dispatch": "nccl", "ep_format": "permuted", "nccl_exchange": "all_gather"},
     "cannot force nccl_exchange=all_gather: nccl_all_gather_contiguous"),
])
def test_nccl_exchange_refuses_what_cannot_run(force: dict, message: str) -> None:
    with pytest.raises(MoeBuildError) as info:
        _format(PLUGIN_SPEC.for_rank(0), **force)
    assert message in str(info.value) and "\n" not in str(info.value) and info.value.exit_code == 2
