"""inspect_engine verification and rendering, and every runtime step up to execution (no engine can run here)."""
from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_process import assert_one_line_error, run_moe_build
from rich.console import Console

from moe_build.engine.build import build_engine
from moe_build.engine.inspect import inspect_engine, render_inspection
from moe_build.engine.manifest import make_manifest, verify
from moe_build.engine.options import BuildOptions
from moe_build.engine.publish import publish_pair
from moe_build.engine.runtime import Engine, check_device, ensure_runnable_here
from moe_build.errors import MoeBuildError, VerificationError
from moe_build.planner import make_plan
from moe_build.spec.presets import get_preset
from moe_build.target import Flavour, Target, TokenProfile
from moe_build.weights import MoEWeights


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("tensorrt_rtx_bindings")
    spec = get_preset("tiny")
    plan = make_plan(spec, Target(sm=89, flavour=Flavour.TENSORRT_RTX, profile=TokenProfile(1, 4, 32)),
                     force={"expert_compute": "dense_masked"})
    out = tmp_path_factory.mktemp("engines")
    return build_engine(spec, MoEWeights.random(spec), plan, BuildOptions(output_dir=out, progress=False)).engine_path


@pytest.fixture
def copy(built: Path, tmp_path: Path) -> Path:
    """A private copy of the engine pair that a test may tamper with."""
    for suffix in (".engine", ".json"):
        shutil.copy(built.with_suffix(suffix), tmp_path / f"tiny{suffix}")
    return tmp_path / "tiny.engine"


def _edit_manifest(engine: Path, edit: Any) -> None:
    path = engine.with_suffix(".json")
    m = json.loads(path.read_text())
    edit(m)
    path.write_text(json.dumps(m))


@pytest.mark.trt
def test_inspect_reports_recorded_network_without_deserialising(built: Path) -> None:
    report = inspect_engine(built.with_suffix(".json"))  # either file of the pair names it
    assert report["verified"] and report["plan_path"] == "ootb" and report["expert_compute"] == "dense_masked"
    assert report["recorded"]["inputs"][0]["name"] == "hidden" and report["recorded"]["layers"]
    if not torch.cuda.is_available():
        assert report["deserialised"] == {"available": False, "reason": "device: no CUDA device is available; "
                                          "a TensorRT engine needs an NVIDIA GPU"}


@pytest.mark.trt
def test_tampered_engine_is_refused(copy: Path) -> None:
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0xFF
    copy.write_bytes(bytes(data))
    with pytest.raises(VerificationError, match="sha256") as exc:
        inspect_engine(copy)
    assert exc.value.exit_code == 1


@pytest.mark.trt
@pytest.mark.parametrize("what,edit", [
    ("expert_compute", lambda m: m["graph"].update(expert_compute="per_expert_gather")),
    ("profile", lambda m: m["profile"].update(max=4096)),
    ("spec", lambda m: m["spec"].update(top_k=1)),
    ("dtype", lambda m: m["graph"]["inputs"][0].update(dtype="FLOAT")),
    ("target sm", lambda m: m["target"].update(sm=86)),
    ("malformed", lambda m: m.pop("plan")),
    ("malformed", lambda m: m.update(graph=5)),
    ("malformed", lambda m: m["graph"].update(inputs=["hidden"])),
])
def test_manifest_plan_mismatch_is_refused(copy: Path, what: str, edit: Any) -> None:
    _edit_manifest(copy, edit)
    with pytest.raises(VerificationError, match=what):
        verify(copy)


@pytest.mark.trt
@pytest.mark.parametrize("content,problem", [(b"\xff\xfe", "not UTF-8"), (b"[1]", "holds a list"),
                                             (b'{"schema":', "not valid JSON")])
def test_unreadable_manifest_is_a_verification_failure(copy: Path, content: bytes, problem: str) -> None:
    copy.with_suffix(".json").write_bytes(content)
    with pytest.raises(VerificationError, match=f"cannot read manifest .*{problem}") as exc:
        inspect_engine(copy)
    assert exc.value.exit_code == 1


@pytest.mark.trt
def test_missing_manifest_is_refused(copy: Path) -> None:
    copy.with_suffix(".json").unlink()
    with pytest.raises(VerificationError, match="does not exist"):
        inspect_engine(copy)


def test_device_refusals_are_one_line() -> None:
    with pytest.raises(MoeBuildError) as exc:
        check_device(Flavour.TENSORRT_RTX, 89, 90)
    assert str(exc.value) == ("device: TensorRT-RTX engines cannot run on compute capability 9.0 "
                              "(supported: 8.0, 8.6, 8.9, 12.x)")
    with pytest.raises(MoeBuildError, match="no CUDA device"):
        check_device(Flavour.TENSORRT_RTX, 89, None)
    with pytest.raises(MoeBuildError, match="built for compute capability 8.9; this GPU is 12.0"):
        check_device(Flavour.TENSORRT_RTX, 89, 120)
    check_device(Flavour.TENSORRT_RTX, 89, 89)
    check_device(Flavour.TENSORRT, 90, 90)


