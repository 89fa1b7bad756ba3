"""Weight-only quantized MoE checkpoints as users have them: read without dequantizing on load (issue 47, part 1).

Tiny Mixtral, Qwen3-MoE and DeepSeek-V3 models are built by transformers from a config and saved in bf16
(tests/test_fp8_checkpoints.py's FAMILIES, H = 192 so that 32- and 64-column groups are whole but 128-wide ones are
not), then every routed and shared expert matrix is rewritten in one format:
- ct_*: compressed-tensors itself (calculate_qparams, PackedQuantizationCompressor / NaiveQuantizationCompressor,
  ModelCompressor.update_config) with its presets W4A16 (symmetric int4 groups), W4A16_ASYM (zero points), W8A16
  (int8 per channel, pack-quantized) and W4AFP8 (int4 groups stored naive-quantized, FP8 per-token activations);
  the oracle is its own decompress;
- autoawq: AutoAWQ could not be installed beside this venv's torch / transformers, so its GEMM tensors are written
  by a re-implementation of WQLinear_GEMM.from_linear (casper-hansen/AutoAWQ awq/modules/linear/gemm.py:80-128:
  qweight [in, out/8] int32, nibble i of a word = column order_map[i], order_map [0, 2, 4, 6, 1, 3, 5, 7], qzeros
  the same over [in/group, out/8], scales fp16 [in/group, out]); the oracle re-implements its dequantize_gemm
  (awq/utils/packing_utils.py:82-97: unpack, AWQ_REVERSE_ORDER, (q - z) * s in fp16);
- modelopt_int4 / modelopt_w4a8: ModelOpt 0.47's export of transformers 5 fused experts fails on the CPU for AWQ
  (requantize_resmooth_fused_llm_layers calls len() on the fused experts module, layer_utils.py:119; without it,
  _export_fused_experts slices the block amax into a [1]-wide scale, quant_utils.py:814), so the int4 weights are
  packed by ModelOpt's own pack_int4_in_uint8 (quant_utils.py:805) with the tensor names and hf_quant_config.json
  it writes for these algorithms (quant_utils.py:710-724: W4A16_AWQ / W4A8_AWQ, group_size, pre_quant_scale true;
  `<m>.weight_scale`, `<m>.pre_quant_scale`, and for W4A8 `<m>.input_scale`, `<m>.weight_scale_2`); the oracle is
  an independent unpacking written here. ModelOpt's INT8 weight-only export does run: test_modelopt_w8a16_export.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from cli_process import run_moe_build
from safetensors.torch import load_file, save_file
from test_fp8_checkpoints import FAMILIES, Family, I, _edit_config, _rewrite, _saved, _tokens, t

from moe_build.errors import MoeBuildError
from moe_build.reference import moe_reference
from moe_build.spec import ActScale, Quant
from moe_build.spec.hf_config import spec_from_hf_config
from moe_build.spec.source import resolve_spec
from moe_build.weights.checkpoint import SINGLE_FILE, load_moe_layer
from moe_build.weights.woq import WoqKind

E = 8
H = 192


@dataclass
class Written:
    """What a writer stored: per weight name, the exact fp64 dense matrix of the format (computed here, never by
    moe-build), the producer's own dequantization where it has one, and the companions the loader must find."""

    quant: Quant
    group: int | None
    exact: dict[str, torch.Tensor] = field(default_factory=dict)
    theirs: dict[str, torch.Tensor] = field(default_factory=dict)
    pre: dict[str, torch.Tensor] = field(default_factory=dict)
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    act_scale: ActScale = ActScale.DYNAMIC


