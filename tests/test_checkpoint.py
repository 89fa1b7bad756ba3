"""Checkpoint loading: on-disk layouts transformers writes, sharding, digests, and broken checkpoints."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from safetensors.torch import load_file, save_file

from moe_build.weights.checkpoint import INDEX_FILE, SINGLE_FILE, load_moe_layer
from moe_build.errors import MoeBuildError
from moe_build.reference import moe_reference
from moe_build.weights import MoEWeights

transformers = pytest.importorskip("transformers")

_ATTN = dict(num_attention_heads=2, num_key_value_heads=2, vocab_size=64, num_hidden_layers=1)


def _mixtral() -> Any:
    return transformers.MixtralConfig(**_ATTN, hidden_size=32, intermediate_size=16, num_local_experts=4,
                                      num_experts_per_tok=2)


def _qwen2_moe() -> Any:
    return transformers.Qwen2MoeConfig(**_ATTN, hidden_size=32, intermediate_size=40, moe_intermediate_size=16,
                                       shared_expert_intermediate_size=24, num_experts=4, num_experts_per_tok=2)


def _gpt_oss() -> Any:
    return transformers.GptOssConfig(**_ATTN, hidden_size=32, intermediate_size=16, num_local_experts=4,
                                     num_experts_per_tok=2, head_dim=16, layer_types=["full_attention"])


def _model(config: Any, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A random model whose MoE tensors are all distinct (so a layout mix-up cannot go unnoticed)."""
    model = transformers.AutoModelForCausalLM.from_config(config, experts_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".mlp." in name:
                p.copy_(torch.randn_like(p))
    return model.to(dtype)


def _assert_same(a: MoEWeights, b: MoEWeights) -> None:
    assert [n for n, _ in a.named()] == [n for n, _ in b.named()]
    for (name, x), (_, y) in zip(a.named(), b.named()):
        assert x.dtype == y.dtype and torch.equal(x, y), name


def test_mixtral_layout_matches_transformers_params(tmp_path: Path) -> None:
    """Per-expert w1/w3/w2 on disk; transformers fuses them to gate_up_proj [E, 2I, H] in memory."""
    model = _model(_mixtral())
    model.save_pretrained(tmp_path)
    assert "model.layers.0.block_sparse_moe.experts.0.w1.weight" in load_file(tmp_path / SINGLE_FILE)
    w = load_moe_layer(tmp_path).weights
    experts = model.model.layers[0].mlp.experts
    assert torch.equal(w.w1, experts.gate_up_proj) and torch.equal(w.w2, experts.down_proj)
    assert torch.equal(w.router_weight, model.model.layers[0].mlp.gate.weight)


def test_gpt_oss_layout(tmp_path: Path) -> None:
    """GPT-OSS stores fused [E, H, 2I] with gate/up interleaved along the last dim, down as [E, I, H]."""
    model = _model(_gpt_oss())
    model.save_pretrained(tmp_path)
    w = load_moe_layer(tmp_path).weights
    experts, I = model.model.layers[0].mlp.experts, 16
    x = torch.randn(5, 32)
    gate_up = x @ experts.gate_up_proj[1] + experts.gate_up_proj_bias[1]
    ours = torch.nn.functional.linear(x, w.w1[1], w.b1[1])
    torch.testing.assert_close(ours[:, :I], gate_up[:, 0::2])
    torch.testing.assert_close(ours[:, I:], gate_up[:, 1::2])
    h = torch.randn(5, I)
    torch.testing.assert_close(torch.nn.functional.linear(h, w.w2[1], w.b2[1]),
                               h @ experts.down_proj[1] + experts.down_proj_bias[1])
    assert torch.equal(w.router_bias, model.model.layers[0].mlp.router.bias)


@pytest.mark.parametrize("make", [_mixtral, _qwen2_moe, _gpt_oss], ids=lambda f: f.__name__[1:])
def test_sharded_equals_single_file(tmp_path: Path, make: Callable[[], Any]) -> None:
    model = _model(make())
    model.save_pretrained(tmp_path / "single")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="8KB")
    index = json.loads((tmp_path / "sharded" / INDEX_FILE).read_text())
    assert len(set(index["weight_map"].values())) > 2
    single, sharded = load_moe_layer(tmp_path / "single"), load_moe_layer(tmp_path / "sharded")
    _assert_same(single.weights, sharded.weights)
    assert single.sha256 == sharded.sha256 and single.tensors == sharded.tensors


def test_fused_state_dict_layout(tmp_path: Path) -> None:
    """A file written straight from a transformers 5.x state_dict (fused experts, `mlp` names) loads the same."""
    model = _model(_qwen2_moe())
    model.save_pretrained(tmp_path / "hf")
    fused = tmp_path / "fused"
    fused.mkdir()
    shutil.copy(tmp_path / "hf" / "config.json", fused)
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if ".mlp." in k}, fused / SINGLE_FILE)
    assert "model.layers.0.mlp.experts.gate_up_proj" in load_file(fused / SINGLE_FILE)
    _assert_same(load_moe_layer(tmp_path / "hf").weights, load_moe_layer(fused).weights)


def test_dtype_kept_and_digest_tracks_bytes(tmp_path: Path) -> None:
    model = _model(_mixtral(), torch.bfloat16)
    model.save_pretrained(tmp_path)
    first = load_moe_layer(tmp_path)
    assert first.weights.w1.dtype == torch.bfloat16 and first.spec.dtype.value == "bf16"
    assert load_moe_layer(tmp_path).sha256 == first.sha256
    tensors = load_file(tmp_path / SINGLE_FILE)
    name = "model.layers.0.block_sparse_moe.experts.3.w2.weight"
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = tensors[name].view(-1)[0] + 1
    save_file(tensors, tmp_path / SINGLE_FILE, metadata={"format": "pt"})
    assert load_moe_layer(tmp_path).sha256 != first.sha256


