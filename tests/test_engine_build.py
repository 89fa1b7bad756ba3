"""Real TensorRT-RTX builds of the tiny spec: manifest contents, atomic writes, refusals."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import pytest

from moe_build import engine_builder
from moe_build.engine_builder import BuildOptions, BuildResult, build_engine
from moe_build.errors import MoeBuildError, UnsupportedCombination
from moe_build.ootb_graph import weights_sha256
from moe_build.planner import make_plan
from moe_build.presets import get_preset
from moe_build.spec import DType
from moe_build.target import Flavour, Target, TokenProfile
from moe_build.weights import MoEWeights

pytestmark = pytest.mark.trt
PROFILE = TokenProfile(1, 8, 64)


def _target(sm: int = 89) -> Target:
    return Target(sm=sm, flavour=Flavour.TENSORRT_RTX, profile=PROFILE)


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[BuildResult, MoEWeights]:
    pytest.importorskip("tensorrt_rtx_bindings")
    spec = get_preset("tiny")
    weights = MoEWeights.random(spec, seed=1)
    plan = make_plan(spec, _target(), force={"expert_compute": "dense_masked"})
    out = tmp_path_factory.mktemp("engines")
    return build_engine(spec, weights, plan, BuildOptions(output_dir=out, progress=False)), weights


def test_manifest_records_the_build(tiny_build: tuple[BuildResult, MoEWeights]) -> None:
    result, weights = tiny_build
    m = json.loads(result.manifest_path.read_text())
    engine = result.engine_path.read_bytes()
    assert result.engine_path.name == "tiny.engine" and m["engine_file"] == "tiny.engine"
    assert m["engine_sha256"] == hashlib.sha256(engine).hexdigest() and m["engine_bytes"] == len(engine)
    assert m["weights_sha256"] == weights_sha256(weights)
    assert len(m["onnx_sha256"]) == 64
    import tensorrt_rtx_bindings as trt
    assert m["flavour"] == {"name": "tensorrt-rtx", "version": trt.__version__}
    assert m["target"] == {"sm": 89, "compute_capability": "SM89"}
    assert m["profile"] == {"min": 1, "opt": 8, "max": 64}
    assert m["spec"] == get_preset("tiny").to_dict() and m["plan"]["spec"] == m["spec"]
    assert m["plan"]["path"] == "ootb" and m["graph"]["expert_compute"] == "dense_masked"
    assert m["graph"]["inputs"] == [{"name": "hidden", "dtype": "HALF", "shape": [-1, 64]}]
    assert m["graph"]["outputs"][0]["name"] == "output" and m["graph"]["layers"]
    assert m["build"]["seconds"] > 0 and m["build"]["hostname"] and m["build"]["moe_build_version"]
    assert m["build"]["timing_cache"] is None  # timing-cache operations are no-ops in TensorRT-RTX
    assert sorted(p.name for p in result.engine_path.parent.iterdir()) == ["tiny.engine", "tiny.json"]


def test_bf16_sm86_with_logits_input(tiny_build: tuple[BuildResult, MoEWeights]) -> None:
    result, _ = tiny_build
    spec = dataclasses.replace(get_preset("tiny"), dtype=DType.BF16, name="tiny-bf16")
    plan = make_plan(spec, _target(86), force={"expert_compute": "dense_masked"})
    r = build_engine(spec, MoEWeights.random(spec), plan,
                     BuildOptions(output_dir=result.engine_path.parent, progress=False, routing_input="logits"))
    assert r.manifest["target"]["compute_capability"] == "SM86"
    assert [i["name"] for i in r.manifest["graph"]["inputs"]] == ["hidden", "router_logits"]
    assert r.manifest["graph"]["inputs"][0]["dtype"] == "BF16"
    assert r.manifest["build"]["optimization_level"] == 3


def _tiny_plan(expert_compute: str = "dense_masked"):  # noqa: ANN202 - a Plan
    return make_plan(get_preset("tiny"), _target(), force={"expert_compute": expert_compute})


@pytest.mark.parametrize("fail_at", ["manifest_write", "second_replace"])
def test_failed_build_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_at: str) -> None:
    pytest.importorskip("tensorrt_rtx_bindings")
    spec = get_preset("tiny")
    if fail_at == "manifest_write":
        real_write = engine_builder._write_bytes

        def write(path: Path, data: bytes) -> None:
            if ".tiny.json." in path.name:
                raise OSError("disk full")
            real_write(path, data)
        monkeypatch.setattr(engine_builder, "_write_bytes", write)
    else:
        real_replace, calls = os.replace, []

        def replace(src: str, dst: str) -> None:
            calls.append(dst)
            if len(calls) == 2:
                raise OSError("disk full")
            real_replace(src, dst)
        monkeypatch.setattr(engine_builder.os, "replace", replace)
    with pytest.raises(OSError, match="disk full"):
        build_engine(spec, MoEWeights.random(spec), _tiny_plan(),
                     BuildOptions(output_dir=tmp_path, progress=False, use_timing_cache=False))
    assert list(tmp_path.iterdir()) == []


def test_unwritable_output_folder(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    spec = get_preset("tiny")
    with pytest.raises(MoeBuildError) as exc:
        build_engine(spec, MoEWeights.random(spec), _tiny_plan(), BuildOptions(output_dir=blocker / "engines"))
    assert exc.value.field == "output" and exc.value.exit_code == 2


def test_min_greater_than_max_profile_is_refused() -> None:
    with pytest.raises(MoeBuildError) as exc:
        TokenProfile(min=64, opt=8, max=1)
    assert "min_tokens" in exc.value.field and exc.value.exit_code == 2


def test_per_expert_gather_is_refused_on_rtx_by_the_planner() -> None:
    # TensorRT-RTX has no NonZero runner (docs/add_moe_findings.md), so the planner never asks for it there.
    spec = dataclasses.replace(get_preset("tiny"), num_experts=64)
    rtx = Target(sm=89, flavour=Flavour.TENSORRT_RTX)
    assert make_plan(spec, rtx).stage("expert_compute").choice == "dense_masked"
    with pytest.raises(UnsupportedCombination) as exc:
        make_plan(spec, rtx, force={"expert_compute": "per_expert_gather"})
    assert exc.value.rule == "ootb_nonzero"


def test_plan_for_another_spec_is_refused(tmp_path: Path) -> None:
    spec = dataclasses.replace(get_preset("tiny"), top_k=1)
    with pytest.raises(MoeBuildError) as exc:
        build_engine(spec, MoEWeights.random(spec), _tiny_plan(), BuildOptions(output_dir=tmp_path))
    assert exc.value.field == "plan"


def test_progress_monitor_drives_rich_tasks() -> None:
    from moe_build.backend import load_backend
    from moe_build.progress import make_monitor, make_progress
    pytest.importorskip("tensorrt_rtx_bindings")
    progress = make_progress()
    monitor = make_monitor(load_backend("tensorrt-rtx"), progress)
    monitor.phase_start("Building", None, 3)
    assert monitor.step_complete("Building", 1) is True
    (task,) = progress.tasks
    assert task.total == 3 and task.completed == 2
    monitor.phase_finish("Building")
    assert progress.tasks == []