@pytest.mark.trt
def test_runtime_checks_flavour_version_then_gpu(copy: Path) -> None:
    manifest, _ = verify(copy)
    with pytest.raises(MoeBuildError, match="cannot run on compute capability 9.0"):
        ensure_runnable_here(manifest, detect=lambda: 90)
    backend, sm = ensure_runnable_here(manifest, detect=lambda: 89)
    assert sm == 89 and backend.flavour is Flavour.TENSORRT_RTX
    old = dict(manifest, flavour={"name": "tensorrt-rtx", "version": "1.0.0.0"})
    with pytest.raises(MoeBuildError, match="installed is"):
        ensure_runnable_here(old, detect=lambda: 89)


@pytest.mark.trt
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_engine_load_without_cuda_refuses_before_deserialising(copy: Path) -> None:
    with pytest.raises(MoeBuildError, match="no CUDA device"):
        Engine.load(copy)


class FakeContext:
    """Records what the engine binds; stands in for IExecutionContext."""

    def __init__(self, ok: bool = True):
        self.ok = ok
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self.streams: list[int] = []

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        self.shapes[name] = shape
        return True

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        self.addresses[name] = ptr
        return True

    def execute_async_v3(self, stream: int) -> bool:
        self.streams.append(stream)
        return self.ok


@pytest.mark.trt
def test_engine_binds_inputs_and_preallocated_output(copy: Path) -> None:
    manifest, _ = verify(copy)
    ctx = FakeContext()
    engine = Engine(manifest, ctx, torch.device("cpu"), stream=lambda: 7)
    hidden = torch.randn(5, 64, dtype=torch.float16)
    out = engine(hidden)
    assert out.shape == (5, 64) and out.dtype == torch.float16
    assert ctx.shapes == {"hidden": (5, 64)} and ctx.streams == [7]
    assert ctx.addresses == {"hidden": hidden.data_ptr(), "output": engine._out.data_ptr()}
    assert engine._out.shape == (32, 64)  # sized once for the profile's max tokens
    engine(torch.randn(32, 64, dtype=torch.float16))
    assert ctx.addresses["output"] == engine._out.data_ptr()


@pytest.mark.trt
@pytest.mark.parametrize("hidden,logits,match", [
    (torch.randn(33, 64, dtype=torch.float16), None, "outside the engine's profile"),
    (torch.randn(4, 64, dtype=torch.float32), None, "float32"),
    (torch.randn(4, 32, dtype=torch.float16), None, "shape"),
    (torch.randn(64, 4, dtype=torch.float16).t(), None, "contiguous=False"),
    (torch.randn(4, 64, dtype=torch.float16), torch.randn(4, 8, dtype=torch.float16), "does not take it"),
])
def test_engine_refuses_bad_inputs(copy: Path, hidden: torch.Tensor, logits: torch.Tensor | None,
                                   match: str) -> None:
    manifest, _ = verify(copy)
    ctx = FakeContext()
    with pytest.raises(MoeBuildError, match=match):
        Engine(manifest, ctx, torch.device("cpu"), stream=lambda: 0)(hidden, logits)
    assert ctx.streams == []


@pytest.mark.trt
def test_engine_reports_failed_enqueue(copy: Path) -> None:
    manifest, _ = verify(copy)
    engine = Engine(manifest, FakeContext(ok=False), torch.device("cpu"), stream=lambda: 0)
    with pytest.raises(MoeBuildError, match="enqueue"):
        engine(torch.randn(2, 64, dtype=torch.float16))


