"""`moe-build check` and `moe-build export` end to end on the CPU, through the console entry point (`main`,
in this process: the exit codes and one-line errors are main's).

Each family: a tiny random checkpoint built offline by transformers (as test_families.py does), then
`check` runs moe-build's fp32 graph on onnxruntime against transformers' own MoE block of that checkpoint.
That the check can fail: a wrong reading of the checkpoint on moe-build's side (an expert perturbed, two
experts' router rows swapped, after moe-build's loader) fails it with exit 1, and so does a graph exported
before the checkpoint changed. A fresh check of the changed checkpoint passes: both sides read the same
files, which is the manifest's sha256's to guard, not the check's.
"""
from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from moe_build.cli import main

transformers = pytest.importorskip("transformers")
t = transformers

H, I, E = 32, 24, 8
_A = dict(num_attention_heads=2, num_key_value_heads=2, vocab_size=64, hidden_size=H, pad_token_id=0)
_MOE = dict(moe_intermediate_size=I, num_experts_per_tok=3)
_MLA = dict(kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=4)

CONFIGS: dict[str, Callable[[], Any]] = {
    "mixtral": lambda: t.MixtralConfig(**_A, intermediate_size=I, num_local_experts=E, num_experts_per_tok=2,
                                       num_hidden_layers=1),
    "qwen3_moe": lambda: t.Qwen3MoeConfig(**_A, intermediate_size=40, **_MOE, num_experts=E, norm_topk_prob=True,
                                          head_dim=16, num_hidden_layers=1),
    "deepseek_v3": lambda: t.DeepseekV3Config(**_A, **_MLA, intermediate_size=40, moe_intermediate_size=I,
                                              n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1,
                                              first_k_dense_replace=1, num_hidden_layers=2, n_group=4, topk_group=2,
                                              routed_scaling_factor=2.5),
    "gpt_oss": lambda: t.GptOssConfig(**_A, intermediate_size=I, num_local_experts=E, num_experts_per_tok=3,
                                      head_dim=16, num_hidden_layers=1, layer_types=["full_attention"],
                                      swiglu_limit=1.0),
    "glm4_moe": lambda: t.Glm4MoeConfig(**_A, intermediate_size=40, **_MOE, n_routed_experts=E, num_hidden_layers=2,
                                        head_dim=16, n_group=2, topk_group=1, routed_scaling_factor=2.5),
    "qwen3_next": lambda: t.Qwen3NextConfig(**_A, intermediate_size=40, **_MOE, num_experts=E, num_hidden_layers=2,
                                            head_dim=16, shared_expert_intermediate_size=20,
                                            layer_types=["full_attention"] * 2, mlp_only_layers=[0]),
    # the shared MLP sits beside the MoE block, in the decoder layer
    "granitemoeshared": lambda: t.GraniteMoeSharedConfig(**_A, intermediate_size=I, num_local_experts=E,
                                                         num_experts_per_tok=2, num_hidden_layers=1,
                                                         shared_intermediate_size=20),
}


def _randomize(model: torch.nn.Module) -> None:
    """Unit-scale random MoE weights and 0.1-scale selection biases (the init would leave routing untested)."""
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            if not p.is_floating_point() or not any(k in name for k in (".mlp.", "block_sparse_moe", "shared_mlp")):
                continue
            if name.endswith("e_score_correction_bias"):
                p.copy_(torch.randn_like(p) * 0.1)
            else:
                p.copy_(torch.randn_like(p) / (p.shape[-1] ** 0.5 if p.dim() > 1 else 2.0))


def build_checkpoint(config: Callable[[], Any], folder: Path, dtype: torch.dtype = torch.float32,
                     **save: Any) -> Path:
    """A random model of `config` saved by transformers to `folder`."""
    torch.manual_seed(0)
    model = t.AutoModelForCausalLM.from_config(config())
    _randomize(model)
    model.to(dtype).save_pretrained(folder, **save)
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """name -> its checkpoint, built once for the module."""
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            built[name] = build_checkpoint(CONFIGS[name], tmp_path_factory.mktemp(name))
        return built[name]
    return get


@pytest.fixture
def moe_build(capsys: pytest.CaptureFixture[str],
              monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[int, str, str]]:
    """Run the console entry point with these arguments: (exit code, stdout, stderr)."""
    def run(*args: object) -> tuple[int, str, str]:
        capsys.readouterr()  # what came before (building a checkpoint) is not the command's
        monkeypatch.setattr(sys, "argv", ["moe-build", *map(str, args)])
        previous = signal.getsignal(signal.SIGTERM)  # main() installs its own handler
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        finally:
            signal.signal(signal.SIGTERM, previous)
        out, err = capsys.readouterr()
        return code, out, err
    return run


