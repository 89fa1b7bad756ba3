"""FP8 checkpoints: the spec's quant and act_scale from the producer's quantization description.

Read (quantization_config of config.json, or ModelOpt's hf_quant_config.json `quantization`):
- quant_method "fp8" (DeepSeek-V3, the Qwen3 -FP8 releases, AutoFP8): 128 x 128 weight blocks (fp8_block) or one scale
  per matrix (fp8), static or dynamic activations;
- NVIDIA ModelOpt: quant_algo FP8 (per-tensor weights, calibrated input scales) and FP8_PER_CHANNEL_PER_TOKEN;
- compressed-tensors / llm-compressor: one config group of 8-bit float weights and activations, `float-quantized`.
The experts then stay FP8 from the file to the kernels, so a description that moe-build cannot run exactly is refused
in one line naming the key rather than read as something else.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from ..errors import MoeBuildError
from .config_fields import ConfigFields, one_config_group, prefixed
from .layer import ActScale, Quant
from .woq_config import is_int

Fp8 = tuple[Quant, ActScale]
_BLOCK = [128, 128]                        # the one weight block moe-build's FP8 kernels scale by


def _fp8_method(q: Mapping[str, Any]) -> Fp8:
    """quant_method "fp8": DeepSeek-V3 and the Qwen3 -FP8 releases ({"quant_method": "fp8", "fmt": "e4m3",
    "weight_block_size": [128, 128], "activation_scheme": "dynamic"}); without weight_block_size (or null) one
    scale per weight matrix, as vLLM reads AutoFP8 checkpoints, with static or dynamic activations."""
    g = ConfigFields(q)
    if q.get("fmt") is not None:
        g.choice("fmt", ("e4m3",))
    if q.get("expert_dtype") is not None:
        g.choice("expert_dtype", ("fp8",))
    act = ActScale(g.choice("activation_scheme", ("dynamic", "static"), default="dynamic"))
    block = q.get("weight_block_size")
    if block is None:
        return Quant.FP8, act
    if not isinstance(block, (list, tuple)) or list(block) != _BLOCK:
        raise MoeBuildError("weight_block_size", f"{block!r}: moe-build's FP8 kernels scale 128 x 128 weight blocks",
                            "[128, 128], null (one scale per matrix)")
    if act is ActScale.STATIC:
        raise MoeBuildError("activation_scheme", "static with 128 x 128 weight blocks: fp8_block quantizes "
                            "activations per 1 x 128 group at run time", "dynamic")
    return Quant.FP8_BLOCK, ActScale.DYNAMIC


# ModelOpt's FP8 algorithms: FP8 is per-tensor weights with calibrated input scales; FP8_PER_CHANNEL_PER_TOKEN
# is per-row weight scales with dynamic per-token activations.
_MODELOPT_FP8: dict[str, Fp8] = {"FP8": (Quant.FP8, ActScale.STATIC),
                                  "FP8_PER_CHANNEL_PER_TOKEN": (Quant.FP8, ActScale.DYNAMIC)}


def _modelopt(q: Mapping[str, Any]) -> Fp8 | None:
    """NVIDIA ModelOpt (`quant_algo`); None for its algorithms without FP8. Its other FP8 algorithms (block-wise
    weight-only, FP8 mixed with FP4 or INT4, MXFP8) are refused."""
    algo = q.get("quant_algo")
    if isinstance(algo, str) and algo in _MODELOPT_FP8:
        return _MODELOPT_FP8[algo]
    layers = q.get("quantized_layers") if algo == "MIXED_PRECISION" else None
    algos = [v.get("quant_algo") for v in layers.values() if isinstance(v, Mapping)] \
        if isinstance(layers, Mapping) else [algo]
    if any(isinstance(a, str) and "FP8" in a.upper() for a in algos):
        raise MoeBuildError("quant_algo", f"{algo!r} is not an FP8 scheme moe-build runs", list(_MODELOPT_FP8))
    return None


def _is_float8(args: Any) -> bool:
    return isinstance(args, Mapping) and args.get("type") == "float" and args.get("num_bits") == 8


def _ct_weights(w: Mapping[str, Any]) -> Quant:
    """compressed-tensors weight args of an FP8 group (key names relative to it, for the caller to prefix)."""
    if not _is_float8(w):
        raise MoeBuildError("num_bits", f"{w.get('num_bits')}-bit {w.get('type')} weights with FP8 activations",
                            "8-bit float weights")
    ConfigFields(w).same("symmetric", True, "FP8 weights carry no zero point")
    ConfigFields(w).same("dynamic", False, "FP8 weights are quantized ahead of time")
    strategy = ConfigFields(w).choice("strategy", ("tensor", "channel", "block"))
    if strategy != "block":
        return Quant.FP8
    if list(w.get("block_structure") or ()) != _BLOCK:
        raise MoeBuildError("block_structure", f"{w.get('block_structure')!r}: moe-build's FP8 kernels scale "
                            "128 x 128 weight blocks", "[128, 128]")
    return Quant.FP8_BLOCK


def _ct_activations(a: Mapping[str, Any], quant: Quant) -> ActScale:
    """compressed-tensors input activation args: static per tensor, dynamic per token (per-tensor and per-channel
    weights) or dynamic per 1 x 128 group (block weights), the schemes moe-build's FP8 kernels compute."""
    if not _is_float8(a):
        raise MoeBuildError("num_bits", f"{a.get('num_bits')}-bit {a.get('type')} activations", "8-bit float")
    f = ConfigFields(a)
    f.same("symmetric", True, "FP8 activations carry no zero point")
    dynamic = f.bool("dynamic")
    if quant is Quant.FP8_BLOCK:
        f.same("dynamic", True, "block weights go with activations quantized per 1 x 128 group at run time")
        f.same("group_size", 128, "activations are quantized per 1 x 128 group")
    strategy, why = (("group", "activations of 128 x 128 block weights are scaled per 1 x 128 group")
                     if quant is Quant.FP8_BLOCK else
                     ("token", "dynamic activation scales are per token") if dynamic else
                     ("tensor", "static activation scales are one per tensor"))
    if a.get("strategy") != strategy:
        raise MoeBuildError("strategy", f"{a.get('strategy')!r}: moe-build's {why}", strategy)
    return ActScale.DYNAMIC if dynamic else ActScale.STATIC


