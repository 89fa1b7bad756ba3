"""`moe-build build` / `inspect` end to end on the CPU with TensorRT-RTX: real engines, real manifests."""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
from cli_process import run_moe_build

pytest.importorskip("tensorrt_rtx_bindings")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.trt
cli = run_moe_build


@pytest.fixture(scope="module")
def mixtral_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-layer tiny Mixtral saved by transformers itself, sharded, in fp16."""
    cfg = transformers.MixtralConfig(num_attention_heads=2, num_key_value_heads=2, vocab_size=64, num_hidden_layers=2,
                                     hidden_size=64, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.float16)
    folder = tmp_path_factory.mktemp("mixtral")
    model.save_pretrained(folder, max_shard_size="40KB")
    assert (folder / "model.safetensors.index.json").exists()
    return folder


def test_default_build_needs_no_arguments(tmp_path: Path) -> None:
    r = cli("build", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "path: ootb" in r.stdout and "dense_masked" in r.stdout
    assert "[1/1] built engines/tiny.engine" in r.stdout and "workspace TensorRT's default" in r.stdout
    # every phase, one line each on stderr (not a terminal), TensorRT's own top-level phase included
    phases = [line for line in r.stderr.splitlines() if "TensorRT:" not in line]
    assert phases == ["[1/1] tiny: loading weights (random weights (seed 0))", "[1/1] tiny: exporting ONNX",
                      "[1/1] tiny: parsing ONNX", "[1/1] tiny: building engine (TensorRT)",
                      "[1/1] tiny: writing engine + manifest"]
    assert "[1/1] tiny:   TensorRT: Building engine" in r.stderr
    engine, manifest = tmp_path / "engines" / "tiny.engine", tmp_path / "engines" / "tiny.json"
    assert engine.stat().st_size > 0
    m = json.loads(manifest.read_text())
    assert m["spec"]["name"] == "tiny" and m["plan"]["path"] == "ootb" and m["flavour"]["name"] == "tensorrt-rtx"
    assert sorted(p.name for p in (tmp_path / "engines").iterdir() if not p.name.startswith("moe-build.")) == \
        ["tiny.engine", "tiny.json"]


def test_checkpoint_layer_build_then_inspect_agrees(mixtral_ckpt: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = cli("build", str(mixtral_ckpt), "--layer", "1", "--out", str(out), "--max-tokens", "64", "--opt-tokens", "8")
    assert r.returncode == 0, r.stderr
    (engine,) = out.glob("*.engine")
    assert engine.name.endswith("-layer1.engine")
    m = json.loads(engine.with_suffix(".json").read_text())
    assert m["profile"] == {"min": 1, "opt": 8, "max": 64}
    assert m["spec"]["dtype"] == "fp16" and m["spec"]["num_experts"] == 4
    r = cli("inspect", str(engine), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["verified"] and doc["plan_path"] == m["plan"]["path"] and doc["profile"] == m["profile"]
    assert {t["name"] for t in doc["recorded"]["inputs"]} == {"hidden"}
    r = cli("inspect", str(engine.with_suffix(".json")))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"verified {engine}") and "I/O tensors" in r.stdout and "{'" not in r.stdout
    assert f"{len(m['graph']['layers'])} layers" in r.stdout and m["graph"]["layers"][0]["name"] in r.stdout
    # tamper with the engine: inspect must say so and exit 1
    data = bytearray(engine.read_bytes())
    data[len(data) // 2] ^= 0xFF
    engine.write_bytes(bytes(data))
    r = cli("inspect", str(engine))
    assert r.returncode == 1 and "sha256" in r.stderr


def test_all_layers_builds_one_engine_per_moe_layer(mixtral_ckpt: Path, tmp_path: Path) -> None:
    r = cli("build", str(mixtral_ckpt), "--all-layers", "--out", str(tmp_path), "--max-tokens", "32")
    assert r.returncode == 0, r.stderr
    assert "[1/2]" in r.stdout and "[2/2]" in r.stdout
    assert sorted(p.name.rsplit("-", 1)[-1] for p in tmp_path.glob("*.engine")) == ["layer0.engine", "layer1.engine"]
    digests = {json.loads(p.read_text())["weights_sha256"] for p in tmp_path.glob("*.json")
               if not p.name.startswith("moe-build.")}
    assert len(digests) == 2  # each layer's own weights


@pytest.mark.parametrize("args,field", [
    (["--quant", "w8a16"], "quant"),
    (["--min-tokens", "64", "--opt-tokens", "8", "--max-tokens", "1"], "min_tokens"),
    (["--sm", "90"], "sm"),
    (["--layer", "3"], "layer"),
    (["--opt-level", "6"], "opt_level: 6 is out of range (allowed: 0..5)"),
    (["--workspace-mb", "0"], "workspace_mb: 0 MiB"),
    (["--routing-input", "router"], "routing_input"),
    (["--flavour", "tensorrt", "--sm", "90", "--routing-input", "topk"], "routing_input"),
])
def test_bad_build_inputs_exit_2_and_leave_nothing(args: list[str], field: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    needs_ckpt = args[0] == "--layer"
    if "tensorrt" in args and importlib.util.find_spec("tensorrt") is None:
        pytest.skip("without full TensorRT the plugin path is refused first (test_plugin_path_without_full_tensorrt)")
    r = cli("build", *(["--preset", "tiny"] if not needs_ckpt else []), *args, "--out", str(out))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert field in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert r.stdout == ""  # refused before the plan table
    assert list(out.iterdir()) == []


@pytest.fixture
def unreadable_ckpt(mixtral_ckpt: Path, tmp_path: Path) -> Path:
    """The tiny Mixtral with every safetensors file overwritten: its config reads, its weights do not."""
    folder = tmp_path / "broken"
    shutil.copytree(mixtral_ckpt, folder)
    shards = list(folder.glob("*.safetensors"))
    assert shards
    for shard in shards:
        shard.write_bytes(b"\x00not safetensors")
    return folder


PLUGIN_REFUSAL = ("moe-build: error: path: the plan takes the plugin path, which needs full TensorRT (add_plugin_v3); "
                  "TensorRT is not installed here (ModuleNotFoundError: No module named 'tensorrt'): "
                  "pip install 'moe-build[trt]' from NVIDIA's index, or build an OOTB engine with "
                  "--flavour tensorrt-rtx --sm 89 (or --moe-plugin disable)")


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="full TensorRT is installed here")
@pytest.mark.parametrize("source", ["preset", "unreadable checkpoint"])
def test_plugin_path_without_full_tensorrt(source: str, unreadable_ckpt: Path, tmp_path: Path) -> None:
    """`--flavour tensorrt --sm 90` plans the plugin path; without full TensorRT that is one line, exit 2,
    before any weight is read (an unreadable checkpoint still gets this refusal, not a weights error)."""
    out = tmp_path / "out"
    r = cli("build", *(["--preset", "tiny"] if source == "preset" else [str(unreadable_ckpt)]),
            "--flavour", "tensorrt", "--sm", "90", "--out", str(out))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.strip() == PLUGIN_REFUSAL and r.stdout == ""
    assert not out.exists()
    # the way out it names: the OOTB path on TensorRT-RTX, from the same (unreadable) source, fails later and
    # differently for the checkpoint (its weights), and builds for the preset
    r = cli("build", *(["--preset", "tiny"] if source == "preset" else [str(unreadable_ckpt)]),
            "--flavour", "tensorrt-rtx", "--sm", "89", "--out", str(out))
    if source == "preset":
        assert r.returncode == 0 and (out / "tiny.engine").exists(), r.stderr
    else:
        assert r.returncode != 0 and "plugin path" not in r.stderr and "loading weights" in r.stderr
        assert not list(out.glob("*.engine"))


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="full TensorRT is installed here")
def test_plugin_path_of_a_named_part_without_full_tensorrt(tmp_path: Path) -> None:
    """`--gpu h200` plans SM 90's plugin path; the refusal's way out names the SM to build in place of the part (an
    --sm beside a --gpu of another SM is refused)."""
    out = tmp_path / "out"
    r = cli("build", "--preset", "tiny", "--gpu", "h200", "--out", str(out))
    assert r.returncode == 2 and r.stdout == "" and not out.exists()
    assert r.stderr.strip() == PLUGIN_REFUSAL.replace("--sm 89 (", "--sm 89 in place of --gpu ("), r.stderr


def test_layer_out_of_range_is_refused_before_any_weight(unreadable_ckpt: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = cli("build", str(unreadable_ckpt), "--layer", "5", "--out", str(out))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().startswith("moe-build: error: layer: decoder layer 5 is not an MoE layer")
    assert r.stderr.strip().endswith("(allowed: 0, 1)") and len(r.stderr.strip().splitlines()) == 1


def test_not_an_moe_checkpoint(tmp_path: Path) -> None:
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64,
                                                    "intermediate_size": 128, "num_hidden_layers": 1}))
    out = tmp_path / "out"
    out.mkdir()
    r = cli("build", str(folder), "--out", str(out))
    assert r.returncode == 2 and r.stderr.startswith("moe-build: error: ")
    assert list(out.iterdir()) == []


def test_unwritable_output_folder(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    r = cli("build", "--out", str(blocker / "engines"))
    assert r.returncode == 2 and "output" in r.stderr, r.stderr