def _per_group(w: torch.Tensor, group: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """min and max of each row (group None) or each `group` columns: what an observer hands calculate_qparams."""
    if group is None:
        return w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    g = w.reshape(w.shape[0], -1, group)
    return g.amin(dim=2), g.amax(dim=2)


def _expand(t: torch.Tensor, cols: int) -> torch.Tensor:
    return t.repeat_interleave(cols // t.shape[1], dim=1)


# ---- compressed-tensors ------------------------------------------------------------------------------------------

def _ct(preset: str, group: int | None) -> Callable[[Family, dict[str, torch.Tensor], Path], Written]:
    def write(family: Family, tensors: dict[str, torch.Tensor], folder: Path) -> Written:
        from compressed_tensors.compressors import ModelCompressor, NaiveQuantizationCompressor
        from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
        from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme
        from compressed_tensors.quantization.utils import calculate_qparams
        scheme = preset_name_to_scheme(preset, ["Linear"])
        update = {"group_size": group} if group is not None else {"strategy": "channel", "group_size": None}
        scheme.weights = scheme.weights.model_copy(update=update)  # W8A16 per channel, as TensorRT-LLM runs it
        w4afp8 = preset == "W4AFP8"
        compressor = NaiveQuantizationCompressor if w4afp8 else PackedQuantizationCompressor
        quant = Quant.W4AFP8 if w4afp8 else Quant.W8A16 if preset == "W8A16" else Quant.W4A16_AWQ
        out = Written(quant, group)
        for name in family.matrices():
            w = tensors.pop(name)
            scale, zp = calculate_qparams(*_per_group(w, group), scheme.weights)
            state = {"weight": w, "weight_scale": scale}
            if not scheme.weights.symmetric:
                state["weight_zero_point"] = zp
            stored = {k: v.contiguous() for k, v in compressor.compress(state, scheme).items()}
            base = name.removesuffix(".weight")
            tensors.update({f"{base}.{k}": v for k, v in stored.items()})
            out.theirs[name] = compressor.decompress(stored, scheme)["weight"]
            # the format's meaning from the stored tensors: (q - zp) * s with q, zp recovered by compressed-tensors'
            # unpack (the ModelCompressor writes these bytes), in fp64
            from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
            bits = scheme.weights.num_bits
            q = stored["weight"] if w4afp8 else unpack_from_int32(stored["weight_packed"], bits, w.shape)
            z = torch.zeros_like(stored["weight_scale"], dtype=torch.float64) if scheme.weights.symmetric else \
                unpack_from_int32(stored["weight_zero_point"], bits, stored["weight_scale"].shape, packed_dim=0)
            s = stored["weight_scale"].double()
            out.exact[name] = (q.double() - _expand(z.double(), w.shape[1])) * _expand(s, w.shape[1])
        fmt = "naive-quantized" if w4afp8 else "pack-quantized"
        config = QuantizationConfig(config_groups={"group_0": scheme}, format=fmt, quantization_status="compressed",
                                    ignore=["lm_head", "re:.*mlp.gate$"])
        ModelCompressor(quantization_config=config).update_config(str(folder))
        return out
    return write


# ---- AutoAWQ GEMM, re-implemented from its source -------------------------------------------------------------------

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]          # awq/modules/linear/gemm.py:108
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]  # awq/utils/packing_utils.py:5


def _awq_pack(cols: torch.Tensor) -> torch.Tensor:
    """int [rows, n] (0..15) -> int32 [rows, n/8]: gemm.py:106-113, word col holds column col*8 + order_map[i] in
    bits 4i."""
    packed = torch.zeros(cols.shape[0], cols.shape[1] // 8, dtype=torch.int32)
    for col in range(cols.shape[1] // 8):
        for i in range(8):
            packed[:, col] |= cols[:, col * 8 + AWQ_ORDER[i]].to(torch.int32) << (i * 4)
    return packed


def _awq_dequantize(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group: int) -> torch.Tensor:
    """packing_utils.py:82-97, dequantize_gemm: [in, out] in the scales' dtype (fp16)."""
    shifts = torch.arange(0, 32, 4)
    iw = (qweight[:, :, None] >> shifts[None, None, :]).to(torch.int8).view(qweight.shape[0], -1)
    iz = (qzeros[:, :, None] >> shifts[None, None, :]).to(torch.int8).view(qzeros.shape[0], -1)
    order = torch.arange(iz.shape[-1]).view(-1, 8)[:, AWQ_REVERSE_ORDER].view(-1)
    iw, iz = iw[:, order] & 15, iz[:, order] & 15
    return (iw - iz.repeat_interleave(group, dim=0)) * scales.repeat_interleave(group, dim=0)


def _autoawq(group: int) -> Callable[[Family, dict[str, torch.Tensor], Path], Written]:
    def write(family: Family, tensors: dict[str, torch.Tensor], folder: Path) -> Written:
        out = Written(Quant.W4A16_AWQ, group)
        for name in family.matrices():
            w = tensors.pop(name).float()
            mn, mx = _per_group(w, group)
            # AutoAWQ's pseudo_quantize_tensor with zero_point: scales = (max - min) / 15, zeros = -round(min / s)
            scales = ((mx - mn).clamp(min=1e-5) / 15).half()
            zeros = (-torch.round(mn / scales.float())).clamp(0, 15).to(torch.int32)
            # from_linear (gemm.py:92-96): q = round((w + zeros * scales) / scales), per input column
            q = torch.round((w + _expand(zeros * scales.float(), w.shape[1])) / _expand(scales.float(), w.shape[1]))
            q = q.clamp(0, 15).to(torch.int32)
            base = name.removesuffix(".weight")
            qweight, qzeros = _awq_pack(q.T.contiguous()), _awq_pack(zeros.T.contiguous())
            tensors.update({f"{base}.qweight": qweight, f"{base}.qzeros": qzeros,
                            f"{base}.scales": scales.T.contiguous()})
            out.theirs[name] = _awq_dequantize(qweight, qzeros, scales.T.contiguous(), group).T
            out.exact[name] = (q.double() - _expand(zeros.double(), w.shape[1])) * \
                _expand(scales.double(), w.shape[1])
        _edit_config(folder, quantization_config={"quant_method": "awq", "bits": 4, "group_size": group,
                                                  "zero_point": True, "version": "gemm"})
        return out
    return write


# ---- ModelOpt int4 AWQ, packed by ModelOpt's own function -----------------------------------------------------------

def _modelopt(algo: str, group: int) -> Callable[[Family, dict[str, torch.Tensor], Path], Written]:
    def write(family: Family, tensors: dict[str, torch.Tensor], folder: Path) -> Written:
        from modelopt.torch.export.quant_utils import pack_int4_in_uint8
        w4a8 = algo == "W4A8_AWQ"
        out = Written(Quant.W4AFP8 if w4a8 else Quant.W4A16_AWQ, group,
                      act_scale=ActScale.STATIC if w4a8 else ActScale.DYNAMIC)
        g = torch.Generator().manual_seed(5)
        pre1 = (torch.rand(H, generator=g) + 0.5).to(torch.bfloat16)  # one per GEMM input (ModelOpt shares them)
        pre2 = (torch.rand(I, generator=g) + 0.5).to(torch.bfloat16)
        for k, name in enumerate(family.matrices()):
            w = tensors.pop(name).float()
            scale = (w.reshape(w.shape[0], -1, group).abs().amax(dim=2) / 7).clamp_min(1e-8)  # amax / maxbound
            packed = pack_int4_in_uint8(w, scale, group)
            base = name.removesuffix(".weight")
            is_down = name.endswith(f".{family.proj[2]}.weight")
            pre = pre2 if is_down else pre1
            tensors.update({f"{base}.weight": packed, f"{base}.weight_scale": scale,
                            f"{base}.pre_quant_scale": pre.clone()})
            out.pre[name] = pre
            if w4a8:
                tensors[f"{base}.input_scale"] = out.inputs[name] = torch.tensor(0.01 + 0.001 * k)
                tensors[f"{base}.weight_scale_2"] = torch.tensor(0.05)
            # independent unpacking: byte (r, c) holds rows 2r (low nibble) and 2r + 1, two's complement
            lo, hi = (packed & 15).to(torch.int16), (packed >> 4).to(torch.int16)
            signed = torch.stack([lo, hi], dim=1).reshape(w.shape)
            signed = torch.where(signed >= 8, signed - 16, signed)
            out.exact[name] = signed.double() * _expand(scale.double(), w.shape[1])
        quantization = {"quant_algo": algo, "group_size": group, "has_zero_point": False, "pre_quant_scale": True,
                        "kv_cache_quant_algo": None, "exclude_modules": ["lm_head", "*.mlp.gate"]}
        (folder / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt", "version": "0.47.0"},
                                                                 "quantization": quantization}))
        _edit_config(folder, quantization_config={**quantization, "quant_method": "modelopt"})
        return out
    return write