def _compressed_tensors(q: Mapping[str, Any]) -> Fp8 | None:
    """compressed-tensors / llm-compressor: one config group of 8-bit float weights and activations stored
    `float-quantized`; None when no group quantizes to 8-bit float (one_config_group)."""
    found = one_config_group(q, lambda g: _is_float8(g.get("weights")) or (  # int weights: woq_config's W4AFP8
        _is_float8(g.get("input_activations")) and not is_int(g.get("weights"))), "FP8")
    if found is None:
        return None
    name, group = found
    fmt = group.get("format") or q.get("format")
    if fmt != "float-quantized":
        raise MoeBuildError("format", f"{fmt!r} is not how compressed-tensors stores FP8 weights", "float-quantized")
    ConfigFields(q).same("quantization_status", "compressed", "the weights are stored unquantized")
    with prefixed(f"config_groups.{name}"):
        if group.get("output_activations") is not None:
            raise MoeBuildError("output_activations", "quantized layer outputs are not supported", "null")
        if not isinstance(group.get("weights"), Mapping):
            raise MoeBuildError("weights", "absent: FP8 activations with unquantized weights", "8-bit float weights")
        with prefixed("weights"):
            quant = _ct_weights(group["weights"])
        if not isinstance(group.get("input_activations"), Mapping):
            raise MoeBuildError("input_activations", "absent: weight-only FP8 (16-bit activations) is not run by "
                                "moe-build's FP8 kernels", "8-bit float input_activations")
        with prefixed("input_activations"):
            act = _ct_activations(group["input_activations"], quant)
    return quant, act


_FP8_METHODS: dict[str, Callable[[Mapping[str, Any]], Fp8 | None]] = {
    "fp8": _fp8_method, "modelopt": _modelopt, "compressed-tensors": _compressed_tensors}


def _refused_fbgemm(q: Mapping[str, Any]) -> Fp8:
    raise MoeBuildError("quant_method", "'fbgemm_fp8' clamps its dynamic activation scales "
                        "(activation_scale_ub), which moe-build's FP8 kernels do not", list(_FP8_METHODS))


_QUANT_METHODS = {**_FP8_METHODS, "fbgemm_fp8": _refused_fbgemm}


def fp8_description(q: Mapping[str, Any], modelopt_file: bool = False) -> Fp8 | None:
    """(quant, act_scale) of the quantization description `q` when it is FP8 (`modelopt_file`: ModelOpt's
    hf_quant_config.json `quantization` object, which names no quant_method); None for another quantization, which
    leaves the spec's quant none as before."""
    if modelopt_file:
        return _modelopt(q)
    method = q.get("quant_method")
    parse = _QUANT_METHODS.get(method) if isinstance(method, str) else None
    return None if parse is None else parse(q)