@pytest.mark.trt
def test_topk_engine_binds_ids_and_weights(tmp_path: Path) -> None:
    spec = get_preset("tiny")
    plan = make_plan(spec, Target(sm=89, flavour=Flavour.TENSORRT_RTX, profile=TokenProfile(1, 4, 16)))
    result = build_engine(spec, MoEWeights.random(spec), plan,
                          BuildOptions(output_dir=tmp_path, progress=False, routing_input="topk"))
    manifest, _ = verify(result.engine_path)
    assert [(i["name"], i["dtype"]) for i in manifest["graph"]["inputs"]] == \
        [("hidden", "HALF"), ("topk_ids", "INT32"), ("topk_weights", "FLOAT")]
    ctx = FakeContext()
    engine = Engine(manifest, ctx, torch.device("cpu"), stream=lambda: 3)
    hidden = torch.randn(3, 64, dtype=torch.float16)
    ids = torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32)
    weights = torch.rand(3, 2)
    engine(hidden, topk_ids=ids, topk_weights=weights)
    assert ctx.shapes == {"hidden": (3, 64), "topk_ids": (3, 2), "topk_weights": (3, 2)}
    assert ctx.addresses["topk_ids"] == ids.data_ptr() and ctx.addresses["topk_weights"] == weights.data_ptr()
    with pytest.raises(MoeBuildError, match="needs it"):
        engine(hidden)
    with pytest.raises(MoeBuildError, match="rows but hidden has"):
        engine(hidden, topk_ids=ids[:2].contiguous(), topk_weights=weights[:2].contiguous())
    with pytest.raises(MoeBuildError, match="int32"):
        engine(hidden, topk_ids=ids.long(), topk_weights=weights)


# ---- rendering ------------------------------------------------------------------------------------

def _rendered(report: dict[str, Any]) -> str:
    console = Console(file=io.StringIO(), width=160, force_terminal=False)
    render_inspection(report, console)
    return console.file.getvalue()


@pytest.mark.trt
def test_inspect_renders_for_humans(built: Path) -> None:
    report = inspect_engine(built)
    text = _rendered(report)
    assert text.startswith(f"verified {built}: sha256 matches the manifest")
    assert "{'" not in text and "': " not in text  # no Python dict reprs
    assert "tensorrt-rtx" in text and "SM 8.9 (SM89)" in text and "1..32 tokens, optimized for 4" in text
    assert "ootb: expert compute dense_masked" in text
    assert "I/O tensors (recorded at build time)" in text and "[tokens, 64]" in text
    layers = report["recorded"]["layers"]
    assert f"{len(layers)} layers (recorded at build time)" in text
    assert all(layer["name"] in text and layer["type"] in text for layer in layers)


# ---- the plugin path's manifest ------------------------------------------------------------------

PLUGIN_TARGET = Target(sm=89, flavour=Flavour.TENSORRT, profile=TokenProfile(1, 4, 32))


def _plugin_pair(folder: Path, edit: Any = None) -> Path:
    """A plugin-path engine pair as the builder writes it (the engine bytes are a stand-in: nothing
    here deserialises them, and no machine here has full TensorRT to build a real one)."""
    spec = get_preset("tiny")
    plan = make_plan(spec, PLUGIN_TARGET, tokens=4)
    assert plan.path == "plugin"
    graph = {"routing_input": "logits",
             "inputs": [{"name": "hidden", "dtype": "HALF", "shape": [-1, 64]},
                        {"name": "router_logits", "dtype": "HALF", "shape": [-1, 8]}],
             "outputs": [{"name": "output", "dtype": "HALF", "shape": [-1, 64]}],
             "layers": [{"name": "moe.w1", "type": "CONSTANT"}, {"name": "moe.w2", "type": "CONSTANT"},
                        {"name": "moe", "type": "PLUGIN_V3"}],
             "plugin": {"name": "MoEPlugin", "namespace": "moe_build", "version": "1", "weights": "constants",
                        "choices": plan.choices()}}
    engine = b"plugin engine stand-in"
    manifest = make_manifest(name="tiny-plugin", engine=engine, spec=spec, plan=plan,
                             flavour={"name": "tensorrt", "version": "10.13.0.35"}, sm=89, compute_capability=None,
                             graph=graph, onnx_sha256=None, weights_sha256="0" * 64,
                             build={"seconds": 1.0, "hostname": "h", "moe_build_version": "0.1.0",
                                    "optimization_level": 3, "workspace_bytes": None, "timing_cache": None})
    if edit is not None:
        edit(manifest)
    return publish_pair(folder, "tiny-plugin", engine, json.dumps(manifest).encode())[0]


def test_plugin_manifest_verifies_and_renders(tmp_path: Path) -> None:
    engine = _plugin_pair(tmp_path)
    manifest, _ = verify(engine)
    report = inspect_engine(engine)
    assert report["plan_path"] == "plugin" and report["expert_compute"] is None
    assert report["stages"] == manifest["graph"]["plugin"]["choices"]
    assert report["deserialised"]["available"] is False  # no full TensorRT / GPU here: said, not hidden
    text = _rendered(report)
    assert "plugin: MoEPlugin v1 (moe_build), weights as constants" in text and "routing input  logits" in text
    assert "plugin stages (from the plan)" in text
    assert all(f"{stage}" in text and choice in text for stage, choice in report["stages"].items())
    assert "PLUGIN_V3" in text and "{'" not in text


def _set_choice(m: dict[str, Any], stage: str, choice: str) -> None:
    m["graph"]["plugin"]["choices"][stage] = choice