FORMATS: dict[str, Callable[[Family, dict[str, torch.Tensor], Path], Written]] = {
    "ct_w4a16_g32": _ct("W4A16", 32), "ct_w4a16_asym_g64": _ct("W4A16_ASYM", 64), "ct_w8a16": _ct("W8A16", None),
    "ct_w4afp8_g64": _ct("W4AFP8", 64), "autoawq_g64": _autoawq(64), "autoawq_g32": _autoawq(32),
    "modelopt_int4_g64": _modelopt("W4A16_AWQ", 64), "modelopt_w4a8_g32": _modelopt("W4A8_AWQ", 32),
}
_NEEDS = {"ct": "compressed_tensors", "modelopt": "modelopt.torch.export.quant_utils"}


def _checkpoint(family: Family, fmt: str, folder: Path) -> tuple[torch.nn.Module, Written]:
    pytest.importorskip(_NEEDS.get(fmt.split("_")[0], "torch"))
    model = _saved(family, folder)
    return model, _rewrite(folder, lambda tensors: FORMATS[fmt](family, tensors, folder))


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("name", list(FAMILIES))
def test_woq_checkpoint_loads_as_written(tmp_path: Path, name: str, fmt: str) -> None:
    """Spec inferred from the format; the experts stay packed; dequantized() equals the format's exact meaning and
    the producer's own dequantization; pre-quant scales and static input scales as stored; shared experts
    dequantized to bf16."""
    family = FAMILIES[name]
    _, written = _checkpoint(family, fmt, tmp_path)
    spec = spec_from_hf_config(tmp_path)
    assert (spec.quant, spec.act_scale) == (written.quant, written.act_scale)
    if written.group is not None:
        assert spec.quant_group_size == written.group
    loaded = load_moe_layer(tmp_path)
    w = loaded.weights
    assert w.woq is not None and w.w1 is w.woq.w1 and w.woq.group_size == written.group
    assert w.woq.kind is (WoqKind.INT8 if spec.quant is Quant.W8A16 else WoqKind.INT4)
    assert w.w1.dtype == (torch.int8 if spec.quant is Quant.W8A16 else torch.uint8)
    deq = w.dequantized(torch.float64)
    for e in range(E):
        gate, up, down = family.expert_weights(e)
        assert torch.equal(deq.w1[e], torch.cat([written.exact[gate], written.exact[up]]))
        assert torch.equal(deq.w2[e], written.exact[down])
        if written.theirs:  # the producer's own dequantization, in its dtype
            theirs = written.theirs[gate].dtype
            assert torch.equal(deq.w1[e].to(theirs), torch.cat([written.theirs[gate], written.theirs[up]]))
            assert torch.equal(deq.w2[e].to(theirs), written.theirs[down])
    if written.pre:
        assert torch.equal(w.woq.fc1_act_scale, written.pre[family.expert_weights(0)[0]].float())
        assert torch.equal(w.woq.fc2_act_scale, written.pre[family.expert_weights(0)[2]].float())
    else:
        assert w.woq.fc1_act_scale is None
    if written.inputs:
        ins = {n: float(v) for n, v in written.inputs.items() if ".experts." in n}
        down = f".{family.proj[2]}.weight"
        assert float(w.woq.a1_scale) == max(v for n, v in ins.items() if not n.endswith(down))
        assert float(w.woq.a2_scale) == max(v for n, v in ins.items() if n.endswith(down))
    else:
        assert w.woq.a1_scale is None
    if family.shared:
        shared = [n for n in family.matrices() if ".shared_experts." in n]
        exact = [written.exact[n] * (written.pre[n].double() if written.pre else 1) for n in shared]
        assert torch.equal(w.shared_w1, torch.cat(exact[:2]).to(torch.bfloat16))
        assert torch.equal(w.shared_w2, exact[2].to(torch.bfloat16))


