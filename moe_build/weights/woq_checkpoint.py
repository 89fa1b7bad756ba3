"""Weight-only quantized expert weights read as their producers store them, converted exactly into woq.py's one
canonical form and never dequantized on load.

Each expert matrix `<m>` ([out, in] in nn.Linear terms) is recognised by the tensors beside it:
- AutoAWQ GEMM (quant_method "awq", version "gemm"): `<m>.qweight` int32 [in, out/8], `<m>.qzeros` int32
  [in/group, out/8] and `<m>.scales` fp16 [in/group, out]. Eight 4-bit values per int32 along the OUTPUT dimension,
  nibble j (bits 4j..4j+3) holding column AWQ_ORDER[j] of its eight (casper-hansen/AutoAWQ awq/modules/linear/
  gemm.py:106-113 packs qweight, :115-128 qzeros; awq/utils/packing_utils.py:4-5 AWQ_ORDER / AWQ_REVERSE_ORDER);
  w = (q - z) * s (packing_utils.py:95, dequantize_gemm). q and z are unsigned 0..15.
- compressed-tensors `pack-quantized` (llm-compressor's W4A16 / W4A16_ASYM / W8A16): `<m>.weight_packed` int32
  [out, ceil(in * bits / 32)], value i of a row at bits i*bits of the row's words, each stored as q + 2^(bits-1)
  (compressed_tensors/compressors/pack_quantized/helpers.py pack_to_int32 / unpack_from_int32), `<m>.weight_scale`
  [out, in/group] or [out, 1], `<m>.weight_shape` [out, in], and for asymmetric int4 `<m>.weight_zero_point` packed
  the same way along the output dimension (int32 [ceil(out/8), in/group]); w = (q - zp) * s.
- compressed-tensors `naive-quantized` / `int-quantized` (its W4AFP8 int4 weights with FP8 activations, 8-bit
  weights): `<m>.weight` int8 [out, in] holding q itself, `<m>.weight_scale`, `<m>.input_scale` when static.
- NVIDIA ModelOpt W4A16_AWQ / W4A8_AWQ: `<m>.weight` uint8 [out/2, in], two signed int4 per byte along the OUTPUT
  dimension, row 2r in the low nibble (modelopt/torch/export/quant_utils.py:805-847, pack_int4_in_uint8),
  `<m>.weight_scale` [out, in/group], `<m>.pre_quant_scale` [in]; W4A8_AWQ adds `<m>.input_scale` [] and
  `<m>.weight_scale_2` []. ModelOpt W8A16: `<m>.weight` int8 [out, in], `<m>.weight_scale` [out]
  (quant_utils.py:973, w = weight * weight_scale[:, None]).
- GPT-OSS MXFP4: `<name>_blocks` uint8 [E, out, in/32, 16] and `<name>_scales` uint8 [E, out, in/32]: already the
  canonical MXFP4 bytes (low nibble the even column, e8m0 exponents), read by `mxfp4_matrix`.

Pre-quant scales apply to a GEMM's whole input, so every gate and up matrix must carry the same `pre_quant_scale`
(and every down matrix the same): ModelOpt's fused-expert export shares one input quantizer across experts
(modelopt/torch/quantization/plugins/huggingface.py:999-1001) and resmooths per-expert ones to one
(unified_export_hf.py:452-462); a checkpoint whose experts differ is refused. Static FP8 input scales are reduced to
their maximum over the experts, as fp8_checkpoint does. Every tensor is read through the checkpoint's `get`, so the
layer's digest covers what was stored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..errors import MoeBuildError
from ..spec import ActScale, MoESpec, Quant
from .dtypes import TORCH_DTYPE
from .fp8_checkpoint import Part, _Checkpoint
from .woq import (GROUP_SIZES, INT4_ZERO, MXFP4_GROUP, WoqKind, WoqWeights, dequantize_matrix, pack_nibbles,
                  unpack_nibbles)

WOQ_QUANTS = (Quant.W4A16_AWQ, Quant.W8A16, Quant.W4AFP8, Quant.WFP4A16)
SCALE_DTYPES = ("F32", "F16", "BF16")  # each converts to fp32 exactly
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)   # AutoAWQ: nibble j of an int32 holds output column AWQ_ORDER[j] of its 8
_FORMATS = ("qweight (AutoAWQ GEMM), weight_packed (compressed-tensors pack-quantized), weight int8 "
            "(compressed-tensors naive/int-quantized, ModelOpt W8A16) or uint8 (ModelOpt int4)")


def is_woq(spec: MoESpec) -> bool:
    return spec.quant in WOQ_QUANTS


def _kind(spec: MoESpec) -> WoqKind:
    return {Quant.W8A16: WoqKind.INT8, Quant.WFP4A16: WoqKind.MXFP4}.get(spec.quant, WoqKind.INT4)


@dataclass(frozen=True)
class _Matrix:
    """One stored matrix in canonical form: data [out, in/2] uint8 (int4) or [out, in] int8, fp32 scales
    [out, groups], uint8 zeros or None, and the companions read beside it."""

    name: str
    q: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None
    group: int | None
    pre_quant: torch.Tensor | None = None
    input_scale: torch.Tensor | None = None
    scale_2: torch.Tensor | None = None


def _stored_groups(ck: _Checkpoint, scale_name: str) -> int:
    """Scale columns as stored: the last dimension of a 2-D scale, 1 for one per output channel ([out])."""
    shape = ck.shape(scale_name)
    return shape[-1] if shape is not None and len(shape) == 2 else 1


def _group(scale_name: str, cols: int, groups: int, spec: MoESpec, fmt: str) -> int | None:
    """The group size a stored scale of `groups` columns means for `cols` inputs: None for one column (one scale
    per output channel, or one group as wide as the matrix: `woq_experts` tells them apart), else cols / groups,
    which must be the config's group size; anything else is refused in one line naming the scale."""
    if groups == 1:
        return None
    g = spec.quant_group_size
    if groups <= 0 or cols % groups or cols // groups != g:
        stored = f"{cols / groups:g}" if groups > 0 else "?"
        raise MoeBuildError(scale_name, f"{fmt}: {groups} scale groups over {cols} input columns (group size "
                            f"{stored}) do not match the config's group size {g}",
                            "groups of the config's group size, or one scale per output channel")
    if spec.quant is not Quant.W8A16 and g not in GROUP_SIZES:
        raise MoeBuildError(scale_name, f"{fmt} group size {g} is not one moe-build runs", GROUP_SIZES)
    return g


