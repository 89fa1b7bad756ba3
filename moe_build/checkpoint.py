"""Load MoE layer weights from a Hugging Face safetensors checkpoint into MoEWeights.

Only the tensors of the requested layer are read (safetensors reads lazily), so one layer of a
multi-hundred-GB model loads in seconds. Tensor names follow what the families' checkpoints
hold on disk, which is also what transformers 5.x `save_pretrained` writes: per-expert 2-D
matrices (`experts.N.gate_proj`, Mixtral `experts.N.w1/w3/w2`) for every family except GPT-OSS,
whose experts are fused 3-D tensors with interleaved gate/up columns (released GPT-OSS weights
are MXFP4 `_blocks`/`_scales`, dequantized here exactly). The fused layout
transformers 5.x uses in memory (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj`
[E, H, I]) is accepted too, for files written straight from a model's state_dict.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from .errors import MoeBuildError
from .hf_config import moe_layer_indices, spec_from_hf_config
from .spec import MoESpec
from .weights import MoEWeights

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_FLOAT_DTYPES = ("F32", "F16", "BF16")  # safetensors names of plain float32/float16/bfloat16
# FP4 (e2m1) code points, indexed by the 4-bit code; MXFP4 packs two per byte, low nibble first
_FP4_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_MXFP4_BLOCK = 32  # values sharing one power-of-two scale


@dataclass(frozen=True)
class LoadedLayer:
    """One MoE layer as loaded: its spec, canonical weights, and the source-bytes digest for the manifest."""

    spec: MoESpec
    layer: int
    weights: MoEWeights
    sha256: str
    tensors: tuple[str, ...]  # source tensor names, in the order they were hashed


class _Checkpoint:
    """Tensor name -> shard map with lazily opened shards; every read is shape/dtype checked and hashed."""

    def __init__(self, folder: Path, stack: contextlib.ExitStack):
        self.folder = folder
        self.stack = stack
        self.handles: dict[str, Any] = {}
        self.shard_of = self._shard_map()
        self.start_digest()

    def _shard_map(self) -> dict[str, str]:
        index = self.folder / INDEX_FILE
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise MoeBuildError(INDEX_FILE, f"malformed index ({exc!r})", "a safetensors index with a weight_map")
            return dict(weight_map)
        single = self.folder / SINGLE_FILE
        if not single.is_file():
            raise MoeBuildError(SINGLE_FILE, f"no {SINGLE_FILE} or {INDEX_FILE} in {self.folder}",
                                "a Hugging Face safetensors checkpoint folder")
        return {name: SINGLE_FILE for name in self._open(SINGLE_FILE, SINGLE_FILE).keys()}

    def _open(self, shard: str, tensor: str) -> Any:
        if shard not in self.handles:
            path = self.folder / shard
            if not path.is_file():
                raise MoeBuildError(tensor, f"its shard {shard} is missing from {self.folder}", "a complete checkpoint")
            try:
                self.handles[shard] = self.stack.enter_context(safe_open(os.fspath(path), framework="pt"))
            except (SafetensorError, OSError) as exc:
                raise MoeBuildError(tensor, f"cannot read its shard {shard}: {exc}", "a valid safetensors file")
        return self.handles[shard]

    def start_digest(self) -> None:
        """Begin a fresh digest (one per layer, so each layer's manifest entry stands alone)."""
        self.hasher = hashlib.sha256()
        self.read: list[str] = []

    def has(self, name: str) -> bool:
        return name in self.shard_of

    def get(self, name: str, shape: tuple[int, ...], dtypes: tuple[str, ...] = _FLOAT_DTYPES) -> torch.Tensor:
        """Read one tensor after checking its header, so a bad tensor is reported before any bulk read."""
        if name not in self.shard_of:
            raise MoeBuildError(name, "missing from the checkpoint", f"a tensor of shape {shape}")
        handle = self._open(self.shard_of[name], name)
        try:
            sliced = handle.get_slice(name)
        except SafetensorError:
            raise MoeBuildError(name, f"listed in the index but absent from shard {self.shard_of[name]}",
                                "a consistent checkpoint")
        got_shape, got_dtype = tuple(sliced.get_shape()), sliced.get_dtype()
        if got_dtype not in dtypes:
            raise MoeBuildError(name, f"dtype {got_dtype} is not what this tensor should hold", dtypes)
        if got_shape != shape:
            raise MoeBuildError(name, f"shape {got_shape} does not match the config", f"shape {shape}")
        tensor = handle.get_tensor(name)
        self._hash(name, tensor)
        return tensor

    def _hash(self, name: str, tensor: torch.Tensor) -> None:
        """Digest name, dtype, shape and raw bytes, so any change to a source tensor changes the digest."""
        header = f"{name}|{tensor.dtype}|{tuple(tensor.shape)}\n".encode()
        self.hasher.update(header)
        self.hasher.update(tensor.contiguous().view(torch.uint8).numpy().tobytes())
        self.read.append(name)


_Pair = tuple[torch.Tensor, torch.Tensor]


def _per_expert(ck: _Checkpoint, base: str, names: tuple[str, str, str], spec: MoESpec) -> _Pair:
    """w1 [E, 2I, H] and w2 [E, H, I] from 2-D per-expert gate/up/down matrices."""
    H, I = spec.hidden_size, spec.intermediate_size
    gate, up, down = names
    w1, w2 = [], []
    for e in range(spec.num_experts):
        w1.append(torch.cat([ck.get(f"{base}.{e}.{gate}.weight", (I, H)), ck.get(f"{base}.{e}.{up}.weight", (I, H))]))
        w2.append(ck.get(f"{base}.{e}.{down}.weight", (H, I)))
    return torch.stack(w1), torch.stack(w2)


def _routed_experts(ck: _Checkpoint, block: str, names: tuple[str, str, str], spec: MoESpec) -> _Pair:
    """Per-expert tensors as released checkpoints store them, or transformers 5.x's fused in-memory layout."""
    E, H, I = spec.num_experts, spec.hidden_size, spec.intermediate_size
    if ck.has(f"{block}.experts.gate_up_proj"):
        # fused [E, 2I, H]: gate rows then up rows, already the canonical layout
        return (ck.get(f"{block}.experts.gate_up_proj", (E, 2 * I, H)),
                ck.get(f"{block}.experts.down_proj", (E, H, I)))
    return _per_expert(ck, f"{block}.experts", names, spec)


def _shared_mlp(ck: _Checkpoint, base: str, spec: MoESpec) -> _Pair:
    H, Is = spec.hidden_size, spec.shared.intermediate_size
    w1 = torch.cat([ck.get(f"{base}.gate_proj.weight", (Is, H)), ck.get(f"{base}.up_proj.weight", (Is, H))])
    return w1, ck.get(f"{base}.down_proj.weight", (H, Is))


def _load_mixtral(ck: _Checkpoint, prefix: str, spec: MoESpec) -> MoEWeights:
    # released checkpoints say block_sparse_moe; transformers 5.x renames it to mlp in memory
    block = prefix + ("block_sparse_moe" if ck.has(prefix + "block_sparse_moe.gate.weight") else "mlp")
    router = ck.get(f"{block}.gate.weight", (spec.num_experts, spec.hidden_size))
    w1, w2 = _routed_experts(ck, block, ("w1", "w3", "w2"), spec)
    return MoEWeights(router_weight=router, w1=w1, w2=w2)


def _load_gate_up_down(ck: _Checkpoint, prefix: str, spec: MoESpec) -> MoEWeights:
    """Qwen2/3-MoE, OLMoE, DeepSeek-V2/V3: mlp.gate router, gate_proj/up_proj/down_proj experts."""
    block = prefix + "mlp"
    E, H = spec.num_experts, spec.hidden_size
    router = ck.get(f"{block}.gate.weight", (E, H))
    w1, w2 = _routed_experts(ck, block, ("gate_proj", "up_proj", "down_proj"), spec)
    w = MoEWeights(router_weight=router, w1=w1, w2=w2)
    if spec.routing.correction_bias:
        w.correction_bias = ck.get(f"{block}.gate.e_score_correction_bias", (E,))
    if spec.shared.count:
        shared = "shared_expert" if spec.family == "qwen2_moe" else "shared_experts"
        w.shared_w1, w.shared_w2 = _shared_mlp(ck, f"{block}.{shared}", spec)
    if spec.shared.sigmoid_gate:
        w.shared_gate = ck.get(f"{block}.shared_expert_gate.weight", (1, H))
    return w


def _deinterleave(t: torch.Tensor) -> torch.Tensor:
    """GPT-OSS alternates gate and up along the last dim; canonical order is all gates then all ups."""
    return torch.cat([t[..., 0::2], t[..., 1::2]], dim=-1)


def _deinterleave_rows(w: torch.Tensor) -> torch.Tensor:
    """The same for the rows of [E, 2I, H] weights."""
    return torch.cat([w[:, 0::2], w[:, 1::2]], dim=1).contiguous()


def _mxfp4(ck: _Checkpoint, name: str, rows: int, cols: int, experts: int, dtype: torch.dtype) -> torch.Tensor:
    """Dequantize `name`_blocks [E, rows, cols/32, 16] u8 + `name`_scales [E, rows, cols/32] u8 (exponent
    biased by 127) to [E, rows, cols]. Exact in bf16/fp32: FP4 values times powers of two."""
    if cols % _MXFP4_BLOCK:
        raise MoeBuildError(name + "_blocks", f"{cols} columns are not whole MXFP4 blocks", "multiples of 32")
    groups = cols // _MXFP4_BLOCK
    blocks = ck.get(name + "_blocks", (experts, rows, groups, _MXFP4_BLOCK // 2), ("U8",))
    scales = ck.get(name + "_scales", (experts, rows, groups), ("U8",))
    lut = torch.tensor(_FP4_E2M1, dtype=torch.float32)
    out = torch.empty(experts, rows, cols, dtype=dtype)
    for e in range(experts):  # one expert at a time bounds the fp32 scratch to one matrix
        codes = torch.stack([blocks[e] & 0x0F, blocks[e] >> 4], dim=-1).long()
        values = lut[codes].reshape(rows, groups, _MXFP4_BLOCK)
        out[e] = torch.ldexp(values, scales[e].int().unsqueeze(-1) - 127).reshape(rows, cols).to(dtype)
    return out


def _gpt_oss_experts(ck: _Checkpoint, base: str, spec: MoESpec, dtype: torch.dtype) -> _Pair:
    """w1 [E, 2I, H] with gate/up rows still interleaved, and w2 [E, H, I].

    Plain checkpoints hold x @ W matrices (gate_up_proj [E, H, 2I], down_proj [E, I, H]); the
    released MXFP4 ones hold nn.Linear-oriented blocks ([E, 2I, H/32, 16] and [E, H, I/32, 16]).
    """
    E, H, I = spec.num_experts, spec.hidden_size, spec.intermediate_size
    if not ck.has(f"{base}.gate_up_proj") and ck.has(f"{base}.gate_up_proj_blocks"):
        return _mxfp4(ck, f"{base}.gate_up_proj", 2 * I, H, E, dtype), _mxfp4(ck, f"{base}.down_proj", H, I, E, dtype)
    w1 = ck.get(f"{base}.gate_up_proj", (E, H, 2 * I)).transpose(1, 2)
    return w1, ck.get(f"{base}.down_proj", (E, I, H)).transpose(1, 2).contiguous()


def _load_gpt_oss(ck: _Checkpoint, prefix: str, spec: MoESpec) -> MoEWeights:
    """GPT-OSS: router with bias; fused experts with interleaved gate/up and per-expert biases.
    MXFP4 experts are dequantized to the dtype of their (never quantized) biases."""
    block = prefix + "mlp"
    E, H, I = spec.num_experts, spec.hidden_size, spec.intermediate_size
    router = ck.get(f"{block}.router.weight", (E, H))
    router_bias = ck.get(f"{block}.router.bias", (E,))
    b1 = ck.get(f"{block}.experts.gate_up_proj_bias", (E, 2 * I))
    b2 = ck.get(f"{block}.experts.down_proj_bias", (E, H))
    w1, w2 = _gpt_oss_experts(ck, f"{block}.experts", spec, b1.dtype)
    return MoEWeights(router_weight=router, router_bias=router_bias, w1=_deinterleave_rows(w1), b1=_deinterleave(b1),
                      w2=w2, b2=b2)


_LOADERS = {"mixtral": _load_mixtral, "gpt_oss": _load_gpt_oss}


def _load(ck: _Checkpoint, spec: MoESpec, layer: int) -> LoadedLayer:
    ck.start_digest()
    weights = _LOADERS.get(spec.family, _load_gate_up_down)(ck, f"model.layers.{layer}.", spec)
    weights.check(spec)
    return LoadedLayer(spec=spec, layer=layer, weights=weights, sha256=ck.hasher.hexdigest(), tensors=tuple(ck.read))


def _layers(folder: Path, layer: int | None) -> tuple[MoESpec, list[int]]:
    spec, indices = spec_from_hf_config(folder), moe_layer_indices(folder)
    if layer is None:
        return spec, indices
    if layer not in indices:
        raise MoeBuildError("layer", f"decoder layer {layer} is not an MoE layer", indices)
    return spec, [layer]


def load_moe_layers(folder: str | os.PathLike, layer: int | None = None) -> list[LoadedLayer]:
    """Every MoE layer of the checkpoint (or only decoder layer `layer`), tensors in their stored dtype."""
    path = Path(folder)
    spec, indices = _layers(path, layer)
    with contextlib.ExitStack() as stack:
        ck = _Checkpoint(path, stack)
        return [_load(ck, spec, i) for i in indices]


def load_moe_layer(folder: str | os.PathLike, layer: int | None = None) -> LoadedLayer:
    """One MoE layer: decoder layer `layer`, or the first MoE layer when None."""
    path = Path(folder)
    if layer is None:
        layer = moe_layer_indices(path)[0]
    return load_moe_layers(path, layer)[0]
