"""FP8 MoE checkpoints as users have them: read with the experts kept in FP8 (issue 46).

Tiny Mixtral, Qwen3-MoE and DeepSeek-V3 models are built by transformers 5.x from a config and saved in bf16 (the
dtype of every released FP8 model's unquantized tensors), then their routed and shared expert matrices are
rewritten in one format, each tensor named as that format names it:
- block128, the DeepSeek-V3 release's format (also the Qwen3 -FP8 releases'): config.json's quantization_config
  {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]} as
  DeepSeek-V3's config.json holds it, `<m>.weight` F8_E4M3 and `<m>.weight_scale_inv` F32
  [ceil(out/128), ceil(in/128)], the multiplier of each 128 x 128 block;
- modelopt, NVIDIA ModelOpt's FP8 export: hf_quant_config.json {"producer": ..., "quantization": {"quant_algo":
  "FP8", ...}} and its copy as config.json's quantization_config (quant_method "modelopt"), `<m>.weight_scale`
  and `<m>.input_scale` F32 scalars;
- ct_*, compressed-tensors float-quantized, written by compressed-tensors itself: its presets FP8 (per-tensor
  weights, static per-tensor activations), FP8_DYNAMIC (per-channel, dynamic per token) and FP8_BLOCK (128 x 128
  blocks, dynamic per 1 x 128 group), its scales (calculate_qparams, in bf16 as llm-compressor's observers leave
  them), its FloatQuantizationCompressor and its ModelCompressor.update_config.
Static input scales are max-calibrated per expert as ModelOpt and llm-compressor do, each expert on other tokens
so that they differ and the loader's reduction to their maximum is exercised.

H = 192 makes the last 128-block of every matrix partial along H. Where nvidia-modelopt is installed, ModelOpt
itself (mtq.quantize on the CPU, export_hf_checkpoint) writes the checkpoints of test_modelopt_export.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from cli_process import run_moe_build
from safetensors.torch import load_file, save_file

from moe_build.errors import MoeBuildError, UnsupportedCombination
from moe_build.planner import make_plan
from moe_build.reference import moe_reference
from moe_build.spec import ActScale, MoESpec, Quant
from moe_build.spec.hf_config import spec_from_hf_config
from moe_build.spec.source import resolve_spec
from moe_build.target import Flavour, Target
from moe_build.weights import MoEWeights
from moe_build.weights.checkpoint import SINGLE_FILE, load_moe_layer
from moe_build.weights.fp8 import (FP8_MAX, ScaleGranularity, blocks, expand_weight_scale, gate_up_halves_scales,
                                 quantize_weight)

transformers = pytest.importorskip("transformers")
t = transformers

H, I, E = 192, 128, 8
_A = dict(num_attention_heads=2, num_key_value_heads=2, vocab_size=64, hidden_size=H)
_MLA = dict(kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16)
DEEPSEEK_V3_QUANT = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                     "weight_block_size": [128, 128]}
MODELOPT_QUANT = {"producer": {"name": "modelopt", "version": "0.47.0"},
                  "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]}}
# what ModelOpt's export writes into config.json beside hf_quant_config.json (convert_hf_quant_config_format)
MODELOPT_CONFIG_QUANT = {"config_groups": {"group_0": {"input_activations": {"dynamic": False, "num_bits": 8,
                                                                             "type": "float"},
                                                       "weights": {"dynamic": False, "num_bits": 8, "type": "float"},
                                                       "targets": ["Linear"]}},
                         "ignore": ["lm_head"], "quant_algo": "FP8", "producer": MODELOPT_QUANT["producer"],
                         "quant_method": "modelopt"}


@dataclass(frozen=True)
class Family:
    config: Callable[[], Any]
    layer: int                       # the MoE decoder layer
    proj: tuple[str, str, str]       # gate, up, down
    block: str = "mlp"               # the MoE block as the files name it
    shared: bool = False

    def experts(self) -> str:
        return f"model.layers.{self.layer}.{self.block}.experts"

    def expert_weights(self, e: int) -> tuple[str, str, str]:
        """Routed expert e's gate, up and down weights, as stored."""
        gate, up, down = (f"{self.experts()}.{e}.{p}.weight" for p in self.proj)
        return gate, up, down

    def matrices(self) -> list[str]:
        """Every routed and shared expert weight, as stored."""
        names = [name for e in range(E) for name in self.expert_weights(e)]
        if self.shared:
            names += [f"model.layers.{self.layer}.mlp.shared_experts.{p}.weight" for p in self.proj]
        return names


FAMILIES = {
    "mixtral": Family(lambda: t.MixtralConfig(**_A, intermediate_size=I, num_local_experts=E, num_experts_per_tok=2,
                                              num_hidden_layers=1), 0, ("w1", "w3", "w2"), block="block_sparse_moe"),
    "qwen3_moe": Family(lambda: t.Qwen3MoeConfig(**_A, intermediate_size=256, moe_intermediate_size=I, num_experts=E,
                                                 num_experts_per_tok=2, head_dim=16, num_hidden_layers=1,
                                                 norm_topk_prob=True), 0, ("gate_proj", "up_proj", "down_proj")),
    "deepseek_v3": Family(lambda: t.DeepseekV3Config(**_A, **_MLA, intermediate_size=256, moe_intermediate_size=I,
                                                     n_routed_experts=E, num_experts_per_tok=2, n_group=4,
                                                     topk_group=2, n_shared_experts=1, num_hidden_layers=2,
                                                     first_k_dense_replace=1),
                          1, ("gate_proj", "up_proj", "down_proj"), shared=True),
}


