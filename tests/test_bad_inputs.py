"""First contact: every bad input a user can give is one line on stderr naming the field, exit code 2,
and nothing half-written; interrupts exit 130 (Ctrl-C) or 143 (SIGTERM) and leave the output folder
as it was. The CLI runs as a subprocess, exactly as a user runs it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import torch
from cli_process import run_moe_build
from safetensors.torch import save_file

from moe_build.engine.jobs import BuildJob, run_build_jobs
from moe_build.errors import MoeBuildError
from moe_build.planner import make_plan
from moe_build.spec import MoESpec
from moe_build.target import Flavour, Target

MIXTRAL_CONFIG = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 64, "num_local_experts": 4,
                  "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_attention_heads": 2,
                  "torch_dtype": "float16", "hidden_act": "silu"}


cli = run_moe_build


def assert_one_line_refusal(r: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit 2, no traceback, and the error is one line: the last, after any progress lines ("[1/1] ...")."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr
    assert lines and lines[-1].startswith("moe-build"), r.stderr
    assert all(line.startswith("[") for line in lines[:-1]), r.stderr
    for needle in needles:
        assert needle in lines[-1], (needle, lines[-1])


def checkpoint(tmp_path: Path, config: dict | bytes = MIXTRAL_CONFIG, index: dict | bytes | None = None) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_bytes(config if isinstance(config, bytes) else json.dumps(config).encode())
    if index is not None:
        (folder / "model.safetensors.index.json").write_bytes(
            index if isinstance(index, bytes) else json.dumps(index).encode())
    return folder


# --- checkpoint files --------------------------------------------------------------------------------------

@pytest.mark.parametrize("config,needles", [
    (b"\xff\xfe{}", ("config.json", "not UTF-8")),
    (b"[" * 100_000 + b"]" * 100_000, ("config.json", "nested too deeply")),
    (b"{\"model_type\": ", ("config.json", "not valid JSON")),
    (b"[1, 2]", ("config.json", "holds a list")),
    (json.dumps({**MIXTRAL_CONFIG, "hidden_size": 1 << 20}).encode(), ("hidden_size", "larger than moe-build builds")),
    (json.dumps({**MIXTRAL_CONFIG, "num_local_experts": "8"}).encode(), ("num_local_experts",)),
    (json.dumps({**MIXTRAL_CONFIG, "num_hidden_layers": 10**9}).encode(), ("num_hidden_layers",)),
])
@pytest.mark.parametrize("command", ["fusion-report", "build"])
def test_bad_config_is_one_line(tmp_path: Path, command: str, config: bytes, needles: tuple[str, ...]) -> None:
    folder = checkpoint(tmp_path, config)
    out = tmp_path / "out"
    r = cli(command, str(folder), *(["--out", str(out)] if command == "build" else []))
    assert_one_line_refusal(r, *needles)
    assert not out.exists()


@pytest.mark.parametrize("index,needles", [
    ({"weight_map": ["a", "b"]}, ("weight_map", "must map tensor names to shard file names")),
    ({"weight_map": {"model.layers.0.block_sparse_moe.gate.weight": 7}}, ("weight_map",)),
    ({"weight_map": {"model.layers.0.block_sparse_moe.gate.weight": "../elsewhere.safetensors"}},
     ("weight_map", "lies outside")),
    ({"weight_map": {"model.layers.0.block_sparse_moe.gate.weight": "/etc/passwd"}}, ("weight_map", "lies outside")),
    (b"\x80\x81", ("model.safetensors.index.json", "not UTF-8")),
])
def test_bad_checkpoint_index_is_one_line_and_reads_no_file_outside(tmp_path: Path, index: dict | bytes,
                                                                    needles: tuple[str, ...]) -> None:
    folder = checkpoint(tmp_path, index=index)
    out = tmp_path / "out"
    r = cli("build", str(folder), "--out", str(out))
    assert_one_line_refusal(r, *needles)
    assert r.stdout == "" and "loading weights" not in r.stderr  # refused before the plan, as every refusal of input
    assert not list(out.glob("*")) if out.exists() else True


def test_a_checkpoint_without_weights_is_refused_before_the_plan(tmp_path: Path) -> None:
    """A folder holding config.json alone (the weights not downloaded yet) builds nothing and prints no plan."""
    folder = checkpoint(tmp_path)
    r = cli("build", str(folder), "--out", str(tmp_path / "out"))
    assert_one_line_refusal(r, "model.safetensors", "no model.safetensors or model.safetensors.index.json")
    assert r.stdout == "" and "loading weights" not in r.stderr
    assert not (tmp_path / "out").exists()
    assert cli("fusion-report", str(folder)).returncode == 0  # the plan needs the config only


def test_shard_of_the_wrong_shape_names_the_tensor(tmp_path: Path) -> None:
    folder = checkpoint(tmp_path)
    save_file({"model.layers.0.block_sparse_moe.gate.weight": torch.zeros(4, 63, dtype=torch.float16)},
              str(folder / "model.safetensors"))
    r = cli("build", str(folder), "--out", str(tmp_path / "out"))
    assert_one_line_refusal(r, "model.layers.0.block_sparse_moe.gate.weight", "shape")
    assert not list((tmp_path / "out").glob("*.engine"))


# --- flags -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args,needles", [
    (["--hidden", "1048576", "--inter", "64", "--experts", "4", "--top-k", "2"], ("hidden_size", "1..65536")),
    (["--hidden", "64", "--inter", "64", "--experts", "100000", "--top-k", "2"], ("num_experts", "1..1024")),
    (["--hidden", "64", "--inter", "64", "--experts", "4", "--top-k", "0"], ("top_k",)),
    (["--hidden", "64", "--inter", "64", "--experts", "4"], ("--top-k", "required")),
    (["--preset", "tiny", "--hidden", "-8"], ("hidden_size",)),
    (["--preset", "nope"], ("preset", "tiny")),
    (["--preset", "tiny", "--dtype", "int3"], ("dtype", "bf16")),
    (["--preset", "tiny", "--seed", "-1"], ("--seed", "-1")),
    (["--preset", "tiny", "--seed", str(2**64)], ("--seed",)),
    (["--preset", "tiny", "--workspace-mb", str(1 << 40)], ("workspace_mb",)),
    (["--preset", "tiny", "--max-tokens", str(1 << 40)], ("max_tokens",)),
    (["--preset", "tiny", "--hidden", "abc"], ("--hidden", "abc")),
    (["--preset", "tiny", "--no-such-flag"], ("--no-such-flag",)),
    (["--preset", "tiny", "--gpu", "rtx-2080"], ("gpu", "'rtx-2080'", "rtx-3090")),
    (["--preset", "tiny", "--force", "gemm1_tactic"], ("force",)),
    (["--preset", "tiny", "--force", "no_stage=x"], ("no_stage",)),
    (["--preset", "tiny", "--timing-cache", "."], ("timing_cache", "is a folder", "moe-build.timing.cache")),
])
def test_bad_build_flags_are_one_line_and_write_nothing(tmp_path: Path, args: list[str],
                                                        needles: tuple[str, ...]) -> None:
    out = tmp_path / "out"
    r = cli("build", *args, "--out", str(out))
    assert_one_line_refusal(r, *needles)
    assert r.stdout == "" and not out.exists()


@pytest.mark.parametrize("args,needles", [
    (["--tokens", "0"], ("tokens",)),
    (["--tokens", str(1 << 40)], ("tokens",)),
    (["--json", "--markdown"], ("--json", "--markdown")),
    (["--explain", "no_stage"], ("no_stage",)),
    (["--sm", "75"], ("sm", "90")),
    (["--gpu", "h300"], ("gpu", "'h300'", "h100-sxm", "h200")),
    (["--gpu", "h200", "--sm", "89"], ("gpu", "h200 is SM 90", "--sm says 89", "--sm 90, or no --sm")),
    (["--quant", "w8a16", "--zero-points"], ("quant_zero_points", "w4a16_awq, w4afp8")),
    (["--prequant-scales"], ("quant_prequant_scales", "quant=none")),
    (["--quant", "w4a16_awq", "--group-size", "48"], ("group_size", "48", "32, 64, 128")),
    (["--group-size", "64"], ("group_size", "quant=none")),
    (["--act-scale", "static"], ("act_scale", "quant=none", "fp8, fp8_block, w4afp8")),
    (["--quant", "fp8", "--act-scale", "calibrated"], ("act_scale", "'calibrated'", "static, dynamic")),
    (["--quant", "fp8_block", "--act-scale", "static"], ("act_scale", "1 x 128", "dynamic")),
])
def test_bad_report_flags_are_one_line(args: list[str], needles: tuple[str, ...]) -> None:
    r = cli("fusion-report", "--preset", "tiny", *args)
    assert_one_line_refusal(r, *needles)
    assert r.stdout == ""


@pytest.mark.parametrize("args,needles", [
    (["--layers", "mixtral"], ("layers", "mixtral", "qwen3-30b-a3b, deepseek-v3-shaped")),
    (["--layers", ","], ("layers", "empty")),
])
def test_bad_bench_ep_flags_are_one_line_before_any_gpu_is_asked_for(args: list[str], needles: tuple[str, ...]) -> None:
    r = cli("bench-ep", *args)
    assert_one_line_refusal(r, *needles)
    assert r.stdout == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the command would run the bench")
@pytest.mark.parametrize("args", [[], ["--sweep"], ["--sweep", "--tokens", "5"], ["--quant", "fp8_block"],
                                  ["--quant", "w8a16"]])
def test_bench_without_a_gpu_is_one_line_in_every_mode(args: list[str]) -> None:
    assert_one_line_refusal(cli("bench", *args), "device", "moe-build bench needs a CUDA GPU")


@pytest.mark.parametrize("args", [[], ["--nproc", "2"]])
def test_bench_ep_without_two_gpus_says_what_it_needs(args: list[str]) -> None:
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has 2+ CUDA GPUs: bench-ep would run")
    r = cli("bench-ep", *args)
    assert_one_line_refusal(r, "device", "2 or more CUDA GPUs", f"this machine has {torch.cuda.device_count()}")
    assert r.stdout == ""


def test_no_command_prints_the_help() -> None:
    r = cli()
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.startswith("Usage: ") and "Commands:" in r.stdout and "fusion-report" in r.stdout


def test_unknown_command_is_one_line_with_the_commands() -> None:
    assert_one_line_refusal(cli("buidl"), "buidl", "(allowed: bench, bench-ep, build, check, export, fusion-report, "
                            "inspect, kernels, presets)")


def test_unknown_option_is_one_line_with_the_commands_options() -> None:
    assert_one_line_refusal(cli("inspect", "--bogus", "x.engine"), "--bogus", "(allowed: --help, --json)")
    assert_one_line_refusal(cli("build", "--bogus"), "--bogus", "--out", "--sm", "--preset", "--all-layers")


def test_inspect_of_a_missing_file_is_bad_input(tmp_path: Path) -> None:
    assert_one_line_refusal(cli("inspect", str(tmp_path / "none.engine")), "none.engine")


def test_flags_layer_is_named_by_its_shape(tmp_path: Path) -> None:
    """A layer given by flags gets a name that says what it is, not a generic 'flags'."""
    r = cli("fusion-report", "--hidden", "64", "--inter", "96", "--experts", "4", "--top-k", "2", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["spec"]["name"] == "moe-h64-i96-e4-k2"


# --- interrupts --------------------------------------------------------------------------------------------

@pytest.mark.trt
@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_interrupted_build_leaves_the_folder_as_it_was(tmp_path: Path, sig: signal.Signals, code: int,
                                                       word: str) -> None:
    pytest.importorskip("tensorrt_rtx_bindings")
    # The tiny engine builds in well under a second: a signal sent once TensorRT reports it is building can
    # arrive after the build has finished (engine published; exit 0, or killed by the signal while the
    # interpreter shuts down, after Python has put the default handlers back). That race says nothing about
    # the property under test, so such a run is repeated in a fresh folder; every interrupted run is checked.
    for attempt in range(ATTEMPTS):
        out = tmp_path / f"out{attempt}"
        out.mkdir()
        (out / "keep.txt").write_text("a user's file")
        rc, seen, rest = _build_interrupted(out, sig)
        if rc in (0, -sig) and "writing engine + manifest" in rest and (out / "tiny.json").is_file():
            continue
        assert rc == code, (seen, rest)
        assert f"moe-build: {word}; nothing half-written is left" in rest and "Traceback" not in rest
        assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
        return
    pytest.fail(f"the build finished before the signal in all {ATTEMPTS} attempts")


ATTEMPTS = 5


def _build_interrupted(out: Path, sig: signal.Signals) -> tuple[int, list[str], str]:
    """Build the tiny preset into `out`, sending `sig` once TensorRT is building (the longest phase, with temp
    state around); the exit code, the progress lines before the signal and the rest of stderr."""
    # the child starts with the signal's default disposition: a test run launched in the background by a
    # non-interactive shell inherits SIGINT ignored, and the build would then never see it
    proc = subprocess.Popen([sys.executable, "-m", "moe_build", "build", "--preset", "tiny", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL))
    assert proc.stderr is not None
    seen = []
    deadline = time.monotonic() + 300
    for line in proc.stderr:
        seen.append(line)
        if "building engine" in line or time.monotonic() > deadline:
            break
    assert any("building engine" in line for line in seen), seen
    os.kill(proc.pid, sig)
    rest = proc.stderr.read()
    return proc.wait(timeout=120), seen, rest


# --- --all-layers stops at the first failing layer and says what it kept -------------------------------------

def test_all_layers_failure_names_the_engines_it_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import moe_build.engine.jobs as jobs
    spec = MoESpec(64, 64, 4, 2)
    plan = make_plan(spec, Target(sm=89, flavour=Flavour.TENSORRT_RTX))
    built: list[str] = []

    class Result:
        def __init__(self, name: str) -> None:
            self.engine_path = tmp_path / f"{name}.engine"

    def fake_build(spec, weights, plan, options, progress):  # noqa: ANN001 - the builder's own signature
        built.append(options.name)
        return Result(options.name)

    def failing() -> tuple:
        raise MoeBuildError("model.layers.2.w1", "missing from the checkpoint", "a tensor of shape (4, 64, 64)")

    monkeypatch.setattr(jobs, "build_engine", fake_build)
    ok = lambda: (None, None)  # noqa: E731 - a loader that hands the fake builder nothing
    layer_jobs = [BuildJob("m-layer0", spec, plan, ok, "ckpt layer 0"), BuildJob("m-layer1", spec, plan, ok, "l1"),
                  BuildJob("m-layer2", spec, plan, failing, "ckpt layer 2")]
    from moe_build.engine.options import BuildOptions
    options = BuildOptions(output_dir=tmp_path, progress=False)
    with pytest.raises(MoeBuildError) as err:
        run_build_jobs(layer_jobs, options)
    text = str(err.value)
    assert text.startswith("model.layers.2.w1: missing from the checkpoint (at m-layer2, 3 of 3; the 2 built")
    assert "m-layer0.engine, m-layer1.engine" in text and built == ["m-layer0", "m-layer1"]
    # the first job failing is the plain error: nothing was kept, so nothing to list
    with pytest.raises(MoeBuildError) as err:
        run_build_jobs(layer_jobs[2:], options)
    assert "built before it" not in str(err.value)


# --- the machine refuses -------------------------------------------------------------------------------------

def test_engine_name_too_long_for_a_file_is_refused_first(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = cli("build", "--name", "x" * 300, "--out", str(out))
    assert_one_line_refusal(r, "name", "300 bytes", "at most 160")
    assert r.stdout == "" and not out.exists()


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 128 KiB tmpfs: room for the folder, not for the tiny engine's ONNX export."""
    folder = tmp_path / "small"
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(folder)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a size-capped tmpfs needs root (the simulated disk-full test in "
                    "test_engine_build.py runs everywhere)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.mark.trt
def test_disk_full_is_one_line_and_leaves_nothing(full_disk: Path) -> None:
    pytest.importorskip("tensorrt_rtx_bindings")
    out = full_disk / "engines"
    r = cli("build", "--out", str(out))
    assert_one_line_refusal(r, "output: No space left on device while building tiny")
    assert list(full_disk.rglob("*")) in ([], [out])  # at most the (empty) folder it was asked to create


def test_act_scale_flag_reaches_the_plan() -> None:
    """--act-scale describes a flags-only FP8 layer's activation scales as a checkpoint's config would: static ones
    (ModelOpt's input_scale) let GEMM1's gated epilogue quantize GEMM2's input (fc2_input_quant=gemm1), dynamic ones
    do not."""
    import json
    base = ["fusion-report", "--preset", "qwen3-30b-a3b", "--sm", "90", "--quant", "fp8", "--tokens", "4096", "--json"]
    static = json.loads(cli(*base, "--act-scale", "static").stdout)
    assert static["spec"]["act_scale"] == "static"
    assert {s["stage"]: s["choice"] for s in static["stages"]}["fc2_input_quant"] == "gemm1"
    dynamic = json.loads(cli(*base, "--act-scale", "dynamic").stdout)
    assert dynamic["spec"]["act_scale"] == "dynamic"
    assert {s["stage"]: s["choice"] for s in dynamic["stages"]}["fc2_input_quant"] == "separate"


def test_weight_only_storage_flags_reach_the_plan() -> None:
    """--group-size / --zero-points / --prequant-scales describe a flags-only weight-only layer as a checkpoint's
    config would; the stored pre-quant scales turn the AWQ FC2 fusion on (use_awq), their absence off."""
    import json
    base = ["fusion-report", "--preset", "tiny", "--sm", "90", "--quant", "w4a16_awq", "--json"]
    with_scales = json.loads(cli(*base, "--group-size", "32", "--zero-points", "--prequant-scales").stdout)
    assert {k: with_scales["spec"][k] for k in ("quant_group_size", "quant_zero_points", "quant_prequant_scales")} \
        == {"quant_group_size": 32, "quant_zero_points": True, "quant_prequant_scales": True}
    stages = {s["stage"]: s["choice"] for s in with_scales["stages"]}
    assert stages["fc2_prequant"] == "fused"
    folded = json.loads(cli(*base).stdout)
    assert {s["stage"]: s["choice"] for s in folded["stages"]}["fc2_prequant"] == "none"
