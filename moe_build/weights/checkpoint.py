"""Load MoE layer weights from a Hugging Face safetensors checkpoint into MoEWeights.

Only the tensors of the requested layer are read (safetensors reads lazily), so one layer of a
multi-hundred-GB model loads in seconds. Each family's `_Layout` lists the tensor names its
checkpoints hold: what the released files use (which transformers 5.x `save_pretrained` writes back,
reversing its load-time conversions), and the fused layout transformers 5.x uses in memory
(`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]), for files written straight from a
model's state_dict. Most families store 2-D per-expert matrices (`experts.N.gate_proj`, Mixtral-style
`experts.N.w1/w3/w2`); Granite, Aria, Qwen3-VL-MoE and others stack them (as nn.Linear or as x @ W
matrices, told apart by their shapes); multimodal models keep the language model's layers under their
own prefix. GPT-OSS (fused, gate/up interleaved, released as MXFP4 `_blocks`/`_scales`) and DBRX (experts as
[E * I, H] slices) have loaders of their own.

FP8 checkpoints (the spec's quant fp8 or fp8_block, from the config) keep their routed experts in FP8, read by
`fp8_checkpoint` at the same places of the same layouts; their shared experts are dequantized to the model dtype.
Weight-only quantized checkpoints (w4a16_awq, w8a16, w4afp8, wfp4a16) keep their routed experts packed, read by
`woq_checkpoint` into woq.py's canonical form, GPT-OSS's MXFP4 experts as MXFP4 (wfp4a16); shared experts are
dequantized. A layer is always read as its checkpoint stores it: `--quant none` dequantizes the experts afterwards
(MoEWeights.for_spec).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import SafetensorError, safe_open

from ..errors import MoeBuildError
from ..jsonfile import read_json_object
from ..spec.hf_config import select_moe_layers, spec_from_hf_config
from ..spec import MoESpec, Quant
from .fp8 import Fp8Scales
from .fp8_checkpoint import Part, dense_weight, fp8_experts, is_fp8
from .layout import MoEWeights
from .woq import MXFP4_GROUP, WoqKind, WoqWeights
from .woq_checkpoint import is_woq, mxfp4_matrix, woq_dense_weight, woq_experts

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_FLOAT_DTYPES = ("F32", "F16", "BF16")  # safetensors names of plain float32/float16/bfloat16


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
        if index.exists():
            weight_map = read_json_object(index, INDEX_FILE).get("weight_map")
            if not isinstance(weight_map, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
                raise MoeBuildError(f"{INDEX_FILE} weight_map", "must map tensor names to shard file names",
                                    "an object of strings")
            for shard in set(weight_map.values()):
                self._inside(shard)
            return dict(weight_map)
        single = self.folder / SINGLE_FILE
        if not single.is_file():
            raise MoeBuildError(SINGLE_FILE, f"no {SINGLE_FILE} or {INDEX_FILE} in {self.folder}",
                                "a Hugging Face safetensors checkpoint folder")
        return {name: SINGLE_FILE for name in self._open(SINGLE_FILE, SINGLE_FILE).keys()}

    def _inside(self, shard: str) -> Path:
        """The shard's path, refused unless it is a file name inside the checkpoint folder (an index must not
        make moe-build read files elsewhere)."""
        path = (self.folder / shard).resolve()
        if Path(shard).is_absolute() or not path.is_relative_to(self.folder.resolve()):
            raise MoeBuildError(f"{INDEX_FILE} weight_map", f"shard {shard!r} lies outside {self.folder}",
                                "file names inside the checkpoint folder")
        return path

    def _open(self, shard: str, tensor: str) -> Any:
        if shard not in self.handles:
            path = self._inside(shard)
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

    def _header(self, name: str) -> tuple[tuple[int, ...], str] | None:
        """The stored shape and dtype of `name` (header only), None when absent."""
        if name not in self.shard_of:
            return None
        try:
            sliced = self._open(self.shard_of[name], name).get_slice(name)
        except SafetensorError:
            return None
        return tuple(sliced.get_shape()), sliced.get_dtype()

    def shape(self, name: str) -> tuple[int, ...] | None:
        """The stored shape of `name`, None when absent."""
        header = self._header(name)
        return None if header is None else header[0]

    def dtype(self, name: str) -> str | None:
        """The safetensors dtype name of `name` (F32, BF16, F8_E4M3, ...), None when absent."""
        header = self._header(name)
        return None if header is None else header[1]

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
        self.hasher.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())  # 0-d scales too
        self.read.append(name)


_Pair = tuple[torch.Tensor, torch.Tensor]
# w1, w2 and, for FP8 experts, their scales; for weight-only quantized ones, the WoqWeights w1 / w2 belong to
_Experts = tuple[torch.Tensor, torch.Tensor, Fp8Scales | WoqWeights | None]


def _join(*parts: str) -> str:
    """A tensor name from its parts; an empty part (Mistral's MoE tensors sit directly under the layer) is
    skipped rather than leaving a double dot."""
    return ".".join(p for p in parts if p)


@dataclass(frozen=True)
class _Fused:
    """Stacked expert tensors under the block: gate_up holds each expert's gate then up projection, as
    nn.Linear matrices ([E, 2I, H], down [E, H, I]) or as x @ W matrices ([E, H, 2I], down [E, I, H]).
    `matmul` is the orientation the family's files use; the other one is read too, told apart by the
    shapes (transformers 5.x saves Qwen3-VL-MoE stacked as nn.Linear, its released files hold x @ W). The
    two can only be confused if H == 2I and H == I at once, which no layer is. With `up` set, gate_up holds
    the gates only and `up` the ups, each [E, I, H] (Step-3.5); those are read in nn.Linear form only."""

    gate_up: str
    down: str
    matmul: bool = False
    up: str | None = None


@dataclass(frozen=True)
class _Layout:
    """Where one family keeps one MoE layer's tensors. Every field lists the spellings its checkpoints use
    (released files, transformers 5.x `save_pretrained`, a model's in-memory state_dict); the first one the
    checkpoint holds wins. Names are relative to `<prefix><layer>.<block>`, shared-MLP paths to the layer
    (`{block}` stands for the block), so one loader serves every family but GPT-OSS and DBRX."""

    prefixes: tuple[str, ...] = ("model.layers.",)
    blocks: tuple[str, ...] = ("mlp",)
    routers: tuple[str, ...] = ("gate.weight",)
    per_expert: tuple[str, str, str] | None = ("gate_proj", "up_proj", "down_proj")  # experts.N.<name>.weight
    fused: tuple[_Fused, ...] = (_Fused("experts.gate_up_proj", "experts.down_proj"),)
    correction_bias: tuple[str, ...] = ("gate.e_score_correction_bias",)
    shared: tuple[str, ...] = ("{block}.shared_experts",)
    shared_proj: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    shared_fused: tuple[str, str] | None = None  # one [2Is, H] gate-then-up matrix and the down matrix
    shared_gate: str = "shared_expert_gate.weight"
    router_bias: str = "router.bias"
    expert_bias: tuple[str, str] = ("experts.gate_up_proj_bias", "experts.down_proj_bias")


def _first(ck: _Checkpoint, names: list[str]) -> str:
    """The first of `names` the checkpoint holds, else the first (so the error names what was expected)."""
    return next((n for n in names if ck.has(n)), names[0])


def _per_expert(ck: _Checkpoint, base: str, names: tuple[str, str, str], spec: MoESpec) -> _Experts:
    """w1 [E, 2I, H] and w2 [E, H, I] from 2-D per-expert gate/up/down matrices."""
    H, I = spec.hidden_size, spec.intermediate_size
    gate, up, down = names
    if is_woq(spec):
        def woq_part(name: str, shape: tuple[int, int]) -> Part:
            return Part(tuple(f"{base}.{e}.{name}.weight" for e in range(spec.num_experts)), shape)
        q = woq_experts(ck, [woq_part(gate, (I, H)), woq_part(up, (I, H))], woq_part(down, (H, I)), spec)
        return q.w1, q.w2, q
    if is_fp8(spec):
        def part(name: str, shape: tuple[int, int]) -> Part:
            return Part(tuple(f"{base}.{e}.{name}.weight" for e in range(spec.num_experts)), shape)
        return fp8_experts(ck, [part(gate, (I, H)), part(up, (I, H))], part(down, (H, I)), spec)
    w1, w2 = [], []
    for e in range(spec.num_experts):
        w1.append(torch.cat([ck.get(f"{base}.{e}.{gate}.weight", (I, H)), ck.get(f"{base}.{e}.{up}.weight", (I, H))]))
        w2.append(ck.get(f"{base}.{e}.{down}.weight", (H, I)))
    return torch.stack(w1), torch.stack(w2), None


def _routed_experts(ck: _Checkpoint, layout: _Layout, block: str, spec: MoESpec) -> _Experts:
    """Stacked experts if the checkpoint holds them, else per-expert matrices, as canonical w1 / w2 (FP8 ones with
    their scales). Stacked FP8 experts are read in nn.Linear form, the one transformers 5.x holds them in."""
    E, H, I = spec.num_experts, spec.hidden_size, spec.intermediate_size
    for fused in layout.fused:
        gate_up, down = _join(block, fused.gate_up), _join(block, fused.down)
        if is_woq(spec) and ck.has(gate_up):  # refused by name: weight-only experts are read per expert
            woq_experts(ck, [Part((gate_up,), (E, 2 * I, H))], Part((down,), (E, H, I)), spec)
        if fused.up is not None and ck.has(gate_up):
            up = _join(block, fused.up)
            if is_fp8(spec):
                return fp8_experts(ck, [Part((gate_up,), (E, I, H)), Part((up,), (E, I, H))],
                                   Part((down,), (E, H, I)), spec)
            return (torch.cat([ck.get(gate_up, (E, I, H)), ck.get(up, (E, I, H))], dim=1), ck.get(down, (E, H, I)),
                    None)
        if ck.has(gate_up) and is_fp8(spec):
            return fp8_experts(ck, [Part((gate_up,), (E, 2 * I, H))], Part((down,), (E, H, I)), spec)
        if ck.has(gate_up):
            shapes = (ck.shape(gate_up), ck.shape(down))
            if shapes == ((E, H, 2 * I), (E, I, H)):
                matmul = True
            elif shapes == ((E, 2 * I, H), (E, H, I)):
                matmul = False
            else:  # neither: the family's own orientation names the mismatch
                matmul = fused.matmul
            if matmul:
                return (ck.get(gate_up, (E, H, 2 * I)).transpose(1, 2).contiguous(),
                        ck.get(down, (E, I, H)).transpose(1, 2).contiguous(), None)
            return ck.get(gate_up, (E, 2 * I, H)), ck.get(down, (E, H, I)), None
    if layout.per_expert is None:
        fused = layout.fused[0]
        raise MoeBuildError(_join(block, fused.gate_up), "missing from the checkpoint",
                            f"a tensor of shape {(E, H, 2 * I) if fused.matmul else (E, 2 * I, H)}")
    return _per_expert(ck, _join(block, "experts"), layout.per_expert, spec)


def _shared_mlp(ck: _Checkpoint, layout: _Layout, layer: str, module: str, spec: MoESpec) -> _Pair:
    """shared_w1 [2Is, H] (gate rows, then up) and shared_w2 [H, Is], stored split or stacked (FP8 ones
    dequantized to the model dtype: `dense_weight`)."""
    H, Is = spec.hidden_size, spec.shared.intermediate_size
    bases = [_join(layer, *path.format(block=module).split(".")) for path in layout.shared]
    if layout.shared_fused:
        gate_up, down = layout.shared_fused
        base = next((b for b in bases if ck.has(f"{b}.{gate_up}.weight")), None)
        if base is not None:
            return (_dense_weight(ck, f"{base}.{gate_up}.weight", (2 * Is, H), spec),
                    _dense_weight(ck, f"{base}.{down}.weight", (H, Is), spec))
    gate, up, down = layout.shared_proj
    base = _first(ck, [f"{b}.{gate}.weight" for b in bases]).removesuffix(f".{gate}.weight")
    w1 = torch.cat([_dense_weight(ck, f"{base}.{gate}.weight", (Is, H), spec),
                    _dense_weight(ck, f"{base}.{up}.weight", (Is, H), spec)])
    return w1, _dense_weight(ck, f"{base}.{down}.weight", (H, Is), spec)


def _dense_weight(ck: _Checkpoint, name: str, shape: tuple[int, int], spec: MoESpec) -> torch.Tensor:
    """A dense MLP weight beside the experts, dequantized to the model dtype where it is stored quantized."""
    return woq_dense_weight(ck, name, shape, spec) if is_woq(spec) else dense_weight(ck, name, shape, spec)


def _find_block(ck: _Checkpoint, layout: _Layout, index: int) -> tuple[str, str, str]:
    """(layer, block module, router tensor) of decoder layer `index`: the first spelling whose router the
    checkpoint holds."""
    options = [(f"{prefix}{index}", block, _join(f"{prefix}{index}", block, router))
               for prefix in layout.prefixes for block in layout.blocks for router in layout.routers]
    return next((o for o in options if ck.has(o[2])), options[0])


def _load_layout(layout: _Layout) -> Callable[[_Checkpoint, int, MoESpec], MoEWeights]:
    """The loader of one `_Layout`: router, experts, then the optional tensors the spec uses, in that order."""
    def load(ck: _Checkpoint, index: int, spec: MoESpec) -> MoEWeights:
        E, H = spec.num_experts, spec.hidden_size
        layer, module, router_name = _find_block(ck, layout, index)
        block = _join(layer, module)
        router = ck.get(router_name, (E, H))
        router_bias = ck.get(_join(block, layout.router_bias), (E,)) if spec.routing.router_bias else None
        w1, w2, quant = _routed_experts(ck, layout, block, spec)
        w = MoEWeights(router_weight=router, router_bias=router_bias, w1=w1, w2=w2,
                       fp8=quant if isinstance(quant, Fp8Scales) else None,
                       woq=quant if isinstance(quant, WoqWeights) else None)
        if spec.expert_bias:
            w.b1 = ck.get(_join(block, layout.expert_bias[0]), (E, spec.fc1_out_features))
            w.b2 = ck.get(_join(block, layout.expert_bias[1]), (E, H))
        if spec.routing.correction_bias:
            w.correction_bias = ck.get(_first(ck, [_join(block, n) for n in layout.correction_bias]), (E,))
        if spec.shared.count:
            w.shared_w1, w.shared_w2 = _shared_mlp(ck, layout, layer, module, spec)
        if spec.shared.sigmoid_gate:
            w.shared_gate = ck.get(_join(block, layout.shared_gate), (1, H))
        return w
    return load


def _deinterleave(t: torch.Tensor) -> torch.Tensor:
    """GPT-OSS alternates gate and up along the last dim; canonical order is all gates then all ups."""
    return torch.cat([t[..., 0::2], t[..., 1::2]], dim=-1)


def _deinterleave_rows(w: torch.Tensor) -> torch.Tensor:
    """The same for the rows of [E, 2I, H] weights."""
    return torch.cat([w[:, 0::2], w[:, 1::2]], dim=1).contiguous()


def _gpt_oss_mxfp4(ck: _Checkpoint, base: str, spec: MoESpec, b1: torch.Tensor) -> tuple[WoqWeights | None, _Pair]:
    """Released GPT-OSS experts, MXFP4 in nn.Linear orientation (gate_up_proj_blocks [E, 2I, H/32, 16] with gate and
    up rows interleaved, down_proj_blocks [E, H, I/32, 16]): kept as canonical MXFP4 (wfp4a16) with W1's rows put in
    canonical order (whole rows move, so every byte and exponent stays as stored); where the config names no
    quantization (quant none) and the files still hold MXFP4 blocks, their exact values in the biases' dtype.
    (`--quant none` over a config that says mxfp4 dequantizes after loading: MoEWeights.for_spec.)"""
    E, H, I = spec.num_experts, spec.hidden_size, spec.intermediate_size
    q1, s1 = (_deinterleave_rows(t) for t in mxfp4_matrix(ck, f"{base}.gate_up_proj", 2 * I, H, E))
    q2, s2 = mxfp4_matrix(ck, f"{base}.down_proj", H, I, E)
    woq = WoqWeights(WoqKind.MXFP4, MXFP4_GROUP, q1, q2, s1, s2)
    if spec.quant is Quant.WFP4A16:
        return woq, (woq.w1, woq.w2)
    if spec.quant is not Quant.NONE:
        raise MoeBuildError("quant", f"{spec.quant.value}: GPT-OSS's experts are stored MXFP4", "wfp4a16, none")
    return None, (woq.dense("w1", b1.dtype), woq.dense("w2", b1.dtype))


def _load_gpt_oss(ck: _Checkpoint, index: int, spec: MoESpec) -> MoEWeights:
    """GPT-OSS: router with bias; fused experts with interleaved gate/up and per-expert biases. Plain checkpoints
    hold x @ W matrices (gate_up_proj [E, H, 2I], down_proj [E, I, H]); released ones MXFP4 (`_gpt_oss_mxfp4`)."""
    block = f"model.layers.{index}.mlp"
    E, H, I = spec.num_experts, spec.hidden_size, spec.intermediate_size
    router = ck.get(f"{block}.router.weight", (E, H))
    router_bias = ck.get(f"{block}.router.bias", (E,))
    b1 = ck.get(f"{block}.experts.gate_up_proj_bias", (E, 2 * I))
    b2 = ck.get(f"{block}.experts.down_proj_bias", (E, H))
    base = f"{block}.experts"
    woq = None
    if spec.quant is Quant.WFP4A16 or (not ck.has(f"{base}.gate_up_proj") and ck.has(f"{base}.gate_up_proj_blocks")):
        woq, (w1, w2) = _gpt_oss_mxfp4(ck, base, spec, b1)
    else:
        w1 = _deinterleave_rows(ck.get(f"{base}.gate_up_proj", (E, H, 2 * I)).transpose(1, 2))
        w2 = ck.get(f"{base}.down_proj", (E, I, H)).transpose(1, 2).contiguous()
    return MoEWeights(router_weight=router, router_bias=router_bias, w1=w1, b1=_deinterleave(b1), w2=w2, b2=b2,
                      woq=woq)


def _load_dbrx(ck: _Checkpoint, index: int, spec: MoESpec) -> MoEWeights:
    """DBRX: each expert's gate (w1), up (v1) and down (w2) are [I, H] slices of three [E * I, H] tensors; the
    down slice is applied as x @ w2, so it is transposed into nn.Linear form."""
    E, H, I = spec.num_experts, spec.hidden_size, spec.intermediate_size
    block = f"transformer.blocks.{index}.ffn"
    router = ck.get(f"{block}.router.layer.weight", (E, H))
    gate, up, down = (ck.get(f"{block}.experts.mlp.{n}", (E * I, H)).view(E, I, H) for n in ("w1", "v1", "w2"))
    return MoEWeights(router_weight=router, w1=torch.cat([gate, up], dim=1), w2=down.transpose(1, 2).contiguous())


# Layouts that several families share.
_LLAVA_PREFIXES = ("language_model.model.layers.", "model.language_model.layers.")  # files, then in memory
_MIXTRAL = _Layout(blocks=("block_sparse_moe", "mlp"), per_expert=("w1", "w3", "w2"))
_QWEN2_MOE = _Layout(shared=("{block}.shared_expert",))
_QWEN_COMPOSITE = replace(_QWEN2_MOE, prefixes=("model.language_model.layers.", "model.layers."))
_GRANITE = _Layout(blocks=("block_sparse_moe",), routers=("router.layer.weight", "router.weight"), per_expert=None,
                   fused=(_Fused("input_linear.weight", "output_linear.weight"),
                          _Fused("experts.gate_up_proj", "experts.down_proj")),
                   shared=("shared_mlp",), shared_fused=("input_linear", "output_linear"))
_ARIA = _Layout(routers=("router.weight",), per_expert=None,
                fused=(_Fused("experts.fc1.weight", "experts.fc2.weight", matmul=True),
                       _Fused("experts.gate_up_proj", "experts.down_proj", matmul=True)))
_MINIMAX_M2 = replace(_MIXTRAL, correction_bias=("e_score_correction_bias", "gate.e_score_correction_bias"))
_MINIMAX_M3 = replace(_MINIMAX_M2, shared_fused=("gate_up_proj", "down_proj"))
# Mistral Large 4 files (Mistral's own format, which save_pretrained writes back) keep the MoE tensors
# directly under `layers.N`
_MISTRAL_LARGE4 = _Layout(prefixes=("layers.",), blocks=("",), per_expert=("w1", "w3", "w2"),
                          shared_proj=("w1", "w3", "w2"))
_EXPERT_BIAS = ("expert_bias", "e_score_correction_bias")  # AFMoE, HY-V3 and LFM2 keep it beside the router
_DS = _Layout()
_SARVAM_MOE = replace(_DS, correction_bias=("gate.expert_bias", "gate.e_score_correction_bias"))

_LOADERS: dict[str, Callable[[_Checkpoint, int, MoESpec], MoEWeights]] = {
    "gpt_oss": _load_gpt_oss,
    "dbrx": _load_dbrx,
    **{family: _load_layout(layout) for family, layout in {
        "mixtral": _MIXTRAL,
        "minimax": _MIXTRAL,
        "minimax_m2": _MINIMAX_M2,
        "minimax_m3_vl_text": _MINIMAX_M3,
        "minimax_m3_vl": replace(_MINIMAX_M3, prefixes=_LLAVA_PREFIXES),
        "granitemoe": _GRANITE,
        "granitemoeshared": _GRANITE,
        "granitemoe_swa": _GRANITE,
        "granitemoehybrid": _GRANITE,
        "aria_text": _ARIA,
        "aria": replace(_ARIA, prefixes=_LLAVA_PREFIXES),
        "hunyuan_v1_moe": _Layout(routers=("gate.wg.weight",), shared=("{block}.shared_mlp",)),
        "openai_privacy_filter": _Layout(routers=("router.weight",), per_expert=None,
                                         fused=(_Fused("experts.gate_up_proj", "experts.down_proj", matmul=True),)),
        "cohere2_moe": _DS,
        "qwen2_moe": _QWEN2_MOE,
        "qwen3_moe": _DS,
        "qwen3_next": _QWEN2_MOE,
        "qwen3_5_moe_text": _QWEN2_MOE,
        "qwen3_5_moe": _QWEN_COMPOSITE,
        "qwen4_exp_text": _QWEN2_MOE,
        "qwen4_exp": _QWEN_COMPOSITE,
        # released Qwen3-VL-MoE files stack the experts as x @ W; transformers transposes them when loading
        "qwen3_vl_moe": _Layout(prefixes=("model.language_model.layers.",), per_expert=None,
                                fused=(_Fused("experts.gate_up_proj", "experts.down_proj", matmul=True),)),
        "qwen3_omni_moe": _Layout(prefixes=("thinker.model.layers.", "thinker.model.language_model.layers.")),
        "olmoe": _DS,
        "flex_olmo": _DS,
        "mellum": _DS,
        "lara_mini": _QWEN2_MOE,
        "jamba": _Layout(blocks=("feed_forward",), routers=("router.weight",)),
        "mistral4": _DS,
        "mistral_large4": _MISTRAL_LARGE4,
        "deepseek_v2": _DS,
        "deepseek_ocr2": replace(_DS, prefixes=("model.layers.", "model.language_model.layers.")),
        "unlimited_ocr": replace(_DS, prefixes=("model.layers.", "model.language_model.layers.")),
        "deepseek_v3": _DS,
        "deepseek_v32": _DS,
        "sarvam_mla": _DS,
        "glm_moe_dsa": _DS,
        "glm4_moe": _DS,
        "glm4_moe_lite": _DS,
        "glm4v_moe": replace(_DS, prefixes=("model.language_model.layers.",)),
        "dots1": _DS,
        "dots3_note_text": _DS,
        "dots3_note": replace(_DS, prefixes=("model.layers.", "model.language_model.layers.")),
        "solar_open": _DS,
        "mimo_v2_flash": _DS,
        "beam": _DS,
        "axk2": _DS,
        # Kimi-K2.5 files say language_model.model.layers; transformers 5.x save_pretrained writes .blocks
        "kimi_k25": replace(_DS, prefixes=("language_model.model.layers.", "model.language_model.layers.",
                                           "language_model.model.blocks.")),
        "sarvam_moe": _SARVAM_MOE,
        "param2moe": _SARVAM_MOE,  # released Param2 files use Sarvam-MoE's names
        "minicpm5_moe": _DS,
        "bailing_hybrid": replace(_DS, correction_bias=("gate.expert_bias", "gate.e_score_correction_bias")),
        "kimi_linear": replace(_DS, blocks=("block_sparse_moe", "mlp"), per_expert=("w1", "w3", "w2")),
        "exaone_moe": replace(_DS, correction_bias=("e_score_correction_bias", "gate.e_score_correction_bias")),
        "afmoe": replace(_DS, routers=("router.gate.weight",), correction_bias=_EXPERT_BIAS),
        "hy_v3": replace(_DS, routers=("router.gate.weight", "gate.weight"), correction_bias=_EXPERT_BIAS,
                         shared=("{block}.shared_mlp", "{block}.shared_experts")),
        "laguna": replace(_DS, correction_bias=("experts.e_score_correction_bias", "gate.e_score_correction_bias"),
                          shared=("{block}.shared_expert", "{block}.shared_experts")),
        "lfm2_moe": _Layout(blocks=("feed_forward",), per_expert=("w1", "w3", "w2"), correction_bias=_EXPERT_BIAS),
        "flint": _QWEN2_MOE,
        # Step's files stack each layer's gates and ups separately under `moe`, the shared expert beside it
        **dict.fromkeys(("step3p5", "step3p7"), _Layout(
            prefixes=("model.layers.", "model.language_model.layers."), blocks=("moe", "mlp"),
            fused=(_Fused("gate_proj.weight", "down_proj.weight", up="up_proj.weight"),
                   _Fused("experts.gate_up_proj", "experts.down_proj")),
            correction_bias=("router_bias", "gate.e_score_correction_bias"),
            shared=("share_expert", "{block}.shared_experts"))),
    }.items()},
}


def _load(ck: _Checkpoint, spec: MoESpec, layer: int) -> LoadedLayer:
    ck.start_digest()
    weights = _LOADERS[spec.family](ck, layer, spec)
    weights.check(spec)
    return LoadedLayer(spec=spec, layer=layer, weights=weights, sha256=ck.hasher.hexdigest(), tensors=tuple(ck.read))


def checkpoint_shards(folder: Path) -> dict[str, Path]:
    """Tensor name -> shard file, from the index or the single file's header, refused as the loader
    refuses it (a malformed index, a shard outside the folder, no weights file)."""
    with contextlib.ExitStack() as stack:
        return {name: folder / shard for name, shard in _Checkpoint(folder, stack).shard_of.items()}


def _load_layers(folder: Path, indices: list[int]) -> list[LoadedLayer]:
    spec = spec_from_hf_config(folder)
    with contextlib.ExitStack() as stack:
        ck = _Checkpoint(folder, stack)
        return [_load(ck, spec, i) for i in indices]


def load_moe_layers(folder: str | os.PathLike, layer: int | None = None) -> list[LoadedLayer]:
    """Every MoE layer of the checkpoint (or only decoder layer `layer`), tensors in their stored dtype."""
    path = Path(folder)
    return _load_layers(path, select_moe_layers(path, layer, all_layers=layer is None))


def load_moe_layer(folder: str | os.PathLike, layer: int | None = None) -> LoadedLayer:
    """One MoE layer: decoder layer `layer`, or the first MoE layer when None."""
    path = Path(folder)
    return _load_layers(path, select_moe_layers(path, layer, all_layers=False))[0]