def _randomize(block: torch.nn.Module) -> None:
    """Unit-variance outputs through the block (transformers' init would leave the experts near zero) and a
    0.1-scale selection bias."""
    with torch.no_grad():
        for name, p in [*block.named_parameters(), *block.named_buffers()]:
            if name.endswith("e_score_correction_bias"):
                p.copy_(torch.randn_like(p) * 0.1)
            elif p.dim() > 1:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)


def _saved(family: Family, folder: Path) -> torch.nn.Module:
    """The family's random model, saved in bf16 to `folder`, returned in bf16."""
    torch.manual_seed(0)
    model = t.AutoModelForCausalLM.from_config(family.config(), experts_implementation="eager")
    _randomize(model.model.layers[family.layer].mlp)
    model = model.to(torch.bfloat16).eval()
    model.save_pretrained(folder)
    return model


def _tokens() -> torch.Tensor:
    return torch.randn(4 * E, H, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)


# ---- the formats -----------------------------------------------------------------------------------------------

@dataclass
class Written:
    """What a format writer put in the files, keyed by weight name (every FP8 weight, its scale in fp32, its
    calibrated input scale as stored), and what the loader should make of it."""

    quant: Quant
    act_scale: ActScale
    granularity: ScaleGranularity
    scale_suffix: str                # the scale of `m.weight` is `m<scale_suffix>`
    weights: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    scales: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    inputs: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    dequantize: Callable[[str], torch.Tensor] | None = None  # the producer's own dequantization, where it has one