def _scale(ck: _Checkpoint, name: str, shapes: Sequence[tuple[int, ...]], out: int) -> torch.Tensor:
    """A float scale stored in one of `shapes`, as fp32 [out, groups] (checked finite)."""
    got = ck.shape(name)
    if got is None:
        raise MoeBuildError(name, "missing from the checkpoint", f"a scale of shape {shapes[0]}")
    if got not in shapes:
        raise MoeBuildError(name, f"shape {got} does not fit its weight", " or ".join(map(str, shapes)))
    s = ck.get(name, got, SCALE_DTYPES).to(torch.float32).reshape(out, -1)
    if not bool(torch.isfinite(s).all()):
        raise MoeBuildError(name, "holds a scale that is not a finite number", "finite scales")
    return s


def _words_to_values(words: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """int32 words [..., w] holding `bits`-bit values at bit i*bits of consecutive words (compressed-tensors'
    pack_to_int32 for bits 4 and 8, AutoAWQ's words before its column order) -> the stored values [..., count]
    as int16, computed arithmetically so that the host's byte order does not matter."""
    per = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    values = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return values.reshape(*words.shape[:-1], words.shape[-1] * per)[..., :count].to(torch.int16)


def _int_values(name: str, values: torch.Tensor, lo: int, hi: int, fmt: str) -> None:
    if values.numel() and (int(values.min()) < lo or int(values.max()) > hi):
        raise MoeBuildError(name, f"{fmt} values outside {lo}..{hi}", f"integers {lo}..{hi}")


def _autoawq(ck: _Checkpoint, base: str, out: int, cols: int, spec: MoESpec) -> _Matrix:
    fmt = "AutoAWQ GEMM"
    if out % 8:
        raise MoeBuildError(f"{base}.qweight", f"{fmt} packs 8 output columns per int32, and {out} outputs are not "
                            "whole int32s", "output sizes that are multiples of 8")
    sname = f"{base}.scales"
    stored = ck.shape(sname)
    groups = stored[0] if stored is not None and len(stored) == 2 else 1  # AutoAWQ: [in/group, out]
    group = _group(sname, cols, groups, spec, fmt)
    ng = 1 if group is None else cols // group
    qweight = ck.get(f"{base}.qweight", (cols, out // 8), ("I32",))
    qzeros = ck.get(f"{base}.qzeros", (ng, out // 8), ("I32",))
    scales = _scale(ck, sname, [(ng, out)], ng).T.contiguous()
    reverse = [AWQ_ORDER.index(k) for k in range(8)]  # column k of each 8 sits in nibble reverse[k]

    def columns(words: torch.Tensor) -> torch.Tensor:
        nib = _words_to_values(words, 4, words.shape[-1] * 8).reshape(*words.shape, 8)
        return nib[..., reverse].reshape(words.shape[0], -1)
    q = columns(qweight).T  # [out, in], unsigned 0..15
    return _Matrix(base, pack_nibbles(q), scales, columns(qzeros).T.to(torch.uint8).contiguous(), group)


def _bits(spec: MoESpec) -> int:
    return 8 if spec.quant is Quant.W8A16 else 4


def _ct_packed(ck: _Checkpoint, base: str, out: int, cols: int, spec: MoESpec) -> _Matrix:
    fmt, bits = "compressed-tensors pack-quantized", _bits(spec)
    shape = ck.get(f"{base}.weight_shape", (2,), ("I64", "I32"))
    if [int(v) for v in shape] != [out, cols]:
        raise MoeBuildError(f"{base}.weight_shape", f"{[int(v) for v in shape]} does not match the config",
                            f"[{out}, {cols}]")
    words = ck.get(f"{base}.weight_packed", (out, -(-cols * bits // 32)), ("I32",))
    sname = f"{base}.weight_scale"
    group = _group(sname, cols, _stored_groups(ck, sname), spec, fmt)
    ng = 1 if group is None else cols // group
    scale = _scale(ck, sname, [(out, ng)] + ([(out,)] if ng == 1 else []), out)
    stored_q = _words_to_values(words, bits, cols)  # q + 2^(bits-1)
    zero = None
    zname = f"{base}.weight_zero_point"
    if ck.has(zname):
        if bits != 4:
            raise MoeBuildError(zname, f"{fmt} asymmetric {bits}-bit weights are not run by moe-build",
                                "symmetric int8, or int4 with zero points")
        zwords = ck.get(zname, (-(-out // 8), ng), ("I32",))
        zero = _words_to_values(zwords.T.contiguous(), 4, out).T.to(torch.uint8).contiguous()  # zp + 8
    if bits == 8:
        return _Matrix(base, (stored_q - 128).to(torch.int8), scale, None, group)
    return _Matrix(base, pack_nibbles(stored_q), scale, zero, group)


def _int8_weight(ck: _Checkpoint, base: str, out: int, cols: int, spec: MoESpec) -> _Matrix:
    """`<m>.weight` int8 [out, in] holding q itself: compressed-tensors naive/int-quantized, ModelOpt W8A16."""
    fmt, bits = "int8-stored weight", _bits(spec)
    q = ck.get(f"{base}.weight", (out, cols), ("I8",))
    sname = f"{base}.weight_scale"
    group = _group(sname, cols, _stored_groups(ck, sname), spec, fmt)
    ng = 1 if group is None else cols // group
    scale = _scale(ck, sname, [(out, ng)] + ([(out,)] if ng == 1 else []), out)
    if bits == 8:
        return _Matrix(base, q, scale, None, group)
    _int_values(f"{base}.weight", q, -8, 7, "compressed-tensors int4 (naive-quantized)")
    zero = None
    zname = f"{base}.weight_zero_point"
    if ck.has(zname):
        zp = ck.get(zname, (out, ng), ("I8",))
        _int_values(zname, zp, -8, 7, "int4 zero point")
        zero = (zp.to(torch.int16) + INT4_ZERO).to(torch.uint8)
    return _Matrix(base, pack_nibbles(q.to(torch.int16) + INT4_ZERO), scale, zero, group)


def _modelopt_int4(ck: _Checkpoint, base: str, out: int, cols: int, spec: MoESpec) -> _Matrix:
    fmt = "ModelOpt int4 AWQ"
    if out % 2:
        raise MoeBuildError(f"{base}.weight", f"{fmt} packs two output rows per byte, and {out} is odd",
                            "even output sizes")
    packed = ck.get(f"{base}.weight", (out // 2, cols), ("U8",))
    sname = f"{base}.weight_scale"
    group = _group(sname, cols, _stored_groups(ck, sname), spec, fmt)
    ng = 1 if group is None else cols // group
    scale = _scale(ck, sname, [(out, ng)], out)
    signed = unpack_nibbles(packed.T.contiguous()).T  # [out, in]: row 2r the low nibble, two's complement
    return _Matrix(base, pack_nibbles(signed ^ INT4_ZERO), scale, None, group)  # u = q + 8 = n ^ 8


def _companion(ck: _Checkpoint, name: str, shapes: Sequence[tuple[int, ...]]) -> torch.Tensor | None:
    """An optional fp32 companion (pre_quant_scale, input_scale, weight_scale_2), checked finite and > 0."""
    if not ck.has(name):
        return None
    got = ck.shape(name)
    t = ck.get(name, got if got in shapes else shapes[0], SCALE_DTYPES).to(torch.float32).reshape(shapes[0])
    if not bool((torch.isfinite(t) & (t > 0)).all()):
        raise MoeBuildError(name, "a scale must be a finite number > 0", "positive scales")
    return t


def _read_matrix(ck: _Checkpoint, base: str, out: int, cols: int, spec: MoESpec) -> _Matrix:
    """One stored expert matrix of any supported format, with its pre-quant, input and second-level scales."""
    if ck.has(f"{base}.qweight"):
        if _bits(spec) != 4:
            raise MoeBuildError(f"{base}.qweight", f"AutoAWQ GEMM int4 weights for quant={spec.quant.value}",
                                "w4a16_awq")
        m = _autoawq(ck, base, out, cols, spec)
    elif ck.has(f"{base}.weight_packed"):
        m = _ct_packed(ck, base, out, cols, spec)
    elif ck.dtype(f"{base}.weight") == "U8" and _bits(spec) == 4:
        m = _modelopt_int4(ck, base, out, cols, spec)
    elif ck.dtype(f"{base}.weight") == "I8":
        m = _int8_weight(ck, base, out, cols, spec)
    elif ck.has(f"{base}.weight"):
        raise MoeBuildError(f"{base}.weight", f"dtype {ck.dtype(f'{base}.weight')} is not a {spec.quant.value} "
                            "packing moe-build reads", _FORMATS)
    else:
        raise MoeBuildError(f"{base}.weight", f"missing: no {spec.quant.value} expert matrix under {base}", _FORMATS)
    pre = _companion(ck, f"{base}.pre_quant_scale", [(cols,), (1, cols)])
    inp = _companion(ck, f"{base}.input_scale", [(), (1,)]) if spec.quant is Quant.W4AFP8 else None
    s2 = _companion(ck, f"{base}.weight_scale_2", [(), (1,)])
    return _Matrix(m.name, m.q, m.scale, m.zero, m.group, pre, inp, s2)


def _one_vector(matrices: Sequence[_Matrix], what: str) -> torch.Tensor | None:
    """The pre-quant scale every matrix of one GEMM shares, None when none carries one; refused where they differ
    (module docstring)."""
    pres = [m.pre_quant for m in matrices]
    if all(p is None for p in pres):
        return None
    first = matrices[0]
    for m, p in zip(matrices, pres):
        if p is None:
            raise MoeBuildError(f"{m.name}.pre_quant_scale", f"missing while {first.name}.pre_quant_scale is stored",
                                f"one pre_quant_scale on every {what} matrix")
        if not torch.equal(p, pres[0]):
            raise MoeBuildError(f"{m.name}.pre_quant_scale", f"differs from {first.name}.pre_quant_scale: "
                                f"moe-build applies one AWQ pre-quant scale to the whole {what} input",
                                f"the same pre_quant_scale on every {what} matrix")
    return pres[0]


def _static_input(matrices: Sequence[_Matrix], spec: MoESpec) -> torch.Tensor | None:
    """W4AFP8 with static activations: the experts' calibrated input scales reduced to their maximum."""
    if spec.quant is not Quant.W4AFP8 or spec.act_scale is not ActScale.STATIC:
        return None
    for m in matrices:
        if m.input_scale is None:
            raise MoeBuildError(f"{m.name}.input_scale", "missing: the config says static FP8 activation scales",
                                "a calibrated input_scale beside every expert matrix")
    return torch.stack([m.input_scale for m in matrices]).max()


def _scale_2(w1_parts: Sequence[Sequence[_Matrix]], down: Sequence[_Matrix]) -> tuple[torch.Tensor | None, ...]:
    """ModelOpt W4A8-AWQ's per-matrix weight_scale_2 as [E] for W1 (gate and up must agree) and W2."""
    if all(m.scale_2 is None for m in (*down, *(m for p in w1_parts for m in p))):
        return None, None
    w1 = []
    for e, mats in enumerate(zip(*w1_parts)):
        values = [m.scale_2 for m in mats]
        for m, v in zip(mats, values):
            if v is None or not torch.equal(v, values[0]):
                raise MoeBuildError(f"{m.name}.weight_scale_2", "differs from (or is missing beside) "
                                    f"{mats[0].name}.weight_scale_2: W1 stacks gate and up under one", "equal")
        w1.append(values[0])
    for m in down:
        if m.scale_2 is None:
            raise MoeBuildError(f"{m.name}.weight_scale_2", "missing beside the other matrices'", "on every matrix")
    return torch.stack(w1), torch.stack([m.scale_2 for m in down])


def _layer_group(every: Sequence[_Matrix], cols: Sequence[int]) -> int | None:
    """One group size for the layer: a matrix with one scale column whose width is the others' group size holds
    exactly one group of it (W2 of I = 128 under group 128); per channel only where every matrix has one column."""
    grouped = {m.group for m in every if m.group is not None}
    if not grouped:
        return None
    group = grouped.pop()
    for m, c in zip(every, cols):
        if m.group is None and c != group or m.group not in (None, group):
            raise MoeBuildError(f"{m.name} scales", f"{'one scale per channel' if m.group is None else m.group} "
                                f"beside group size {group} of the other expert matrices",
                                "one group size for every expert matrix")
    return group


def woq_experts(ck: _Checkpoint, w1_parts: Sequence[Part], w2: Part, spec: MoESpec) -> WoqWeights:
    """W1 (the `w1_parts` stacked along the rows: gate then up) and W2 of every expert, per-expert matrices named
    `<m>.weight` in each Part, as canonical WoqWeights (module docstring)."""
    for part in (*w1_parts, w2):
        if len(part.shape) != 2:
            raise MoeBuildError(part.names[0], f"stacked {spec.quant.value} experts are not read; moe-build reads "
                                "weight-only quantized experts stored per expert, as their producers write them",
                                "experts.N.<proj> matrices")

    def read(part: Part) -> list[_Matrix]:
        out, cols = part.shape
        return [_read_matrix(ck, n.removesuffix(".weight"), out, cols, spec) for n in part.names]
    parts = [read(p) for p in w1_parts]
    down = read(w2)
    every = [m for p in parts for m in p] + down
    group = _layer_group(every, [p.shape[1] for p in w1_parts for _ in p.names] + [w2.shape[1]] * len(w2.names))
    zeros = [m.zero is not None for m in every]
    if any(zeros) and not all(zeros):
        odd = every[zeros.index(False)]
        raise MoeBuildError(f"{odd.name}.weight_zero_point", "missing while other experts carry zero points",
                            "zero points on every expert matrix or on none")

    def stack(mats: list[list[_Matrix]], attr: str) -> torch.Tensor:
        return torch.stack([torch.cat([getattr(m, attr) for m in row]) for row in zip(*mats)])
    s1, s2 = _scale_2(parts, down)
    return WoqWeights(
        kind=_kind(spec), group_size=group,
        w1=stack(parts, "q"), w2=torch.stack([m.q for m in down]),
        w1_scale=stack(parts, "scale"), w2_scale=torch.stack([m.scale for m in down]),
        w1_zero=stack(parts, "zero") if all(zeros) else None,
        w2_zero=torch.stack([m.zero for m in down]) if all(zeros) else None,
        fc1_act_scale=_one_vector([m for p in parts for m in p], "GEMM1"), fc2_act_scale=_one_vector(down, "GEMM2"),
        a1_scale=_static_input([m for p in parts for m in p], spec), a2_scale=_static_input(down, spec),
        w1_scale_2=s1, w2_scale_2=s2)


def mxfp4_matrix(ck: _Checkpoint, name: str, rows: int, cols: int, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GPT-OSS's `name`_blocks [E, rows, cols/32, 16] and `name`_scales [E, rows, cols/32] as canonical MXFP4:
    (uint8 [E, rows, cols/2], uint8 e8m0 [E, rows, cols/32]). The bytes are kept as stored: each holds columns 2j
    (low nibble) and 2j + 1, as transformers' convert_moe_packed_tensors reads them."""
    if cols % MXFP4_GROUP:
        raise MoeBuildError(name + "_blocks", f"{cols} columns are not whole MXFP4 blocks", "multiples of 32")
    groups = cols // MXFP4_GROUP
    blocks = ck.get(name + "_blocks", (experts, rows, groups, MXFP4_GROUP // 2), ("U8",))
    scales = ck.get(name + "_scales", (experts, rows, groups), ("U8",))
    if bool((scales == 255).any()):
        raise MoeBuildError(name + "_scales", "holds e8m0 code 255 (NaN)", "exponent codes 0..254")
    return blocks.reshape(experts, rows, cols // 2), scales




def woq_dense_weight(ck: _Checkpoint, name: str, shape: tuple[int, int], spec: MoESpec) -> torch.Tensor:
    """A weight of a dense MLP beside the experts (shared experts), which runs in the model dtype outside the expert
    kernels: stored in float it is read as it is; stored quantized (any format above) it is dequantized exactly in
    fp64, its AWQ pre-quant scale folded into its columns ((x * p) @ W^T = x @ (W * p)^T), and rounded once to the
    model dtype. Calibrated FP8 input scales are not read, since that MLP's inputs are not quantized."""
    if ck.dtype(name) in SCALE_DTYPES or (not ck.has(name.removesuffix(".weight") + ".qweight")
                                          and not ck.has(name.removesuffix(".weight") + ".weight_packed")
                                          and not ck.has(name)):
        return ck.get(name, shape)
    m = _read_matrix(ck, name.removesuffix(".weight"), *shape, spec)
    w = dequantize_matrix(_kind(spec), m.q, m.scale, m.zero)
    if m.pre_quant is not None:
        w = w * m.pre_quant.to(torch.float64)
    return w.to(TORCH_DTYPE[spec.dtype])