# ---- broken checkpoints -------------------------------------------------------------------

_EXPERT = "model.layers.0.block_sparse_moe.experts.2.w3.weight"


def _saved(tmp_path: Path) -> Path:
    _model(_mixtral()).save_pretrained(tmp_path)
    return tmp_path


def _rewrite(folder: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    tensors = load_file(folder / SINGLE_FILE)
    edit(tensors)
    save_file(tensors, folder / SINGLE_FILE, metadata={"format": "pt"})


def _error(folder: Path, **kw: Any) -> MoeBuildError:
    with pytest.raises(MoeBuildError) as err:
        load_moe_layer(folder, **kw)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    return err.value


@pytest.mark.parametrize("edit, problem", [
    (lambda t: t.pop(_EXPERT), "missing"),
    (lambda t: t.__setitem__(_EXPERT, t[_EXPERT][:, :-1].contiguous()), "shape"),
    (lambda t: t.__setitem__(_EXPERT, t[_EXPERT].to(torch.int32)), "dtype"),
    (lambda t: t.__setitem__(_EXPERT, t[_EXPERT].to(torch.float8_e4m3fn)), "dtype"),
], ids=["missing", "shape", "int-dtype", "fp8-dtype"])
def test_bad_tensor_is_named(tmp_path: Path, edit: Callable[[dict[str, torch.Tensor]], None], problem: str) -> None:
    folder = _saved(tmp_path)
    _rewrite(folder, edit)
    err = _error(folder)
    assert err.field == _EXPERT and problem in err.problem


def test_missing_shard_names_a_tensor_in_it(tmp_path: Path) -> None:
    _model(_mixtral()).save_pretrained(tmp_path, max_shard_size="8KB")
    weight_map = json.loads((tmp_path / INDEX_FILE).read_text())["weight_map"]
    shard = weight_map[_EXPERT]
    (tmp_path / shard).unlink()
    err = _error(tmp_path)
    assert weight_map[err.field] == shard and shard in err.problem


def test_index_lists_tensor_absent_from_shard(tmp_path: Path) -> None:
    _model(_mixtral()).save_pretrained(tmp_path, max_shard_size="8KB")
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    other = next(s for s in set(index["weight_map"].values()) if s != index["weight_map"][_EXPERT])
    index["weight_map"][_EXPERT] = other
    (tmp_path / INDEX_FILE).write_text(json.dumps(index))
    assert _error(tmp_path).field == _EXPERT


def test_corrupt_shard_and_missing_files(tmp_path: Path) -> None:
    folder = _saved(tmp_path)
    (folder / SINGLE_FILE).write_bytes(b"\x00" * 64)
    assert _error(folder).field == SINGLE_FILE
    (folder / SINGLE_FILE).unlink()
    assert _error(folder).field == SINGLE_FILE
    (folder / INDEX_FILE).write_text("[]")
    assert _error(folder).field == INDEX_FILE


def test_dense_layer_is_refused(tmp_path: Path) -> None:
    config = transformers.DeepseekV3Config(num_attention_heads=2, num_key_value_heads=2, vocab_size=64,
                                           hidden_size=32, intermediate_size=40, moe_intermediate_size=16,
                                           n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                                           first_k_dense_replace=1, num_hidden_layers=2, kv_lora_rank=8,
                                           q_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=4)
    _model(config).save_pretrained(tmp_path)
    err = _error(tmp_path, layer=0)
    assert err.field == "layer" and "1" in str(err)
    assert load_moe_layer(tmp_path).layer == 1


def test_gpt_oss_mxfp4_matches_transformers_dequantization(tmp_path: Path) -> None:
    """Released GPT-OSS checkpoints hold MXFP4 experts; transformers' own dequantizer + MoE block is the oracle."""
    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    config = transformers.GptOssConfig(**_ATTN, hidden_size=32, intermediate_size=32, num_local_experts=4,
                                       num_experts_per_tok=2, head_dim=16, layer_types=["full_attention"])
    model = _model(config)
    model.save_pretrained(tmp_path)
    base = "model.layers.0.mlp.experts."
    packed = {f"{base}gate_up_proj": (64, 32), f"{base}down_proj": (32, 32)}  # nn.Linear (rows, cols)
    quantized = {}
    for name, (rows, cols) in packed.items():
        quantized[name + "_blocks"] = torch.randint(0, 256, (4, rows, cols // 32, 16), dtype=torch.uint8)
        quantized[name + "_scales"] = torch.randint(122, 131, (4, rows, cols // 32), dtype=torch.uint8)

    def pack(t: dict[str, torch.Tensor]) -> None:
        for name in packed:
            t.pop(name)
        t.update(quantized)

    _rewrite(tmp_path, pack)
    experts = model.model.layers[0].mlp.experts
    with torch.no_grad():
        for name in packed:
            param = getattr(experts, name.rsplit(".", 1)[1])
            param.copy_(mxfp4.convert_moe_packed_tensors(quantized[name + "_blocks"], quantized[name + "_scales"],
                                                          dtype=torch.float32))
    model.double()
    loaded = load_moe_layer(tmp_path)
    assert loaded.weights.w1.dtype == torch.float32 and base + "gate_up_proj_blocks" in loaded.tensors
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    with torch.no_grad():
        expected = model.model.layers[0].mlp(x)[0]
    got = moe_reference(loaded.spec, loaded.weights, x)
    assert ((got - expected).norm() / expected.norm()).item() < 1e-12