def _calibrated(family: Family, tensors: dict[str, torch.Tensor], name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Max-calibrated inputs of the matrix `name`: expert e sees tokens e, e + E, ... (a shared expert sees all);
    a down projection sees act(gate x) * (up x) of those tokens."""
    x = _tokens().float()
    if ".experts." in name:
        x = x[int(name.split(".experts.")[1].split(".")[0])::E]
    base, role = name.rsplit(".", 2)[0], name.rsplit(".", 2)[1]
    if role == family.proj[2]:
        gate, up = (tensors[f"{base}.{p}.weight"].float() for p in family.proj[:2])
        x = F.silu(x @ gate.T) * (x @ up.T)
    return x.amin(), x.amax()


def _quantized(w: torch.Tensor, granularity: ScaleGranularity) -> tuple[torch.Tensor, torch.Tensor]:
    q, s = quantize_weight(w[None], granularity)
    return q[0], s[0]


def _write_block128(family: Family, tensors: dict[str, torch.Tensor], folder: Path) -> Written:
    """DeepSeek-V3's format: amax / 448 per 128 x 128 block, the multiplier stored as weight_scale_inv."""
    out = Written(Quant.FP8_BLOCK, ActScale.DYNAMIC, ScaleGranularity.BLOCK128, ".weight_scale_inv")
    for name in family.matrices():
        q, s = _quantized(tensors[name], ScaleGranularity.BLOCK128)
        tensors[name], tensors[name.replace(".weight", ".weight_scale_inv")] = q, s
        out.weights[name], out.scales[name] = q, s
    _edit_config(folder, quantization_config=DEEPSEEK_V3_QUANT)
    return out


def _write_modelopt(family: Family, tensors: dict[str, torch.Tensor], folder: Path) -> Written:
    """ModelOpt's FP8 export: amax / 448 per matrix, calibrated input scales, both fp32 scalars."""
    out = Written(Quant.FP8, ActScale.STATIC, ScaleGranularity.CHANNEL, ".weight_scale")  # gate, up scales differ
    inputs = {name: _calibrated(family, tensors, name)[1] / FP8_MAX for name in family.matrices()}
    for name in family.matrices():
        q, s = _quantized(tensors[name], ScaleGranularity.TENSOR)
        base = name.removesuffix(".weight")
        tensors[name], tensors[f"{base}.weight_scale"], tensors[f"{base}.input_scale"] = q, s, inputs[name]
        out.weights[name], out.scales[name], out.inputs[name] = q, s, inputs[name]
    (folder / "hf_quant_config.json").write_text(json.dumps(MODELOPT_QUANT))
    _edit_config(folder, quantization_config=MODELOPT_CONFIG_QUANT)
    return out


def _ct(preset: str) -> Callable[[Family, dict[str, torch.Tensor], Path], Written]:
    """A compressed-tensors writer of `preset`, quantizing with compressed-tensors' own code."""
    def write(family: Family, tensors: dict[str, torch.Tensor], folder: Path) -> Written:
        pytest.importorskip("compressed_tensors", reason="compressed-tensors is not installed")
        from compressed_tensors.compressors import FloatQuantizationCompressor, ModelCompressor
        from compressed_tensors.quantization import QuantizationConfig, QuantizationStrategy, preset_name_to_scheme
        from compressed_tensors.quantization.utils import calculate_qparams
        scheme = preset_name_to_scheme(preset, ["Linear"])
        strategy = QuantizationStrategy(scheme.weights.strategy).value
        granularity = {"tensor": ScaleGranularity.CHANNEL,  # gate and up scales differ: per row of W1
                       "channel": ScaleGranularity.CHANNEL,
                       "block": ScaleGranularity.BLOCK128}[strategy]
        static = not scheme.input_activations.dynamic
        out = Written(Quant.FP8_BLOCK if preset == "FP8_BLOCK" else Quant.FP8,
                      ActScale.STATIC if static else ActScale.DYNAMIC, granularity, ".weight_scale")
        seen = {name: _calibrated(family, tensors, name) for name in family.matrices()}
        for name in family.matrices():
            w = tensors[name]
            scale, _ = calculate_qparams(*_min_max(w, strategy), scheme.weights)
            stored = FloatQuantizationCompressor.compress({"weight": w, "weight_scale": scale}, scheme)
            base = name.removesuffix(".weight")
            stored = {k: v.contiguous() for k, v in stored.items()}  # as save_pretrained stores them
            tensors[name], tensors[f"{base}.weight_scale"] = stored["weight"], stored["weight_scale"]
            out.weights[name], out.scales[name] = stored["weight"], stored["weight_scale"].float()
            if static:
                scale, _ = calculate_qparams(*(v.to(torch.bfloat16) for v in seen[name]), scheme.input_activations)
                tensors[f"{base}.input_scale"] = out.inputs[name] = scale
        config = QuantizationConfig(config_groups={"group_0": scheme}, format="float-quantized",
                                    quantization_status="compressed", ignore=["lm_head", "re:.*mlp.gate$"])
        ModelCompressor(quantization_config=config).update_config(str(folder))

        def dequantize(name: str) -> torch.Tensor:
            return FloatQuantizationCompressor.decompress(
                {"weight": out.weights[name], "weight_scale": tensors[name.replace(".weight", ".weight_scale")]},
                scheme)["weight"]
        out.dequantize = dequantize
        return out
    return write


def _min_max(w: torch.Tensor, strategy: str) -> tuple[torch.Tensor, torch.Tensor]:
    """What an observer of `strategy` gives calculate_qparams: the whole tensor, each row, or each 128 x 128
    block (zero-padded, as compressed-tensors pads for block quantization)."""
    if strategy == "tensor":
        return w.amin(), w.amax()
    if strategy == "channel":
        return w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    rows, cols = -(-w.shape[0] // 128), -(-w.shape[1] // 128)
    padded = F.pad(w, (0, cols * 128 - w.shape[1], 0, rows * 128 - w.shape[0]))
    tiles = padded.view(rows, 128, cols, 128)
    return tiles.amin(dim=(1, 3)), tiles.amax(dim=(1, 3))


FORMATS: dict[str, Callable[[Family, dict[str, torch.Tensor], Path], Written]] = {
    "block128": _write_block128, "modelopt": _write_modelopt,
    "ct_fp8": _ct("FP8"), "ct_fp8_dynamic": _ct("FP8_DYNAMIC"), "ct_fp8_block": _ct("FP8_BLOCK"),
}


def _edit_config(folder: Path, **changes: Any) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _rewrite(folder: Path, edit: Callable[[dict[str, torch.Tensor]], Any]) -> Any:
    tensors = load_file(folder / SINGLE_FILE)
    result = edit(tensors)
    save_file(tensors, folder / SINGLE_FILE, metadata={"format": "pt"})
    return result


def _fp8_checkpoint(family: Family, fmt: str, folder: Path) -> tuple[torch.nn.Module, Written]:
    model = _saved(family, folder)
    return model, _rewrite(folder, lambda tensors: FORMATS[fmt](family, tensors, folder))


# ---- what the format means, computed here independently ---------------------------------------------------------

def _exact(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float(q) * scale in fp64 (exact), the scale one number ([] or [1]), one per row ([out] or [out, 1]) or one
    per 128 x 128 block ([ceil(out/128), ceil(in/128)])."""
    rows, cols = q.shape
    s = scale.double()
    if s.numel() == 1:
        s = s.reshape(())
    elif s.numel() == rows and (s.dim() == 1 or s.shape[1] == 1):
        s = s.reshape(rows, 1)
    else:
        s = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
    return q.double() * s


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


# ---- the checkpoints load as written -----------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("name", list(FAMILIES))
def test_fp8_checkpoint_loads_as_written(tmp_path: Path, name: str, fmt: str) -> None:
    """Spec inferred from the format; W1 / W2 bit-identical to the stored FP8 matrices (gate then up); the
    scales those of the files; dequantized() equal to w_fp8 * scale exactly and to the producer's own
    dequantization where it has one; static input scales reduced to their maximum; shared experts dequantized."""
    family = FAMILIES[name]
    _, written = _fp8_checkpoint(family, fmt, tmp_path)
    spec = spec_from_hf_config(tmp_path)
    assert (spec.quant, spec.act_scale) == (written.quant, written.act_scale)
    loaded = load_moe_layer(tmp_path)
    w, deq = loaded.weights, loaded.weights.dequantized(torch.float64)
    assert w.fp8 is not None and w.fp8.granularity is written.granularity
    assert w.w1.dtype == w.w2.dtype == torch.float8_e4m3fn
    assert w.router_weight.dtype == torch.bfloat16
    for e in range(E):
        gate, up, down = family.expert_weights(e)
        assert torch.equal(_bits(w.w1[e]), _bits(torch.cat([written.weights[gate], written.weights[up]])))
        assert torch.equal(_bits(w.w2[e]), _bits(written.weights[down]))
        assert torch.equal(deq.w1[e], torch.cat([_exact(written.weights[n], written.scales[n]) for n in (gate, up)]))
        assert torch.equal(deq.w2[e], _exact(written.weights[down], written.scales[down]))
        if written.dequantize is not None:  # compressed-tensors' decompression, in the scales' dtype
            theirs = torch.cat([written.dequantize(gate), written.dequantize(up)])
            assert torch.equal(deq.w1[e].to(theirs.dtype), theirs)
            assert torch.equal(deq.w2[e].to(theirs.dtype), written.dequantize(down))
    if written.inputs:
        ins = {n: float(v.float().max()) for n, v in written.inputs.items() if ".experts." in n}
        down = f".{family.proj[2]}.weight"
        assert float(w.fp8.a1_scale) == max(v for n, v in ins.items() if not n.endswith(down))
        assert float(w.fp8.a2_scale) == max(v for n, v in ins.items() if n.endswith(down))
        assert len(set(ins.values())) > 2  # the experts' scales differed
    if family.shared:
        shared = [n for n in family.matrices() if ".shared_experts." in n]
        exact = [_exact(written.weights[n], written.scales[n]).to(torch.bfloat16) for n in shared]
        assert torch.equal(w.shared_w1, torch.cat(exact[:2])) and torch.equal(w.shared_w2, exact[2])
    experts = [n for n in family.matrices() if ".experts." in n]
    assert {n.replace(".weight", written.scale_suffix) for n in experts} | set(experts) <= set(loaded.tensors)


def test_block128_matches_compressed_tensors_reader(tmp_path: Path) -> None:
    """compressed-tensors' FP8BlockDequantizer, its reader of DeepSeek-style checkpoints (weight_scale_inv, padded
    partial blocks), dequantizes in fp32 exactly what dequantized(float32) gives."""
    pytest.importorskip("compressed_tensors", reason="compressed-tensors is not installed")
    from compressed_tensors.entrypoints.convert import FP8BlockDequantizer
    family = FAMILIES["deepseek_v3"]
    _fp8_checkpoint(family, "block128", tmp_path)
    reader = FP8BlockDequantizer.from_pretrained(tmp_path, dtype=torch.float32)
    theirs = reader.process(load_file(tmp_path / SINGLE_FILE))
    deq = load_moe_layer(tmp_path).weights.dequantized(torch.float32)
    for e in range(E):
        gate, up, down = family.expert_weights(e)
        assert torch.equal(deq.w1[e], torch.cat([theirs[gate], theirs[up]]))
        assert torch.equal(deq.w2[e], theirs[down])


def _transformers_block(model: torch.nn.Module, family: Family, deq: MoEWeights) -> torch.nn.Module:
    """The family's own MoE block in bf16 with the dequantized weights."""
    block = model.model.layers[family.layer].mlp
    with torch.no_grad():
        block.experts.gate_up_proj.copy_(deq.w1)
        block.experts.down_proj.copy_(deq.w2)
        if family.shared:
            gate, up = deq.shared_w1.chunk(2)
            for proj, value in zip(("gate_proj", "up_proj", "down_proj"), (gate, up, deq.shared_w2)):
                getattr(block.shared_experts, proj).weight.copy_(value)
    return block


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# e4m3 keeps 3 mantissa bits: quantizing a GEMM input moves each element by up to 2^-4 of itself (about 2.5 %
# RMS; more for small elements under a static per-tensor scale, which fall among e4m3's subnormals), and an FP8
# layer quantizes both GEMM inputs. Measured here: 3.6-4.4 % of the output's norm with dynamic scales, 4.4-5.9 %
# with static ones. The bound leaves room above that; a wrong scale or layout moves the output by 100 % or more.
FP8_ACTIVATION_BOUND = 0.1
# transformers' block computes in bf16 (8 mantissa bits): without FP8 activations the two agree to 0.5-0.6 %
BF16_BOUND = 0.02


@pytest.mark.parametrize("fmt", ["block128", "modelopt", "ct_fp8_dynamic"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_reference_runs_the_loaded_fp8_layer(tmp_path: Path, name: str, fmt: str) -> None:
    """moe_reference takes the loaded FP8 weights; it agrees with transformers' bf16 block holding the dequantized
    weights within the FP8 activation bound, and within bf16 round-off once activations are not quantized."""
    family = FAMILIES[name]
    model, _ = _fp8_checkpoint(family, fmt, tmp_path)
    loaded = load_moe_layer(tmp_path)
    deq = loaded.weights.dequantized(torch.float64)
    x = _tokens()
    with torch.no_grad():
        hf = _transformers_block(model, family, deq)(x[None])
    hf = (hf[0] if isinstance(hf, tuple) else hf)[0]
    ours = moe_reference(loaded.spec, loaded.weights, x)
    plain = moe_reference(dataclasses.replace(loaded.spec, quant=Quant.NONE, act_scale=ActScale.DYNAMIC), deq, x)
    assert _rel(plain, hf) < BF16_BOUND
    assert 1e-3 < _rel(ours, hf) < FP8_ACTIVATION_BOUND  # above zero: the activations were quantized


def test_fused_state_dict_layout(tmp_path: Path) -> None:
    """transformers 5.x holds block-128 FP8 experts stacked (its FP8Experts: gate_up_proj [E, 2I, H] with
    gate_up_proj_scale_inv [E, 2I/128, ceil(H/128)], down_proj with down_proj_scale_inv); a state_dict saved as it
    is loads the same weights as the per-expert files."""
    from transformers.integrations.finegrained_fp8 import FP8Experts
    family = FAMILIES["qwen3_moe"]
    _fp8_checkpoint(family, "block128", tmp_path)
    per_expert = load_moe_layer(tmp_path).weights
    module = FP8Experts(family.config(), block_size=(128, 128)).state_dict()
    stacked = {"gate_up_proj": (per_expert.w1, per_expert.fp8.w1_scale),
               "down_proj": (per_expert.w2, per_expert.fp8.w2_scale)}
    assert {n: tuple(v.shape) for n, v in module.items()} == {
        **{n: tuple(w.shape) for n, (w, _) in stacked.items()},
        **{f"{n}_scale_inv": tuple(s.shape) for n, (_, s) in stacked.items()}}

    def fuse(tensors: dict[str, torch.Tensor]) -> None:
        for n in [n for n in tensors if ".experts." in n]:
            del tensors[n]
        for n, (w, s) in stacked.items():
            tensors[f"{family.experts()}.{n}"], tensors[f"{family.experts()}.{n}_scale_inv"] = w, s
    _rewrite(tmp_path, fuse)
    fused = load_moe_layer(tmp_path).weights
    assert [n for n, _ in fused.named()] == [n for n, _ in per_expert.named()]
    for (n, a), (_, b) in zip(fused.named(), per_expert.named()):
        assert torch.equal(_bits(a) if a.dtype == torch.float8_e4m3fn else a,
                           _bits(b) if b.dtype == torch.float8_e4m3fn else b), n


def test_digest_covers_fp8_weights_and_scales(tmp_path: Path) -> None:
    family = FAMILIES["qwen3_moe"]
    _fp8_checkpoint(family, "block128", tmp_path)
    before = load_moe_layer(tmp_path)
    scale = f"{family.experts()}.3.up_proj.weight_scale_inv"
    assert scale in before.tensors and scale.replace("_scale_inv", "") in before.tensors

    def bump(tensors: dict[str, torch.Tensor]) -> None:
        tensors[scale] = tensors[scale] * 2
    _rewrite(tmp_path, bump)
    assert load_moe_layer(tmp_path).sha256 != before.sha256


# ---- ModelOpt itself as the producer -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(FAMILIES))
def test_modelopt_export(tmp_path: Path, name: str) -> None:
    """NVIDIA ModelOpt quantizes the tiny model on the CPU (FP8_DEFAULT_CFG, max calibration) and exports it with
    export_hf_checkpoint; the loaded experts are its FP8 tensors bit for bit, dequantized as weight * weight_scale,
    with its input scales reduced to their maximum."""
    mtq = pytest.importorskip("modelopt.torch.quantization", reason="nvidia-modelopt is not installed")
    from modelopt.torch.export import export_hf_checkpoint
    family = FAMILIES[name]
    torch.manual_seed(0)
    model = t.AutoModelForCausalLM.from_config(family.config(), experts_implementation="eager")
    model.config.architectures = [type(model).__name__]  # ModelOpt's export reads it
    _randomize(model.model.layers[family.layer].mlp)
    model = model.to(torch.bfloat16)
    mtq.quantize(model, mtq.FP8_DEFAULT_CFG, lambda m: m(torch.randint(0, 64, (4, 16))))
    export_hf_checkpoint(model, export_dir=tmp_path)
    spec = spec_from_hf_config(tmp_path)
    assert (spec.quant, spec.act_scale) == (Quant.FP8, ActScale.STATIC)
    stored = load_file(tmp_path / SINGLE_FILE)
    w = load_moe_layer(tmp_path).weights
    deq = w.dequantized(torch.float64)
    for e in range(E):
        gate, up, down = family.expert_weights(e)
        assert torch.equal(_bits(w.w1[e]), _bits(torch.cat([stored[gate], stored[up]])))
        exact = [_exact(stored[n], stored[n.replace(".weight", ".weight_scale")]) for n in (gate, up, down)]
        assert torch.equal(deq.w1[e], torch.cat(exact[:2])) and torch.equal(deq.w2[e], exact[2])
    inputs = {n: v for n, v in stored.items() if ".experts." in n and n.endswith(".input_scale")}
    down = f".{family.proj[2]}.input_scale"
    assert float(w.fp8.a1_scale) == max(float(v) for n, v in inputs.items() if not n.endswith(down))
    assert float(w.fp8.a2_scale) == max(float(v) for n, v in inputs.items() if n.endswith(down))


# ---- refusals -------------------------------------------------------------------------------------------------------

_QWEN3 = {"model_type": "qwen3_moe", "hidden_size": H, "intermediate_size": 256, "moe_intermediate_size": I,
          "num_experts": 2, "num_experts_per_tok": 1, "num_hidden_layers": 1, "torch_dtype": "bfloat16"}
_CT_GROUP = {"targets": ["Linear"],
             "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
             "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                                   "dynamic": True}}


def _ct_config(**group: Any) -> dict[str, Any]:
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {**_CT_GROUP, **group}}}


BAD_CONFIGS: dict[str, tuple[dict[str, Any], str | None, str]] = {
    # name: (quantization_config, hf_quant_config.json's quantization, the field the error names)
    "block-64": ({**DEEPSEEK_V3_QUANT, "weight_block_size": [64, 64]}, None, "quantization_config.weight_block_size"),
    "e5m2": ({**DEEPSEEK_V3_QUANT, "fmt": "e5m2"}, None, "quantization_config.fmt"),
    "block-static": ({**DEEPSEEK_V3_QUANT, "activation_scheme": "static"}, None,
                     "quantization_config.activation_scheme"),
    "modelopt-block-weight-only": ({}, "FP8_PB_WO", "hf_quant_config.json quantization.quant_algo"),
    "modelopt-mxfp8": ({"quant_method": "modelopt", "quant_algo": "MXFP8"}, None, "quantization_config.quant_algo"),
    "fbgemm": ({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0}, None, "quantization_config.quant_method"),
    "ct-weight-only": (_ct_config(input_activations=None), None,
                       "quantization_config.config_groups.group_0.input_activations"),
    "ct-group-32": (_ct_config(weights={**_CT_GROUP["weights"], "strategy": "group", "group_size": 32}), None,
                    "quantization_config.config_groups.group_0.weights.strategy"),
    "ct-block-64": (_ct_config(weights={**_CT_GROUP["weights"], "strategy": "block", "block_structure": [64, 64]}),
                    None, "quantization_config.config_groups.group_0.weights.block_structure"),
    "ct-static-per-token": (_ct_config(input_activations={**_CT_GROUP["input_activations"], "dynamic": False}), None,
                            "quantization_config.config_groups.group_0.input_activations.strategy"),
    "ct-naive-format": ({**_ct_config(), "format": "naive-quantized"}, None, "quantization_config.format"),
}


def _config_folder(tmp_path: Path, quantization_config: dict[str, Any], modelopt: str | None = None) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    config = {**_QWEN3, **({"quantization_config": quantization_config} if quantization_config else {})}
    (folder / "config.json").write_text(json.dumps(config))
    if modelopt is not None:
        (folder / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": modelopt}}))
    return folder


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_unsupported_fp8_description_names_the_field(tmp_path: Path, case: str) -> None:
    config, modelopt, field = BAD_CONFIGS[case]
    with pytest.raises(MoeBuildError) as err:
        spec_from_hf_config(_config_folder(tmp_path, config, modelopt))
    assert err.value.field == field and "\n" not in str(err.value) and err.value.allowed


def test_what_the_fp8_descriptions_mean() -> None:
    def quant(q: dict[str, Any]) -> tuple[str, str]:
        spec = spec_from_hf_config({**_QWEN3, "quantization_config": q})
        return spec.quant.value, spec.act_scale.value
    assert quant(DEEPSEEK_V3_QUANT) == ("fp8_block", "dynamic")
    assert quant({"quant_method": "fp8", "activation_scheme": "static"}) == ("fp8", "static")  # AutoFP8
    assert quant({"quant_method": "fp8", "weight_block_size": None}) == ("fp8", "dynamic")
    assert quant(MODELOPT_CONFIG_QUANT) == ("fp8", "static")
    assert quant({"quant_method": "modelopt", "quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"}) == ("fp8", "dynamic")
    assert quant(_ct_config()) == ("fp8", "dynamic")
    assert quant({"quant_method": "mxfp4"}) == ("wfp4a16", "dynamic")  # not FP8: weight-only (woq_config)
    assert quant({"quant_method": "modelopt", "quant_algo": "NVFP4"}) == ("none", "dynamic")


def test_modelopt_file_alone_is_read(tmp_path: Path) -> None:
    """Older ModelOpt exports put the description only in hf_quant_config.json."""
    spec = spec_from_hf_config(_config_folder(tmp_path, {}, "FP8"))
    assert (spec.quant, spec.act_scale) == (Quant.FP8, ActScale.STATIC)


@pytest.mark.parametrize("fmt", ["block128", "modelopt", "ct_fp8_dynamic"])
def test_quant_none_dequantizes_the_fp8_experts(tmp_path: Path, fmt: str) -> None:
    """--quant none over an FP8 checkpoint (an OOTB engine for a GPU without FP8): every expert matrix w_fp8 * scale,
    computed here, rounded once to the model's bf16; the checkpoint's own spec keeps them FP8."""
    family = FAMILIES["qwen3_moe"]
    _, written = _fp8_checkpoint(family, fmt, tmp_path)
    w = load_moe_layer(tmp_path).weights.for_spec(resolve_spec(tmp_path, quant="none"))
    assert w.fp8 is None and w.woq is None
    for e in range(E):
        gate, up, down = family.expert_weights(e)
        exact = torch.cat([_exact(written.weights[n], written.scales[n]) for n in (gate, up)])
        assert torch.equal(w.w1[e], exact.to(torch.bfloat16))
        assert torch.equal(w.w2[e], _exact(written.weights[down], written.scales[down]).to(torch.bfloat16))


def test_quant_none_builds_an_ootb_engine_of_an_fp8_checkpoint_for_sm86(tmp_path: Path) -> None:
    """What the refusal of FP8 below SM 8.9 suggests, run as a user runs it."""
    pytest.importorskip("tensorrt_rtx_bindings")
    _fp8_checkpoint(FAMILIES["qwen3_moe"], "block128", tmp_path / "ckpt")
    args = ("build", str(tmp_path / "ckpt"), "--sm", "86", "--flavour", "tensorrt-rtx")
    refused = run_moe_build(*args, cwd=tmp_path)
    assert refused.returncode == 2 and "--quant none builds it" in refused.stderr
    r = run_moe_build(*args, "--quant", "none", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    manifest = json.loads(next((tmp_path / "engines").glob("*.json")).read_text())
    assert manifest["quant"]["mode"] == "none" and manifest["target"]["sm"] == 86


def _tiny(folder: Path, fmt: str, inter: int = I) -> None:
    """A two-expert Qwen3-MoE layer written directly (no model) in `fmt`."""
    folder.mkdir()
    g = torch.Generator().manual_seed(0)
    tensors = {"model.layers.0.mlp.gate.weight": torch.randn(2, H, generator=g).to(torch.bfloat16)}
    granularity = ScaleGranularity.BLOCK128 if fmt == "block128" else ScaleGranularity.TENSOR
    for e in range(2):
        for proj, shape in (("gate_proj", (inter, H)), ("up_proj", (inter, H)), ("down_proj", (H, inter))):
            base = f"model.layers.0.mlp.experts.{e}.{proj}"
            q, s = _quantized(torch.randn(*shape, generator=g), granularity)
            tensors[f"{base}.weight"] = q
            if fmt == "block128":
                tensors[f"{base}.weight_scale_inv"] = s
            else:
                tensors[f"{base}.weight_scale"], tensors[f"{base}.input_scale"] = s, torch.tensor(0.01)
    save_file(tensors, folder / SINGLE_FILE)
    quant = DEEPSEEK_V3_QUANT if fmt == "block128" else MODELOPT_CONFIG_QUANT
    (folder / "config.json").write_text(json.dumps({**_QWEN3, "moe_intermediate_size": inter,
                                                    "quantization_config": quant}))


_E = "model.layers.0.mlp.experts"
BAD_TENSORS: dict[str, tuple[str, Callable[[dict[str, torch.Tensor]], None], str, str]] = {
    # name: (format, edit, tensor named, words of the problem)
    "e5m2-weight": ("block128", lambda d: d.update({f"{_E}.1.up_proj.weight": d[f"{_E}.1.up_proj.weight"].float()
                                                    .to(torch.float8_e5m2)}), f"{_E}.1.up_proj.weight", "F8_E5M2"),
    "bf16-weight": ("block128", lambda d: d.update({f"{_E}.0.gate_proj.weight": d[f"{_E}.0.gate_proj.weight"].float()
                                                    .to(torch.bfloat16)}), f"{_E}.0.gate_proj.weight", "BF16"),
    "missing-scale": ("block128", lambda d: d.pop(f"{_E}.0.down_proj.weight_scale_inv"),
                      f"{_E}.0.down_proj.weight_scale_inv", "missing"),
    "block-scale-shape": ("block128", lambda d: d.update({f"{_E}.1.gate_proj.weight_scale_inv": torch.ones(1, 1)}),
                          f"{_E}.1.gate_proj.weight_scale_inv", "shape (1, 1)"),
    "nan-scale": ("block128", lambda d: d[f"{_E}.0.up_proj.weight_scale_inv"].view(-1)[0].fill_(float("nan")),
                  f"{_E}.0.up_proj.weight_scale_inv", "finite"),
    "int-scale": ("block128", lambda d: d.update({f"{_E}.0.up_proj.weight_scale_inv": torch.ones(1, 2, dtype=torch.int32)}),
                  f"{_E}.0.up_proj.weight_scale_inv", "I32"),
    "fp8-router": ("block128", lambda d: d.update({"model.layers.0.mlp.gate.weight": torch.zeros(2, H).to(
        torch.float8_e4m3fn)}), "model.layers.0.mlp.gate.weight", "F8_E4M3"),
    "missing-input-scale": ("modelopt", lambda d: d.pop(f"{_E}.1.down_proj.input_scale"),
                            f"{_E}.1.down_proj.input_scale", "static"),
    "zero-input-scale": ("modelopt", lambda d: d.update({f"{_E}.0.gate_proj.input_scale": torch.tensor(0.0)}),
                         f"{_E}.0.gate_proj.input_scale", "> 0"),
    "channel-scale-shape": ("modelopt", lambda d: d.update({f"{_E}.0.down_proj.weight_scale": torch.ones(7)}),
                            f"{_E}.0.down_proj.weight_scale", "shape (7,)"),
}


@pytest.mark.parametrize("case", list(BAD_TENSORS))
def test_bad_fp8_tensor_is_named(tmp_path: Path, case: str) -> None:
    fmt, edit, tensor, words = BAD_TENSORS[case]
    folder = tmp_path / "ckpt"
    _tiny(folder, fmt)
    load_moe_layer(folder)  # as written, it loads
    _rewrite(folder, edit)
    with pytest.raises(MoeBuildError) as err:
        load_moe_layer(folder)
    assert err.value.field == tensor and words in str(err.value) and "\n" not in str(err.value)


def test_ue8m0_block_scales(tmp_path: Path) -> None:
    """Block scales stored as UE8M0 powers of two (F8_E8M0, transformers' scale_fmt "ue8m0") read exactly."""
    folder = tmp_path / "ckpt"
    _tiny(folder, "block128")

    def ue8m0(tensors: dict[str, torch.Tensor]) -> None:
        for n in [n for n in tensors if n.endswith("_scale_inv")]:
            tensors[n] = torch.exp2(torch.log2(tensors[n]).ceil()).to(torch.float8_e8m0fnu)
    _rewrite(folder, ue8m0)
    stored = load_file(folder / SINGLE_FILE)
    scales = load_moe_layer(folder).weights.fp8
    gate, up, down = (stored[f"{_E}.1.{p}.weight_scale_inv"].float() for p in ("gate_proj", "up_proj", "down_proj"))
    assert torch.equal(scales.w1_scale[1], torch.cat([gate, up])) and torch.equal(scales.w2_scale[1], down)


def test_block_rows_that_straddle_w1_blocks_are_refused(tmp_path: Path) -> None:
    """I = 64 per-expert: the up rows would start inside W1's first 128-row block, under the gate's scale."""
    folder = tmp_path / "ckpt"
    _tiny(folder, "block128", inter=64)
    with pytest.raises(MoeBuildError) as err:
        load_moe_layer(folder)
    assert err.value.field == f"{_E}.0.gate_proj.weight_scale_inv" and "multiple of 128" in str(err.value)


def test_quant_flag_overrides_the_checkpoint(tmp_path: Path) -> None:
    """--quant overrides the inferred quant; the checkpoint's weights must still fit the overridden spec."""
    folder = tmp_path / "ckpt"
    _tiny(folder, "block128")
    assert resolve_spec(folder).quant is Quant.FP8_BLOCK
    weights = load_moe_layer(folder).weights
    for quant, words in (("fp8", "fp8 with block128 weight scales"), ("none", "FP8 expert weights given")):
        spec: MoESpec = resolve_spec(folder, quant=quant)
        assert spec.quant.value == quant
        with pytest.raises(MoeBuildError) as err:
            weights.check(spec)
        assert err.value.field == "quant" and words in str(err.value)


# ---- through the command line -------------------------------------------------------------------------------------

def _one_line_refusal(r: Any, *needles: str) -> None:
    """Exit 2, no traceback, the error one line (tests/test_bad_inputs.py's rule)."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr and lines and lines[-1].startswith("moe-build"), r.stderr
    assert all(line.startswith("[") for line in lines[:-1]), r.stderr
    assert all(n in lines[-1] for n in needles), (needles, lines[-1])


@pytest.mark.parametrize("command,case", [("fusion-report", "block-64"), ("fusion-report", "ct-weight-only"),
                                          ("fusion-report", "modelopt-block-weight-only"), ("build", "e5m2")])
def test_cli_refuses_unsupported_fp8_description(tmp_path: Path, command: str, case: str) -> None:
    config, modelopt, field = BAD_CONFIGS[case]
    folder = _config_folder(tmp_path, config, modelopt)
    out = tmp_path / "out"
    r = run_moe_build(command, str(folder), *(["--out", str(out)] if command == "build" else []))
    _one_line_refusal(r, field)
    assert not out.exists()


@pytest.mark.parametrize("command,sm,flavour", [("fusion-report", "80", "tensorrt"), ("build", "86", "tensorrt"),
                                                 ("fusion-report", "86", "tensorrt-rtx"),
                                                 ("build", "80", "tensorrt-rtx")])
def test_cli_refuses_fp8_below_sm89(tmp_path: Path, command: str, sm: str, flavour: str) -> None:
    """The planner's FP8 rule (FP8 needs SM >= 89) on the plugin path and the OOTB path, before any weight is read."""
    folder = tmp_path / "ckpt"
    _tiny(folder, "block128")
    with pytest.raises(UnsupportedCombination) as refusal:
        make_plan(spec_from_hf_config(folder), Target(sm=int(sm), flavour=Flavour(flavour)))
    assert refusal.value.rule.endswith("fp8_sm")
    out = tmp_path / "out"
    r = run_moe_build(command, str(folder), "--sm", sm, "--flavour", flavour,
                      *(["--out", str(out)] if command == "build" else []))
    _one_line_refusal(r, f"rule {refusal.value.rule}", "quant=fp8_block", f"sm={sm}", "sm >= 89")
    assert not out.exists()


def test_cli_build_names_a_bad_fp8_tensor(tmp_path: Path) -> None:
    """Where the plan builds FP8 (the OOTB path on SM 89), `build` loads the checkpoint: a missing scale is one
    line naming it, and no engine is written."""
    folder = tmp_path / "ckpt"
    _tiny(folder, "block128")
    _rewrite(folder, lambda tensors: tensors.pop(f"{_E}.0.down_proj.weight_scale_inv"))
    out = tmp_path / "out"
    r = run_moe_build("build", str(folder), "--sm", "89", "--flavour", "tensorrt-rtx", "--out", str(out))
    _one_line_refusal(r, f"{_E}.0.down_proj.weight_scale_inv", "missing")
    assert not list(out.glob("*.engine")) if out.exists() else True


def test_cli_reports_the_inferred_quant(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    _tiny(folder, "modelopt")
    r = run_moe_build("fusion-report", str(folder), "--sm", "90", "--flavour", "tensorrt", "--json")
    assert r.returncode == 0, r.stderr
    spec = json.loads(r.stdout)["spec"]
    assert (spec["quant"], spec["act_scale"]) == ("fp8", "static")


@pytest.mark.parametrize("inter,hidden", [(192, 300), (1408, 256), (2880, 128)])
def test_gate_up_halves_scales_follow_each_row(inter: int, hidden: int) -> None:
    """gate_up_halves_scales: the scale row of the halves' order covering each W1 row is that row's block scale (the
    stacked scales broadcast to every row, expand_weight_scale), for I on and off multiples of 128 (192: gate and up
    share the middle block); I off a multiple of 64 and scales of another shape are refused."""
    e, kb = 3, blocks(hidden)
    scale = torch.rand(e, blocks(2 * inter), kb)
    per_row = expand_weight_scale(scale, ScaleGranularity.BLOCK128, 2 * inter, kb * 128)[:, :, ::128]  # [E, 2I, kb]
    halves = gate_up_halves_scales(scale, inter)
    assert halves.shape == (e, 2 * inter // 8, kb)
    for t in range(inter // 64):
        for h in (0, 1):  # gate, then up: W1 row h * I + 64t + i sits at row 128t + 64h + i of the halves' order
            for i in range(64):
                assert torch.equal(halves[:, (128 * t + 64 * h + i) // 8], per_row[:, h * inter + 64 * t + i])
    with pytest.raises(ValueError, match="multiple of 64"):
        gate_up_halves_scales(scale, inter + 8)
    with pytest.raises(ValueError, match=r"w1_scale: shape .* is not \[E, "):  # a non-gated W1's scales (I rows)
        gate_up_halves_scales(torch.rand(e, blocks(inter), kb), inter)