def test_group_128_on_multiples_of_128(tmp_path: Path) -> None:
    """AutoAWQ's default group of 128 where H = 256 and I = 128 (W2 holds one group per row)."""
    family = dataclasses.replace(FAMILIES["qwen3_moe"], config=lambda: t.Qwen3MoeConfig(
        num_attention_heads=2, num_key_value_heads=2, vocab_size=64, hidden_size=256, intermediate_size=256,
        moe_intermediate_size=128, num_experts=E, num_experts_per_tok=2, head_dim=16, num_hidden_layers=1))
    _saved(family, tmp_path)
    written = _rewrite(tmp_path, lambda tensors: _autoawq(128)(family, tensors, tmp_path))
    w = load_moe_layer(tmp_path).weights
    assert w.woq.group_size == 128 and tuple(w.woq.w2_scale.shape) == (E, 256, 1)
    deq = w.dequantized(torch.float64)
    gate, up, down = family.expert_weights(3)
    assert torch.equal(deq.w1[3], torch.cat([written.exact[gate], written.exact[up]]))
    assert torch.equal(deq.w2[3], written.exact[down])


def test_group_128_off_multiples_of_128_is_refused(tmp_path: Path) -> None:
    """H = 192 cannot hold whole 128-column groups: the config's group size meets scales of another width."""
    family = FAMILIES["qwen3_moe"]
    _checkpoint(family, "autoawq_g64", tmp_path)
    _edit_config(tmp_path, quantization_config={"quant_method": "awq", "bits": 4, "group_size": 128,
                                                "zero_point": True, "version": "gemm"})
    with pytest.raises(MoeBuildError) as err:
        load_moe_layer(tmp_path)
    assert err.value.field == f"{family.experts()}.0.gate_proj.scales" and "group size 64" in str(err.value)
    assert "\n" not in str(err.value)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("fmt", ["modelopt_int4_g64", "ct_w4a16_asym_g64", "ct_w8a16"])
def test_reference_applies_the_prequant_scales(tmp_path: Path, fmt: str) -> None:
    """moe_reference of the loaded layer equals the plain reference of its dequantized weights with the pre-quant
    scales folded into the columns they multiply ((x * p) @ W^T = x @ (W * p)^T), to fp64 round-off; without the
    scales the two differ (where the checkpoint has them)."""
    family = FAMILIES["mixtral"]
    _checkpoint(family, fmt, tmp_path)
    loaded = load_moe_layer(tmp_path)
    q, deq = loaded.weights.woq, loaded.weights.dequantized(torch.float64)
    folded = deq
    if q.fc1_act_scale is not None:
        folded = dataclasses.replace(deq, w1=deq.w1 * q.fc1_act_scale.double(), w2=deq.w2 * q.fc2_act_scale.double())
    plain = dataclasses.replace(loaded.spec, quant=Quant.NONE)
    x = _tokens()
    ours = moe_reference(loaded.spec, loaded.weights, x)
    assert _rel(ours, moe_reference(plain, folded, x)) < 1e-12
    if q.fc1_act_scale is not None:
        assert _rel(ours, moe_reference(plain, deq, x)) > 0.05


def test_w4afp8_reference_quantizes_activations(tmp_path: Path) -> None:
    """W4A8-AWQ: the FP8 activation quantization moves the output by FP8 round-off (not zero, well under 10 %)
    from the same layer with 16-bit activations."""
    family = FAMILIES["qwen3_moe"]
    _checkpoint(family, "modelopt_w4a8_g32", tmp_path)
    loaded = load_moe_layer(tmp_path)
    x = _tokens()
    fp8 = moe_reference(loaded.spec, loaded.weights, x)
    q = loaded.weights.woq
    awq = dataclasses.replace(loaded.weights.woq, a1_scale=None, a2_scale=None)
    w16 = dataclasses.replace(loaded.weights, woq=awq, w1=awq.w1, w2=awq.w2)
    plain = moe_reference(dataclasses.replace(loaded.spec, quant=Quant.W4A16_AWQ, act_scale=ActScale.DYNAMIC), w16, x)
    assert q.a1_scale is not None and 1e-3 < _rel(fp8, plain) < 0.1