def _one_line_error(code: int, err: str, field: str) -> None:
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"moe-build: error: {field}"), err


# ---- check ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CONFIGS))
def test_check_passes(checkpoints: Callable[[str], Path], moe_build: Callable[..., Any], name: str) -> None:
    code, out, err = moe_build("check", checkpoints(name), "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["schema"] == "moe-build.check/1" and r["passed"] and r["failure"] is None
    assert r["family"] == name and r["tokens"] == 64 and r["seed"] == 0 and r["graph_dtype"] == "fp32"
    assert r["tokens_with_different_experts"] == 0 and r["tokens_compared"] + r["tokens_near_tied"] == 64
    assert r["rel_norm"] < 1e-6 and r["max_abs"] < r["tolerance"]["atol"]
    phases = [line.split(" (")[0] for line in err.splitlines()]
    assert phases == ["check: loading layer {} with moe-build's loader".format(r["layer"]),
                      "check: exporting the layer's ONNX graph in fp32", "check: running the graph",
                      "check: loading transformers' block", "check: running transformers' block"]


def test_check_text_on_a_sharded_bf16_checkpoint(tmp_path: Path, moe_build: Callable[..., Any]) -> None:
    """The bf16 weights reach both sides exactly (fp32 holds every bf16 value); the index lists the shards."""
    folder = build_checkpoint(CONFIGS["mixtral"], tmp_path, torch.bfloat16, max_shard_size="10KB")
    assert (folder / "model.safetensors.index.json").is_file()
    code, out, err = moe_build("check", folder, "--tokens", "16", "--seed", "3")
    assert code == 0, err
    assert "16 random tokens, seed 3" in out and "MixtralForCausalLM model.layers.0.mlp" in out
    assert "max abs" in out and "rel-norm" in out and out.rstrip().endswith("PASSED")


def test_check_of_a_released_mxfp4_gpt_oss_goes_through_transformers_dequantizer(
        tmp_path: Path, moe_build: Callable[..., Any]) -> None:
    """GPT-OSS is released with MXFP4 experts and a quantization_config: transformers dequantizes them itself."""
    from safetensors.torch import load_file, save_file
    build_checkpoint(lambda: t.GptOssConfig(**{**_A, "hidden_size": 64}, intermediate_size=32, num_local_experts=E,
                                            num_experts_per_tok=3, head_dim=16, num_hidden_layers=1,
                                            layer_types=["full_attention"]), tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    for name, (rows, cols) in {"gate_up_proj": (64, 64), "down_proj": (64, 32)}.items():  # nn.Linear (out, in)
        key = f"model.layers.0.mlp.experts.{name}"
        del tensors[key]
        tensors[key + "_blocks"] = torch.randint(0, 256, (E, rows, cols // 32, 16), dtype=torch.uint8)
        tensors[key + "_scales"] = torch.randint(122, 131, (E, rows, cols // 32), dtype=torch.uint8)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "mxfp4"}}))
    code, out, err = moe_build("check", tmp_path, "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["passed"] and r["rel_norm"] < 1e-6 and r["tokens_compared"] > 60


@pytest.mark.parametrize("fmt", ["ct_fp8", "ct_fp8_dynamic", "ct_w4a16_g32", "ct_w8a16"])
@pytest.mark.parametrize("misread", [False, True], ids=["as_read", "one_scale_misread"])
def test_check_of_a_compressed_tensors_checkpoint_goes_through_transformers_dequantizer(
        tmp_path: Path, moe_build: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, fmt: str,
        misread: bool) -> None:
    """FP8 and packed int checkpoints written by compressed-tensors' own code: transformers dequantizes them itself,
    and the check compares moe-build's dense reading of the same files with it (the FP8 graph had quantized its
    activations, which transformers' block does not, and an int8 block had run in bf16: both failed). One expert's
    weight scale misread by 1% after moe-build's loader fails it."""
    pytest.importorskip("compressed_tensors")
    if fmt.startswith("ct_fp8"):
        from test_fp8_checkpoints import FAMILIES, _fp8_checkpoint as write
    else:
        from test_woq_checkpoints import FAMILIES, _checkpoint as write
    write(FAMILIES["qwen3_moe"], fmt, tmp_path)
    if misread:
        import moe_build.weights.checkpoint as checkpoint
        load = checkpoint.load_moe_layer

        def misreading(*args: Any, **kwargs: Any) -> Any:
            loaded = load(*args, **kwargs)
            quant = loaded.weights.fp8 or loaded.weights.woq
            quant.w2_scale[3] *= 1.01
            return loaded
        monkeypatch.setattr(checkpoint, "load_moe_layer", misreading)
    code, out, err = moe_build("check", tmp_path, "--json")
    r = json.loads(out)
    if misread:
        assert code == 1 and not r["passed"] and "outside the tolerance" in r["failure"]
    else:
        assert code == 0, err
        assert r["passed"] and r["rel_norm"] < 1e-6 and r["tokens_compared"] > 60


@pytest.mark.parametrize("hidden", [256, 192])
def test_check_of_a_deepseek_block128_checkpoint(tmp_path: Path, moe_build: Callable[..., Any], hidden: int) -> None:
    """DeepSeek-V3's FP8 format (quant_method fp8, 128 x 128 blocks) through transformers' own FP8 dequantization.
    At hidden 256 it passes. At 192, where the last block is partial, transformers takes 96-column blocks, which is
    not the format, so the check refuses instead of failing moe-build's reading."""
    from test_fp8_checkpoints import Family, _rewrite, _saved, _write_block128
    family = Family(lambda: transformers.Qwen3MoeConfig(
        num_attention_heads=2, num_key_value_heads=2, vocab_size=64, hidden_size=hidden, intermediate_size=256,
        moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2, head_dim=16, num_hidden_layers=1,
        norm_topk_prob=True), 0, ("gate_proj", "up_proj", "down_proj"))
    _saved(family, tmp_path)
    _rewrite(tmp_path, lambda tensors: _write_block128(family, tensors, tmp_path))
    if hidden % 128:
        code, _, err = moe_build("check", tmp_path)
        assert code == 2 and err.strip().splitlines()[-1].startswith(
            "moe-build: error: checkpoint: block-128 FP8 with hidden 192 and intermediate 128"), err
        return
    pytest.importorskip("accelerate")
    code, out, err = moe_build("check", tmp_path, "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["passed"] and r["rel_norm"] < 1e-6 and r["tokens_compared"] > 60


def _perturb_expert(loaded: Any) -> None:
    loaded.weights.w2[3] *= 1.01


def _swap_router_rows(loaded: Any) -> None:
    loaded.weights.router_weight[[1, 2]] = loaded.weights.router_weight[[2, 1]].clone()


@pytest.mark.parametrize("wrong, failure", [(_perturb_expert, "outside the tolerance"),
                                            (_swap_router_rows, "picked different experts with no near-tie")],
                         ids=["expert", "router"])
def test_check_fails_when_moe_builds_reading_is_wrong(checkpoints: Callable[[str], Path],
                                                      moe_build: Callable[..., Any], monkeypatch: pytest.MonkeyPatch,
                                                      wrong: Callable[[Any], None], failure: str) -> None:
    """The expected output is transformers' alone: a slip in moe-build's reading (here after its loader) fails."""
    import moe_build.weights.checkpoint as checkpoint
    load = checkpoint.load_moe_layer

    def misread(*args: Any, **kwargs: Any) -> Any:
        loaded = load(*args, **kwargs)
        wrong(loaded)
        return loaded

    monkeypatch.setattr(checkpoint, "load_moe_layer", misread)
    code, out, err = moe_build("check", checkpoints("qwen3_moe"), "--json")
    assert code == 1
    r = json.loads(out)
    assert not r["passed"] and failure in r["failure"]
    assert err.splitlines()[-1].startswith("moe-build: verification failed: check of ")


def test_a_graph_exported_before_the_checkpoint_changed_fails(tmp_path: Path, moe_build: Callable[..., Any]) -> None:
    from safetensors.torch import load_file, save_file
    folder = build_checkpoint(CONFIGS["qwen3_moe"], tmp_path / "ckpt")
    graph = tmp_path / "layer.onnx"
    assert moe_build("export", folder, "--onnx", graph, "--dtype", "fp32")[0] == 0
    assert moe_build("check", folder, "--onnx", graph)[0] == 0
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.mlp.experts.3.down_proj.weight"] *= 1.5
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    code, out, _ = moe_build("check", folder, "--onnx", graph)
    assert code == 1 and "FAILED: outside the tolerance" in out
    code, out, _ = moe_build("check", folder)  # a fresh graph reads the changed file as transformers does
    assert code == 0 and out.rstrip().endswith("PASSED")


def test_check_of_an_fp16_graph(checkpoints: Callable[[str], Path], moe_build: Callable[..., Any],
                                tmp_path: Path) -> None:
    graph = tmp_path / "fp16.onnx"
    assert moe_build("export", checkpoints("deepseek_v3"), "--onnx", graph, "--dtype", "fp16")[0] == 0
    code, out, err = moe_build("check", checkpoints("deepseek_v3"), "--onnx", graph, "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["graph_dtype"] == "fp16" and r["tolerance"]["rtol"] == 1e-2 and r["rel_norm"] < 1e-2


# ---- export -----------------------------------------------------------------------------------------------------

def _run(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    onnx.checker.check_model(str(path), full_check=True)
    (out,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    return out


def test_export_of_a_checkpoint_layer(checkpoints: Callable[[str], Path], moe_build: Callable[..., Any],
                                      tmp_path: Path) -> None:
    graph = tmp_path / "new" / "glm4.onnx"
    code, out, err = moe_build("export", checkpoints("glm4_moe"), "--layer", "1", "--onnx", graph)
    assert code == 0, err
    assert out.startswith(f"wrote {graph} (") and "layer 1, fp32, inputs hidden [tokens, 32]" in out
    assert [p.name for p in graph.parent.iterdir()] == ["glm4.onnx"]  # no scratch left
    assert _run(graph, {"hidden": np.random.randn(5, H).astype(np.float32)}).shape == (5, H)


def test_export_of_a_preset_with_external_data(moe_build: Callable[..., Any], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Random weights (no checkpoint); weights over the threshold go to PATH.data beside the graph."""
    import moe_build.graph.ootb as ootb
    monkeypatch.setattr(ootb, "EXTERNAL_DATA_THRESHOLD", 0)
    graph = tmp_path / "tiny.onnx"
    code, out, err = moe_build("export", "--preset", "tiny", "--onnx", graph, "--routing-input", "logits",
                               "--dtype", "fp32", "--seed", "7")
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.onnx", "tiny.onnx.data"]
    assert "random weights, seed 7" in out and "+ logits" in out
    feeds = {"hidden": np.random.randn(3, 64).astype(np.float32),
             "router_logits": np.random.randn(3, 8).astype(np.float32)}
    assert _run(graph, feeds).shape == (3, 64)


def test_interrupted_export_leaves_the_old_graph_and_nothing_else(moe_build: Callable[..., Any], tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import moe_build.graph.export as export
    graph = tmp_path / "tiny.onnx"
    graph.write_bytes(b"old")

    def interrupted(spec: Any, weights: Any, plan: Any, path: Path, routing_input: str) -> Path:
        Path(path).write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(export, "export_onnx", interrupted)
    code, _, err = moe_build("export", "--onnx", graph)
    assert code == 130 and "interrupted" in err
    assert [p.name for p in tmp_path.iterdir()] == ["tiny.onnx"] and graph.read_bytes() == b"old"


# ---- bad input --------------------------------------------------------------------------------------------------

def test_bad_input_is_one_line_and_leaves_no_file(checkpoints: Callable[[str], Path], moe_build: Callable[..., Any],
                                                  tmp_path: Path) -> None:
    ckpt = checkpoints("deepseek_v3")
    (tmp_path / "a-file").write_text("")
    graph = tmp_path / "out" / "x.onnx"
    cases = [
        (("check", tmp_path / "missing"), "checkpoint"),
        (("check", ckpt, "--layer", "0"), "layer"),  # the dense layer
        (("check", ckpt, "--layer", "7"), "layer"),
        (("check", ckpt, "--tokens", "0"), "tokens"),
        (("check", ckpt, "--rtol", "-1"), "rtol"),
        (("check", ckpt, "--onnx", tmp_path / "missing.onnx"), "onnx"),
        (("check", ckpt, "--onnx", tmp_path / "a-file"), "onnx"),
        (("export", tmp_path / "missing", "--onnx", graph), "checkpoint"),
        (("export", ckpt, "--layer", "7", "--onnx", graph), "layer"),
        (("export", ckpt, "--onnx", graph, "--routing-input", "experts"), "routing_input"),
        (("export", "--layer", "1", "--onnx", graph), "layer"),
        (("export", ckpt, "--onnx", tmp_path / "a-file" / "x.onnx"), "onnx"),
        (("export", ckpt, "--onnx", tmp_path), "onnx"),
        (("export", ckpt, "--onnx", f"{tmp_path / 'not-yet-a-folder'}/"), "onnx"),  # would have written that file
    ]
    for args, field in cases:
        code, out, err = moe_build(*args)
        _one_line_error(code, err, field)
        assert out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_check_refuses_a_graph_with_other_inputs(checkpoints: Callable[[str], Path], moe_build: Callable[..., Any],
                                                 tmp_path: Path) -> None:
    graph = tmp_path / "logits.onnx"
    assert moe_build("export", checkpoints("mixtral"), "--onnx", graph, "--routing-input", "logits")[0] == 0
    code, _, err = moe_build("check", checkpoints("mixtral"), "--onnx", graph)
    _one_line_error(code, err, "onnx")
    assert "--routing-input hidden" in err
