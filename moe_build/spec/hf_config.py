"""Hugging Face `config.json` -> MoESpec: the family's parser (families.py) on the config's MoE fields, and the
quantization the checkpoint describes.

Multimodal models keep their language model's config under `text_config` (Qwen3-Omni under
`thinker_config.text_config`); the spec is that language model's MoE layer, and its family stays the
top-level `model_type` so the checkpoint loader knows where those layers live.

FP8 checkpoints set the spec's `quant` and `act_scale` from their quantization description (`_fp8_quant`,
spec/fp8_config.py); weight-only quantized ones (AWQ, compressed-tensors int, ModelOpt W4A16/W4A8-AWQ and W8A16,
GPT-OSS's MXFP4) set `quant` and `quant_group_size` the same way (`_woq_quant`, spec/woq_config.py).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

from ..errors import MoeBuildError
from ..jsonfile import read_json_object
from .config_fields import ConfigFields, prefixed
from .families import EXPERTS_PER_TOKEN, FAMILIES, REFUSED, family_of
from .fp8_config import Fp8, fp8_description
from .layer import MoESpec
from .woq_config import Woq, woq_description

ConfigSource = Mapping[str, Any] | str | os.PathLike
MODELOPT_CONFIG = "hf_quant_config.json"  # NVIDIA ModelOpt's description, beside config.json


def load_config(source: ConfigSource) -> dict[str, Any]:
    """Accept a dict, a config.json path or a checkpoint folder, so callers need not care which."""
    if isinstance(source, Mapping):
        return dict(source)
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    return read_json_object(path, "config")


def _modelopt_file(source: ConfigSource) -> dict[str, Any] | None:
    """ModelOpt's hf_quant_config.json beside config.json, when the config came from a file and it is there."""
    if isinstance(source, Mapping):
        return None
    path = Path(source)
    path = (path if path.is_dir() else path.parent) / MODELOPT_CONFIG
    return read_json_object(path, MODELOPT_CONFIG) if path.is_file() else None


def _fp8_quant(data: Mapping[str, Any], family: str, source: ConfigSource) -> Fp8 | None:
    """(quant, act_scale) of an FP8 checkpoint from its quantization_config (top level, else the language
    model's sub-config) or ModelOpt's hf_quant_config.json; None for an unquantized checkpoint or another
    quantization, which leaves the spec's quant none as before."""
    text = _text_fields(data, family).data
    path = ".".join((*family_of(family).text, "quantization_config"))
    for where, q in (("quantization_config", data.get("quantization_config")),
                     (path, text.get("quantization_config"))):
        if q is None:
            continue
        if not isinstance(q, Mapping):
            raise MoeBuildError(where, f"must be an object, got {q!r}", "an object")
        with prefixed(where):
            return fp8_description(q)
    stored = _modelopt_file(source)
    if stored is None:
        return None
    q = stored.get("quantization")
    with prefixed(f"{MODELOPT_CONFIG} quantization"):
        if not isinstance(q, Mapping):
            raise MoeBuildError("quant_algo", "missing: no quantization object", "an object with quant_algo")
        return fp8_description(q, modelopt_file=True)


def _woq_quant(data: Mapping[str, Any], family: str, source: ConfigSource) -> Woq | None:
    """(quant, group size, act_scale) of a weight-only quantized checkpoint (spec/woq_config.py), read from the same
    places as `_fp8_quant`; None where the checkpoint is not weight-only quantized."""
    text = _text_fields(data, family).data
    path = ".".join((*family_of(family).text, "quantization_config"))
    for where, q in (("quantization_config", data.get("quantization_config")),
                     (path, text.get("quantization_config"))):
        if isinstance(q, Mapping):
            with prefixed(where):
                return woq_description(q)
    stored = _modelopt_file(source)
    q = None if stored is None else stored.get("quantization")
    if not isinstance(q, Mapping):
        return None
    with prefixed(f"{MODELOPT_CONFIG} quantization"):
        return woq_description(q, modelopt_file=True)


def _family(data: Mapping[str, Any]) -> str:
    model_type = data.get("model_type")
    if model_type is None:
        raise MoeBuildError("model_type", "missing from the config", FAMILIES)
    if not isinstance(model_type, str):
        raise MoeBuildError("model_type", f"must be a string, got {model_type!r}", FAMILIES)
    if model_type in REFUSED:
        arch, missing = REFUSED[model_type]
        raise MoeBuildError("model_type", f"{model_type!r} ({arch}) is not supported: {missing}", FAMILIES)
    if model_type not in FAMILIES:
        raise MoeBuildError("model_type", f"{model_type!r} is not a supported MoE model", FAMILIES)
    return model_type