def test_reference_matches_transformers_on_ct_w4a16(tmp_path: Path) -> None:
    """transformers' own bf16 block holding compressed-tensors' decompressed weights agrees with moe_reference
    within bf16 round-off."""
    family = FAMILIES["deepseek_v3"]
    model, written = _checkpoint(family, "ct_w4a16_g32", tmp_path)
    loaded = load_moe_layer(tmp_path)
    block = model.model.layers[family.layer].mlp
    with torch.no_grad():
        for e in range(E):
            gate, up, down = family.expert_weights(e)
            block.experts.gate_up_proj[e].copy_(torch.cat([written.theirs[gate], written.theirs[up]]))
            block.experts.down_proj[e].copy_(written.theirs[down])
        for p in family.proj:
            n = f"model.layers.{family.layer}.mlp.shared_experts.{p}.weight"
            getattr(block.shared_experts, p).weight.copy_(written.theirs[n])
        x = _tokens()
        hf = block(x[None])
    hf = (hf[0] if isinstance(hf, tuple) else hf)[0]
    assert _rel(moe_reference(loaded.spec, loaded.weights, x), hf) < 0.02


# ---- ModelOpt itself: INT8 weight-only ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
def test_modelopt_w8a16_export(tmp_path: Path, name: str) -> None:
    """ModelOpt quantizes the tiny model on the CPU (INT8_WEIGHT_ONLY_CFG) and exports it: the experts load as its
    int8 tensors bit for bit, dequantized as weight * weight_scale[:, None] (its from_quantized_weight)."""
    mtq = pytest.importorskip("modelopt.torch.quantization", reason="nvidia-modelopt is not installed")
    from modelopt.torch.export import export_hf_checkpoint
    from modelopt.torch.export.quant_utils import from_quantized_weight
    family = FAMILIES[name]
    torch.manual_seed(0)
    model = t.AutoModelForCausalLM.from_config(family.config(), experts_implementation="eager")
    model.config.architectures = [type(model).__name__]
    model = model.to(torch.bfloat16)
    mtq.quantize(model, mtq.INT8_WEIGHT_ONLY_CFG, lambda m: m(torch.randint(0, 64, (4, 16))))
    export_hf_checkpoint(model, export_dir=tmp_path)
    spec = spec_from_hf_config(tmp_path)
    assert spec.quant is Quant.W8A16
    stored = load_file(tmp_path / SINGLE_FILE)
    w = load_moe_layer(tmp_path).weights
    deq = w.dequantized(torch.float64)
    for e in range(E):
        gate, up, down = family.expert_weights(e)
        assert torch.equal(w.w1[e], torch.cat([stored[gate], stored[up]]))
        for n, got in ((gate, deq.w1[e, :I]), (up, deq.w1[e, I:]), (down, deq.w2[e])):
            scale = stored[n.replace(".weight", ".weight_scale")]
            assert torch.equal(got, stored[n].double() * scale.double()[:, None])
            assert torch.equal(got.float(), from_quantized_weight(stored[n], scale, "int8_wo", torch.float32))


# ---- GPT-OSS: MXFP4 kept -------------------------------------------------------------------------------------------

