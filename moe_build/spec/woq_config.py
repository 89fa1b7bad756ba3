"""Weight-only quantized checkpoints: the spec's quant, group size and act_scale from the producer's description.

Read (quantization_config of config.json, or ModelOpt's hf_quant_config.json `quantization`):
- AutoAWQ: {"quant_method": "awq", "bits": 4, "group_size": g, "zero_point": true, "version": "gemm"} -> w4a16_awq;
- compressed-tensors / llm-compressor: one config group of int weights, `pack-quantized` (4 or 8 bits, weight-only:
  W4A16, W4A16_ASYM, W8A16), or int4 weights with 8-bit float input activations (W4AFP8, which compressed-tensors
  stores `naive-quantized`), or 8-bit int weights stored `int-quantized` / `naive-quantized`;
- NVIDIA ModelOpt: quant_algo W4A16_AWQ (w4a16_awq), W4A8_AWQ (w4afp8, static FP8 input scales), W8A16 (w8a16);
- GPT-OSS: {"quant_method": "mxfp4"} -> wfp4a16, group 32.
What moe-build cannot run exactly (other bit widths, AWQ packings other than GEMM, group sizes other than 32/64/128,
asymmetric int8, activation schemes other than FP8 per tensor or per token) is refused in one line naming the key.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..errors import MoeBuildError
from .config_fields import one_config_group
from .layer import ActScale, Quant

# quant, quant_group_size, act_scale, and how the experts are stored: the spec's quant_zero_points /
# quant_per_channel / quant_prequant_scales flags that are true
Woq = tuple[Quant, int, ActScale, dict[str, bool]]
GROUP_SIZES = (32, 64, 128)        # woq.GROUP_SIZES (not imported: the spec package does not import torch)
MXFP4_GROUP = 32
PER_CHANNEL = 128                  # the spec's default group size, kept where weights have one scale per channel


def _group_size(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in GROUP_SIZES:
        raise MoeBuildError(key, f"group size {value!r} is not one moe-build's int4 kernels run", GROUP_SIZES)
    return value


def _awq(q: Mapping[str, Any]) -> Woq:
    """AutoAWQ (transformers' AwqConfig): only its GEMM packing of 4-bit weights."""
    if q.get("bits", 4) != 4:
        raise MoeBuildError("bits", f"{q.get('bits')!r}-bit AWQ weights", "4")
    version = str(q.get("version", "gemm")).lower()
    if version != "gemm":
        raise MoeBuildError("version", f"{q.get('version')!r}: moe-build reads AutoAWQ's GEMM packing only", "gemm")
    zeros = {"quant_zero_points": True} if q.get("zero_point", True) else {}
    return Quant.W4A16_AWQ, _group_size("group_size", q.get("group_size", 128)), ActScale.DYNAMIC, zeros


def _mxfp4(q: Mapping[str, Any]) -> Woq:
    return Quant.WFP4A16, MXFP4_GROUP, ActScale.DYNAMIC, {}


_MODELOPT = {"W4A16_AWQ": Quant.W4A16_AWQ, "W4A8_AWQ": Quant.W4AFP8, "W8A16": Quant.W8A16}


def _modelopt(q: Mapping[str, Any]) -> Woq | None:
    """ModelOpt's weight-only algorithms; None for the others (FP8 ones are read by fp8_config, the rest not)."""
    algo = q.get("quant_algo")
    if algo == "MIXED_PRECISION":
        layers = q.get("quantized_layers")
        algos = {v.get("quant_algo") for v in layers.values() if isinstance(v, Mapping)} \
            if isinstance(layers, Mapping) else set()
        if algos & set(_MODELOPT):
            raise MoeBuildError("quant_algo", f"MIXED_PRECISION with {sorted(a for a in algos if a)}: moe-build reads "
                                "one scheme for every expert", list(_MODELOPT))
        return None
    if algo not in _MODELOPT:
        return None
    quant = _MODELOPT[algo]
    if quant is Quant.W8A16:
        return quant, PER_CHANNEL, ActScale.DYNAMIC, {"quant_per_channel": True}
    if q.get("has_zero_point"):
        raise MoeBuildError("has_zero_point", "ModelOpt int4 AWQ with zero points", "false")
    group = q.get("group_size")
    groups = q.get("config_groups")
    if group is None and isinstance(groups, Mapping):
        found = [g.get("weights", {}).get("group_size") for g in groups.values() if isinstance(g, Mapping)]
        group = next((x for x in found if x is not None), None)
    # ModelOpt's AWQ export writes each expert linear's pre_quant_scale
    return quant, _group_size("group_size", 128 if group is None else group), \
        ActScale.STATIC if quant is Quant.W4AFP8 else ActScale.DYNAMIC, {"quant_prequant_scales": True}


def is_int(args: Any) -> bool:
    return isinstance(args, Mapping) and args.get("type") == "int"


def _ct_acts(a: Any) -> ActScale | None:
    """compressed-tensors input activations of an int4 group: None (weight-only) or 8-bit float per tensor
    (static) or per token (dynamic)."""
    if a is None:
        return None
    if not isinstance(a, Mapping) or a.get("type") != "float" or a.get("num_bits") != 8:
        got = a.get("num_bits") if isinstance(a, Mapping) else a
        raise MoeBuildError("input_activations", f"{got}-bit {a.get('type') if isinstance(a, Mapping) else ''} "
                            "activations with int weights", "none (weight-only), 8-bit float (int4 weights)")
    dynamic = bool(a.get("dynamic"))
    want = "token" if dynamic else "tensor"
    if a.get("strategy") != want or a.get("symmetric", True) is not True:
        raise MoeBuildError("input_activations.strategy", f"{a.get('strategy')!r} (dynamic={dynamic}): moe-build's "
                            "FP8 activations are static per tensor or dynamic per token", want)
    return ActScale.DYNAMIC if dynamic else ActScale.STATIC


def _compressed_tensors(q: Mapping[str, Any]) -> Woq | None:
    """One compressed-tensors config group with int weights; None when no group has int weights (one_config_group)."""
    found = one_config_group(q, lambda g: is_int(g.get("weights")), "weight-only")
    if found is None:
        return None
    name, group = found
    w = group["weights"]
    where = f"config_groups.{name}"
    bits = w.get("num_bits")
    if bits not in (4, 8):
        raise MoeBuildError(f"{where}.weights.num_bits", f"{bits!r}-bit int weights", "4, 8")
    act = _ct_acts(group.get("input_activations"))
    if act is not None and bits != 4:
        raise MoeBuildError(f"{where}.input_activations", "FP8 activations with int8 weights", "none")
    fmt = group.get("format") or q.get("format")
    formats = ("pack-quantized",) if act is None and bits == 4 else \
        ("naive-quantized",) if act is not None else ("pack-quantized", "int-quantized", "naive-quantized")
    if fmt not in formats:
        raise MoeBuildError("format", f"{fmt!r} is not how compressed-tensors stores these weights", formats)
    if q.get("quantization_status", "compressed") != "compressed":
        raise MoeBuildError("quantization_status", f"{q.get('quantization_status')!r}: the weights are not stored "
                            "quantized", "compressed")
    if w.get("dynamic"):
        raise MoeBuildError(f"{where}.weights.dynamic", "weights quantized at run time", "false")
    if bits == 8 and w.get("symmetric", True) is not True:
        raise MoeBuildError(f"{where}.weights.symmetric", "asymmetric int8 weights", "true")
    strategy = w.get("strategy")
    if strategy == "channel":
        group_size = PER_CHANNEL
    elif strategy == "group" and bits == 4:
        group_size = _group_size(f"{where}.weights.group_size", w.get("group_size"))
    elif strategy == "group":
        group_size = w.get("group_size")
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0 or group_size % 2:
            raise MoeBuildError(f"{where}.weights.group_size", f"{group_size!r}", "a positive even group size")
    else:
        raise MoeBuildError(f"{where}.weights.strategy", f"{strategy!r} int weights", "group, channel")
    storage = {"quant_per_channel": strategy == "channel", "quant_zero_points": w.get("symmetric", True) is not True}
    storage = {k: v for k, v in storage.items() if v}
    if act is not None:
        return Quant.W4AFP8, group_size, act, storage
    return (Quant.W4A16_AWQ if bits == 4 else Quant.W8A16), group_size, ActScale.DYNAMIC, storage


WOQ_METHODS = {"awq": _awq, "mxfp4": _mxfp4, "modelopt": _modelopt, "compressed-tensors": _compressed_tensors}


def woq_description(q: Mapping[str, Any], modelopt_file: bool = False) -> Woq | None:
    """(quant, group size, act_scale, storage flags) of a quantization description, None where it is not weight-only
    quantized.
    modelopt_file: `q` is hf_quant_config.json's `quantization` object, which names no quant_method."""
    if modelopt_file:
        return _modelopt(q)
    method = q.get("quant_method")
    parse = WOQ_METHODS.get(method) if isinstance(method, str) else None
    return None if parse is None else parse(q)