def _text_fields(data: Mapping[str, Any], family: str) -> ConfigFields:
    """The fields of the config that describes the MoE layers: the config itself, or its language model's
    sub-config, which inherits the top-level dtype when it states none."""
    path = family_of(family).text
    if not path:
        return ConfigFields(data)
    text: Any = data
    for i, key in enumerate(path):
        text = text.get(key) if isinstance(text, Mapping) else None
        if not isinstance(text, Mapping):
            raise MoeBuildError(".".join(path[:i + 1]), "missing from the config", "an object")
    dtype = {k: data[k] for k in ("dtype", "torch_dtype") if data.get(k) is not None}
    return ConfigFields(text if ConfigFields(text).first("dtype", "torch_dtype") else {**text, **dtype})


def _name(data: Mapping[str, Any], source: ConfigSource, family: str) -> str:
    """The checkpoint's own name when known (hub id or folder), else the family."""
    if data.get("_name_or_path"):
        return str(data["_name_or_path"]).rstrip("/").split("/")[-1]
    if not isinstance(source, Mapping):
        path = Path(source)
        return (path if path.is_dir() else path.parent).resolve().name
    return family


# MoESpec's own checks name spec fields; report them under the config key the user can fix.
_CONFIG_KEYS = {"top_k": EXPERTS_PER_TOKEN + ("moe_topk", "moe_top_k"),
                "num_groups": ("n_group", "num_expert_group"), "topk_groups": ("topk_group",)}


def _config_key(data: Mapping[str, Any], field: str) -> str:
    """The config key behind spec field `field` (DBRX nests its expert keys in ffn_config)."""
    for key in _CONFIG_KEYS.get(field, ()):
        if key in data:
            return key
        if isinstance(data.get("ffn_config"), Mapping) and key in data["ffn_config"]:
            return f"ffn_config.{key}"
    return field


@contextmanager
def _keys_of(family: str) -> Iterator[None]:
    """Name the keys of a multimodal config's language model by their full path (text_config.num_experts)."""
    try:
        yield
    except MoeBuildError as exc:
        path = family_of(family).text
        if not path:
            raise
        raise MoeBuildError(".".join((*path, exc.field)), exc.problem, exc.allowed) from None


def spec_from_hf_config(config: ConfigSource) -> MoESpec:
    """The MoESpec of one MoE layer of a Hugging Face MoE model (all its MoE layers are alike)."""
    data = load_config(config)
    family = _family(data)
    moe_layer_indices(data)  # a config whose layers are all dense is not an MoE model
    fields = _text_fields(data, family)
    fp8 = _fp8_quant(data, family, config)
    quant = {} if fp8 is None else dict(quant=fp8[0], act_scale=fp8[1])
    woq = None if fp8 is not None else _woq_quant(data, family, config)
    if woq is not None:
        quant = dict(quant=woq[0], quant_group_size=woq[1], act_scale=woq[2], **woq[3])
    with _keys_of(family):
        spec = family_of(family).parse(fields)
        try:
            return MoESpec(**spec, **quant, family=family, name=_name(data, config, family))
        except MoeBuildError as exc:
            raise MoeBuildError(_config_key(fields.data, exc.field), exc.problem, exc.allowed) from None


def moe_layer_indices(config: ConfigSource) -> list[int]:
    """Decoder layers whose MLP is the MoE block (the others are dense MLPs)."""
    data = load_config(config)
    family = _family(data)
    fields = _text_fields(data, family)
    with _keys_of(family):
        indices = family_of(family).layers(fields)
        if not indices:
            raise MoeBuildError("num_hidden_layers", "no decoder layer is an MoE layer, so this is not an MoE model",
                                "a config with at least one MoE layer")
    return indices


def select_moe_layers(config: ConfigSource, layer: int | None, all_layers: bool) -> list[int]:
    """The decoder layers a command works on: every MoE layer, decoder layer `layer` (refused unless
    it is an MoE layer), or the first MoE layer. Reads only the config, so a wrong `layer` is
    refused before any weight is read."""
    indices = moe_layer_indices(config)
    if all_layers:
        return indices
    if layer is None:
        return indices[:1]
    if layer not in indices:
        raise MoeBuildError("layer", f"decoder layer {layer} is not an MoE layer of {config}", indices)
    return [layer]