@pytest.mark.parametrize("what,edit", [
    ("plugin stage choices", lambda m: _set_choice(m, "gemm1_tactic", "prefill:ksplit1:plain:plain")),
    ("plugin stage choices", lambda m: _set_choice(m, "weight_layout", "blocked64")),
    ("path", lambda m: m["graph"].update(expert_compute="dense_masked")),
    ("path", lambda m: m["graph"].pop("plugin")),
    ("routing_input", lambda m: m["graph"].update(routing_input="hidden")),
    ("flavour", lambda m: m["flavour"].update(name="tensorrt-rtx")),
])
def test_plugin_manifest_plan_mismatch_is_refused(tmp_path: Path, what: str, edit: Any) -> None:
    with pytest.raises(VerificationError, match=f"disagree on {what}"):
        verify(_plugin_pair(tmp_path, edit))


@pytest.mark.trt
def test_ootb_manifest_claiming_a_plugin_is_refused(copy: Path) -> None:
    _edit_manifest(copy, lambda m: m["graph"].update(plugin={"choices": {}}))
    with pytest.raises(VerificationError, match="disagree on path"):
        verify(copy)


# ---- reading while a build publishes ------------------------------------------------------------

@pytest.mark.trt
def test_verify_rereads_a_pair_republished_while_reading(copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build that publishes between the reader's manifest and engine reads (publish.py) must not
    look like tampering: the manifest changed, so verify reads the pair again."""
    old, _ = verify(copy)
    new_engine = copy.read_bytes() + b"rebuilt"
    new = dict(old, engine_bytes=len(new_engine),
               engine_sha256=hashlib.sha256(new_engine).hexdigest())
    real_read_bytes, reads = Path.read_bytes, []

    def read_bytes(self: Path) -> bytes:
        if self == copy:  # the engine: the first read finds a new pair published under the reader
            if not reads:
                publish_pair(copy.parent, copy.stem, new_engine, json.dumps(new).encode())
            reads.append(self)
        return real_read_bytes(self)
    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    manifest, engine = verify(copy)
    assert manifest == new and engine == new_engine and len(reads) == 2


def test_runtime_does_not_import_inspect() -> None:
    """The old inspect <-> runtime cycle is gone: runtime reads manifests through manifest.py."""
    code = ("import sys, moe_build.engine.runtime; "
            "print('moe_build.engine.inspect' in sys.modules, 'moe_build.engine.manifest' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True"]


@pytest.mark.trt
def test_inspect_of_a_build_folder_shows_its_engine_or_lists_every_one(tmp_path: Path) -> None:
    """`moe-build inspect engines` after `build`: the one engine in full; after more builds, every engine and
    expert-parallel layer verified and listed; a tampered one fails the whole folder (exit 1)."""
    pytest.importorskip("tensorrt_rtx_bindings")
    out = tmp_path / "engines"
    assert run_moe_build("build", "--out", str(out), cwd=tmp_path).returncode == 0
    r = run_moe_build("inspect", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"verified {out / 'tiny.engine'}: sha256 matches") and "I/O tensors" in r.stdout
    for args in (["--ep-size", "2"], ["--hidden", "64", "--inter", "32", "--experts", "4", "--top-k", "2"]):
        assert run_moe_build("build", *args, "--out", str(out), cwd=tmp_path).returncode == 0
    (out / ".moe-build-tmp-1-0-0badc0de.half-written.engine").write_bytes(b"\0")  # a killed build's leftover
    r = run_moe_build("inspect", str(out))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"verified {out}: 2 engine(s) and 1 expert-parallel layer(s)")
    assert any("moe-h64-i32-e4-k2.engine" in line and "tensorrt-rtx, SM 8.9" in line for line in lines)
    assert any("tiny.engine" in line for line in lines) and any("tiny/ (2 of 2 ranks)" in line for line in lines)
    assert "half-written" not in r.stdout
    doc = json.loads(run_moe_build("inspect", str(out), "--json").stdout)
    assert [Path(e["engine"]).name for e in doc["engines"]] == ["moe-h64-i32-e4-k2.engine", "tiny.engine"]
    assert [Path(g["group"]).name for g in doc["groups"]] == ["tiny"] and doc["groups"][0]["ep_size"] == 2
    engine = out / "moe-h64-i32-e4-k2.engine"
    engine.write_bytes(engine.read_bytes()[:-1] + b"\x01")
    r = run_moe_build("inspect", str(out))
    assert r.returncode == 1 and "moe-h64-i32-e4-k2" in r.stderr, r.stderr
    (tmp_path / "empty").mkdir()
    assert_one_line_error(run_moe_build("inspect", str(tmp_path / "empty")), "engine")