def _gpt_oss(folder: Path, quantized: bool = True) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """A tiny GPT-OSS saved as released: MXFP4 experts (`_blocks`, `_scales`) and quantization_config mxfp4."""
    config = t.GptOssConfig(num_attention_heads=2, num_key_value_heads=2, vocab_size=64, hidden_size=64,
                            intermediate_size=96, num_local_experts=4, num_experts_per_tok=2, head_dim=16,
                            num_hidden_layers=1, layer_types=["full_attention"])
    torch.manual_seed(0)
    model = t.AutoModelForCausalLM.from_config(config, experts_implementation="eager")
    model.save_pretrained(folder)
    base = "model.layers.0.mlp.experts."
    g = torch.Generator().manual_seed(3)
    packed = {}
    for name, (rows, cols) in {"gate_up_proj": (192, 64), "down_proj": (64, 96)}.items():
        packed[base + name + "_blocks"] = torch.randint(0, 256, (4, rows, cols // 32, 16), generator=g,
                                                        dtype=torch.uint8)
        packed[base + name + "_scales"] = torch.randint(120, 132, (4, rows, cols // 32), generator=g,
                                                        dtype=torch.uint8)

    def pack(tensors: dict[str, torch.Tensor]) -> None:
        for name in ("gate_up_proj", "down_proj"):
            tensors.pop(base + name)
        tensors.update(packed)
    _rewrite(folder, pack)
    if quantized:
        _edit_config(folder, quantization_config={"quant_method": "mxfp4",
                                                  "modules_to_not_convert": ["model.layers.*.self_attn"]})
    return model, packed


def test_gpt_oss_mxfp4_stays_mxfp4(tmp_path: Path) -> None:
    """quant=wfp4a16, group 32; W1's bytes and exponents are the stored ones with gate rows then up rows (GPT-OSS
    interleaves them); dequantized() equals transformers' convert_moe_packed_tensors (de-interleaved, x @ W ->
    nn.Linear); moe_reference equals transformers' block holding those weights, in fp64."""
    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    model, packed = _gpt_oss(tmp_path)
    base = "model.layers.0.mlp.experts."
    loaded = load_moe_layer(tmp_path)
    assert (loaded.spec.quant, loaded.spec.quant_group_size) == (Quant.WFP4A16, 32)
    q = loaded.weights.woq
    assert q.kind is WoqKind.MXFP4 and loaded.weights.w1.dtype == torch.uint8
    blocks = packed[base + "gate_up_proj_blocks"].reshape(4, 192, 32)
    assert torch.equal(q.w1, torch.cat([blocks[:, 0::2], blocks[:, 1::2]], dim=1))
    scales = packed[base + "gate_up_proj_scales"]
    assert torch.equal(q.w1_scale, torch.cat([scales[:, 0::2], scales[:, 1::2]], dim=1))
    deq = loaded.weights.dequantized(torch.float64)
    theirs = {n: mxfp4.convert_moe_packed_tensors(packed[base + n + "_blocks"], packed[base + n + "_scales"],
                                                  dtype=torch.float32) for n in ("gate_up_proj", "down_proj")}
    gate_up = theirs["gate_up_proj"].transpose(1, 2)  # [E, 2I, H], gate/up interleaved
    assert torch.equal(deq.w1.float(), torch.cat([gate_up[:, 0::2], gate_up[:, 1::2]], dim=1))
    assert torch.equal(deq.w2.float(), theirs["down_proj"].transpose(1, 2))
    experts = model.model.layers[0].mlp.experts
    with torch.no_grad():
        experts.gate_up_proj.copy_(theirs["gate_up_proj"])
        experts.down_proj.copy_(theirs["down_proj"])
    model.double()
    x = torch.randn(2, 6, 64, dtype=torch.float64)
    with torch.no_grad():
        expected = model.model.layers[0].mlp(x)[0]
    assert _rel(moe_reference(loaded.spec, loaded.weights, x), expected) < 1e-12


def test_gpt_oss_quant_none_dequantizes(tmp_path: Path) -> None:
    """--quant none on a released GPT-OSS: the experts load dense in the model's dtype, the same numbers (the
    MXFP4 dequantization itself is checked against transformers' above)."""
    _gpt_oss(tmp_path)
    kept = load_moe_layer(tmp_path).weights
    assert resolve_spec(tmp_path).quant is Quant.WFP4A16
    spec = resolve_spec(tmp_path, quant="none")
    dense = kept.for_spec(spec)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[spec.dtype.value]
    assert dense.woq is None and dense.w1.dtype == dtype
    assert torch.equal(dense.w1, kept.dequantized(torch.float64).w1.to(dtype))
    assert torch.equal(dense.w2, kept.dequantized(torch.float64).w2.to(dtype))


@pytest.mark.parametrize("fmt", ["autoawq_g64", "modelopt_int4_g64", "ct_w8a16", "ct_w4afp8_g64"])
def test_quant_none_dequantizes_the_stored_experts(tmp_path: Path, fmt: str) -> None:
    """--quant none over a weight-only checkpoint (for an OOTB engine, which cannot run one quantized): each expert
    matrix the format's exact dense one times its AWQ pre-quant scale where one is stored, rounded once to bf16."""
    family = FAMILIES["qwen3_moe"]
    _, written = _checkpoint(family, fmt, tmp_path)
    w = load_moe_layer(tmp_path).weights.for_spec(resolve_spec(tmp_path, quant="none"))
    assert w.woq is None and w.fp8 is None

    def exact(name: str) -> torch.Tensor:
        pre = written.pre.get(name)
        return written.exact[name] * (1 if pre is None else pre.double())
    for e in range(E):
        gate, up, down = family.expert_weights(e)
        assert torch.equal(w.w1[e], torch.cat([exact(gate), exact(up)]).to(torch.bfloat16))
        assert torch.equal(w.w2[e], exact(down).to(torch.bfloat16))
    if fmt == "modelopt_int4_g64":  # the scales were folded in: the test would not tell them apart otherwise
        assert written.pre and not torch.equal(w.w2[0], written.exact[family.expert_weights(0)[2]].to(torch.bfloat16))


@pytest.mark.parametrize("fmt", ["modelopt_int4_g64", "modelopt_w4a8_g32"])
def test_quant_none_builds_an_ootb_engine_of_a_weight_only_checkpoint(tmp_path: Path, fmt: str) -> None:
    """What the OOTB refusal of a weight-only (or W4AFP8) checkpoint suggests, run as a user runs it: `--quant none`
    builds."""
    pytest.importorskip("tensorrt_rtx_bindings")
    _checkpoint(FAMILIES["qwen3_moe"], fmt, tmp_path / "ckpt")
    refused = run_moe_build("build", str(tmp_path / "ckpt"), cwd=tmp_path)
    assert refused.returncode == 2 and "--quant none builds it with the experts dequantized" in refused.stderr
    r = run_moe_build("build", str(tmp_path / "ckpt"), "--quant", "none", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    manifest = json.loads(next((tmp_path / "engines").glob("*.json")).read_text())
    assert manifest["quant"]["mode"] == "none" and manifest["spec"]["quant"] == "none"


# ---- refusals ---------------------------------------------------------------------------------------------------

_QWEN3 = {"model_type": "qwen3_moe", "hidden_size": H, "intermediate_size": 256, "moe_intermediate_size": 128,
          "num_experts": 2, "num_experts_per_tok": 1, "num_hidden_layers": 1, "torch_dtype": "bfloat16"}
_AWQ = {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True, "version": "gemm"}
_CT_GROUP = {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 64,
                                                "symmetric": True, "dynamic": False}}


def _ct_config(**weights: Any) -> dict[str, Any]:
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {**_CT_GROUP, "weights": {**_CT_GROUP["weights"], **weights}}}}


BAD_CONFIGS: dict[str, tuple[dict[str, Any], str]] = {
    "awq-gemv": ({**_AWQ, "version": "gemv"}, "quantization_config.version"),
    "awq-8bit": ({**_AWQ, "bits": 8}, "quantization_config.bits"),
    "awq-group-256": ({**_AWQ, "group_size": 256}, "quantization_config.group_size"),
    "ct-3bit": (_ct_config(num_bits=3), "quantization_config.config_groups.group_0.weights.num_bits"),
    "ct-group-48": (_ct_config(group_size=48), "quantization_config.config_groups.group_0.weights.group_size"),
    "ct-int8-asym": (_ct_config(num_bits=8, strategy="channel", symmetric=False),
                     "quantization_config.config_groups.group_0.weights.symmetric"),
    "ct-marlin": ({**_ct_config(), "format": "marlin-24"}, "quantization_config.format"),
    "modelopt-zero-point": ({"quant_method": "modelopt", "quant_algo": "W4A16_AWQ", "group_size": 128,
                             "has_zero_point": True}, "quantization_config.has_zero_point"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_unsupported_woq_description_names_the_field(case: str) -> None:
    config, key = BAD_CONFIGS[case]
    with pytest.raises(MoeBuildError) as err:
        spec_from_hf_config({**_QWEN3, "quantization_config": config})
    assert err.value.field == key and "\n" not in str(err.value) and err.value.allowed


_E = "model.layers.0.mlp.experts"


def _tiny_awq(folder: Path) -> None:
    """A two-expert Qwen3-MoE layer in AutoAWQ's GEMM format, written directly."""
    folder.mkdir()
    g = torch.Generator().manual_seed(0)
    tensors = {"model.layers.0.mlp.gate.weight": torch.randn(2, H, generator=g).to(torch.bfloat16)}
    for e in range(2):
        for proj, (out, cols) in (("gate_proj", (128, H)), ("up_proj", (128, H)), ("down_proj", (H, 128))):
            base = f"{_E}.{e}.{proj}"
            tensors[f"{base}.qweight"] = torch.randint(-2 ** 31, 2 ** 31 - 1, (cols, out // 8), generator=g,
                                                       dtype=torch.int32)
            tensors[f"{base}.qzeros"] = torch.randint(-2 ** 31, 2 ** 31 - 1, (cols // 64, out // 8), generator=g,
                                                      dtype=torch.int32)
            tensors[f"{base}.scales"] = torch.rand(cols // 64, out, generator=g).half()
    save_file(tensors, folder / SINGLE_FILE)
    (folder / "config.json").write_text(json.dumps({**_QWEN3, "num_experts": 2, "quantization_config": _AWQ}))


BAD_TENSORS: dict[str, tuple[Callable[[dict[str, torch.Tensor]], None], str, str]] = {
    "scales-group-32": (lambda d: d.update({f"{_E}.1.up_proj.scales": torch.ones(6, 128).half()}),
                        f"{_E}.1.up_proj.scales", "group size 32"),
    "qweight-int64": (lambda d: d.update({f"{_E}.0.down_proj.qweight": d[f"{_E}.0.down_proj.qweight"].long()}),
                      f"{_E}.0.down_proj.qweight", "I64"),
    "missing-qzeros": (lambda d: d.pop(f"{_E}.1.gate_proj.qzeros"), f"{_E}.1.gate_proj.qzeros", "missing"),
    "nan-scale": (lambda d: d[f"{_E}.0.gate_proj.scales"].view(-1)[3].fill_(float("nan")),
                  f"{_E}.0.gate_proj.scales", "finite"),
    "unknown-packing": (lambda d: d.update({f"{_E}.0.up_proj.weight": torch.zeros(128, H, dtype=torch.int16)}) or
                        [d.pop(f"{_E}.0.up_proj.{k}") for k in ("qweight", "qzeros", "scales")],
                        f"{_E}.0.up_proj.weight", "I16"),
    "differing-prequant": (lambda d: d.update({f"{_E}.{e}.{p}.pre_quant_scale": torch.full((H,), 1.0 + e)
                                               for e in range(2) for p in ("gate_proj", "up_proj")}),
                           f"{_E}.1.gate_proj.pre_quant_scale", "differs"),
}


@pytest.mark.parametrize("case", list(BAD_TENSORS))
def test_bad_woq_tensor_is_named(tmp_path: Path, case: str) -> None:
    edit, tensor, words = BAD_TENSORS[case]
    folder = tmp_path / "ckpt"
    _tiny_awq(folder)
    load_moe_layer(folder)  # as written, it loads
    _rewrite(folder, edit)
    with pytest.raises(MoeBuildError) as err:
        load_moe_layer(folder)
    assert err.value.field == tensor and words in str(err.value) and "\n" not in str(err.value)


def test_mxfp4_nan_exponent_is_named(tmp_path: Path) -> None:
    _gpt_oss(tmp_path)
    name = "model.layers.0.mlp.experts.down_proj_scales"
    _rewrite(tmp_path, lambda d: d[name].view(-1)[7].fill_(255))
    with pytest.raises(MoeBuildError) as err:
        load_moe_layer(tmp_path)
    assert err.value.field == name and "NaN" in str(err.value)


def test_woq_weights_refuse_bad_tensors() -> None:
    """WoqWeights' constructor names the first tensor that breaks the contract."""
    from moe_build.weights.woq import WoqWeights
    w1, w2 = torch.zeros(2, 8, 32, dtype=torch.uint8), torch.zeros(2, 64, 16, dtype=torch.uint8)
    s1, s2 = torch.ones(2, 8, 2), torch.ones(2, 64, 1)
    WoqWeights(WoqKind.INT4, 32, w1, w2, s1, s2)
    cases = {"woq.w2": dict(w2=w2.to(torch.int8)), "woq.w1_scale": dict(w1_scale=torch.ones(2, 8, 3)),
             "woq.w1_zero": dict(w1_zero=torch.full((2, 8, 2), 16, dtype=torch.uint8)),
             "woq.group_size": dict(group_size=48), "woq.fc2_act_scale": dict(fc1_act_scale=torch.ones(64))}
    for field_name, change in cases.items():
        args = {**dict(kind=WoqKind.INT4, group_size=32, w1=w1, w2=w2, w1_scale=s1, w2_scale=s2), **change}
        with pytest.raises(MoeBuildError) as err:
            WoqWeights(**args)
        assert err.value.field == field_name and "\n" not in str(err.value), (field_name, str(err.value))


def test_int4_packing_under_w8a16_is_refused(tmp_path: Path) -> None:
    """--quant w8a16 over AutoAWQ's int4 experts: the packing is named, not misread as int8."""
    import contextlib

    from moe_build.weights import checkpoint
    folder = tmp_path / "ckpt"
    _tiny_awq(folder)
    with pytest.raises(MoeBuildError) as err, contextlib.ExitStack() as stack:
        checkpoint._load(checkpoint._Checkpoint(folder, stack), resolve_spec(folder, quant="w8a16"), 0)
    assert err.value.field == f"{_E}.0.gate_proj.qweight" and "AutoAWQ" in str(err.value)
    assert "\n" not in str(err.value)


def test_an_expert_parallel_rank_holds_its_experts_packed_and_scaled() -> None:
    """MoEWeights.for_rank cuts the packed data, scales, zeros and per-expert second scales to the rank's experts,
    keeps the layer's AWQ pre-quant scales, and the rank's dequantized experts are the whole layer's rows."""
    from moe_build.spec import MoESpec, Quant
    from moe_build.weights import MoEWeights
    from moe_build.weights.woq import WoqWeights
    g = torch.Generator().manual_seed(3)
    spec = MoESpec(64, 32, 4, 2, quant=Quant.W4A16_AWQ, quant_group_size=32, ep_size=2, quant_zero_points=True,
                   quant_prequant_scales=True)
    E, n1, H, I = 4, 64, 64, 32
    woq = WoqWeights(WoqKind.INT4, 32, torch.randint(0, 256, (E, n1, H // 2), generator=g, dtype=torch.uint8),
                     torch.randint(0, 256, (E, H, I // 2), generator=g, dtype=torch.uint8),
                     torch.rand(E, n1, H // 32, generator=g), torch.rand(E, H, I // 32, generator=g),
                     torch.randint(0, 16, (E, n1, H // 32), generator=g, dtype=torch.uint8),
                     torch.randint(0, 16, (E, H, I // 32), generator=g, dtype=torch.uint8),
                     fc1_act_scale=torch.rand(H, generator=g) + 0.5, fc2_act_scale=torch.rand(I, generator=g) + 0.5)
    whole = MoEWeights(router_weight=torch.randn(E, H, generator=g), w1=woq.w1, w2=woq.w2, woq=woq)
    whole.check(spec)
    rank = whole.for_rank(spec, 1)
    rank.check(spec.for_rank(1))
    assert rank.w1 is rank.woq.w1 and torch.equal(rank.woq.w1_zero, woq.w1_zero[2:4])
    assert rank.woq.fc1_act_scale is woq.fc1_act_scale
    dense_whole, dense_rank = whole.dequantized(), rank.dequantized()
    assert torch.equal(dense_rank.w1, dense_whole.w1[2:4]) and torch.equal(dense_rank.w2, dense_whole.w2[2:4])
