"""The canonical in-memory layout of one MoE layer's weights.

Every loader (Hugging Face families, random test weights) produces this one layout and every
consumer (reference, ONNX/TensorRT graph, CUDA runner, plugin) reads it, so layout conversions
(fused gate_up, transposes, GPT-OSS interleaving) happen once, in the loader.

Layout (nn.Linear convention: [out_features, in_features]):
- router_weight [E, H]; router_bias [E] or None; correction_bias [E] or None (DeepSeek-V3)
- w1 [E, N1, H] with N1 = 2*I for gated activations: rows [0, I) are the gate, rows [I, 2I) the up projection
- b1 [E, N1] or None
- w2 [E, H, I]; b2 [E, H] or None
- weight-only quantized experts (`woq`, moe_build/weights/woq.py): w1 / w2 are its packed int4 / int8 / MXFP4
  data (the same tensors as woq.w1 / woq.w2), dequantized only by `dequantized()`
- shared_w1 [N1s, H] (gate rows then up rows), shared_w2 [H, Is], shared_gate [1, H] or None
- fp8: None, or the scales of FP8 experts (w1 / w2 then float8_e4m3fn; moe_build/weights/fp8.py). The
  router, biases and shared experts stay in the model dtype.

Two kernel-side orders exist: the sm90 gated GEMM1 epilogue wants W1 / b1 gate/up-interleaved
(`interleave_gate_up`), and the sm90 GEMMs read W1 / W2 fastest stored in 64 x 64 blocks
(`block_64x64`); the runner converts once, and a plugin engine bakes those orders.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Iterator

import torch

from ..spec import MoESpec
from .blocks import BLOCK, blocks_fit
from .fp8 import FP8_DTYPE, Fp8Scales, ScaleGranularity, quantize_weight
from .woq import MXFP4_GROUP, QUANT_KIND, WoqKind, WoqWeights, quantize_matrix


def interleave_gate_up(w1: torch.Tensor) -> torch.Tensor:
    """W1 [E, 2I, H] (or b1 [E, 2I]) stacked [gate; up] -> blocks of 16 rows, gate features 8b..8b+7
    then their up projections: the order in which the sm90 gated epilogue finds a feature's gate and
    up columns in the same thread's accumulators (cpp/src/gemm/mma.cuh, gated_row)."""
    e, n2 = w1.shape[0], w1.shape[1]
    if n2 % 16:
        raise ValueError(f"W1: the gated epilogue interleaves blocks of 8 features, so 2I must be a multiple of 16, "
                         f"got {n2}")
    rest = tuple(w1.shape[2:])
    return w1.reshape(e, 2, n2 // 16, 8, *rest).transpose(1, 2).reshape(e, n2, *rest).contiguous()


def block_64x64(w: torch.Tensor) -> torch.Tensor:
    """W [E, n, k] (each expert's rows row-major) -> the same shape with its storage in 64 x 64 blocks:
    the stacked [E * n, k] rows cut into 64-row, 64-column blocks, each block row-major and contiguous,
    blocks ordered row block by row block, so element (r, c) sits at
    ((r // 64) * (k // 64) + c // 64) * 4096 + (r % 64) * 64 + c % 64. Why: an sm90 wgmma tile then
    loads its weight tile as a few contiguous 8 KB runs instead of 128-byte pieces of 64-256 rows
    (README, "Weights in 64 x 64 blocks"). The shape is kept so that every shape check still applies;
    only the sm90 GEMMs, told so (kernels.WeightLayout.BLOCKED64), read it."""
    e, n, k = w.shape
    if not blocks_fit(n, k):
        raise ValueError(f"W: 64 x 64 blocks need rows and columns that are multiples of {BLOCK}, got {n} x {k}")
    return (w.reshape(e * n // BLOCK, BLOCK, k // BLOCK, BLOCK).transpose(1, 2).contiguous().reshape(e, n, k))


@dataclass
class MoEWeights:
    router_weight: torch.Tensor
    w1: torch.Tensor
    w2: torch.Tensor
    router_bias: torch.Tensor | None = None
    correction_bias: torch.Tensor | None = None
    b1: torch.Tensor | None = None
    b2: torch.Tensor | None = None
    shared_w1: torch.Tensor | None = None
    shared_w2: torch.Tensor | None = None
    shared_gate: torch.Tensor | None = None
    fp8: Fp8Scales | None = None
    # weight-only quantized experts (woq.py): w1 / w2 above are then the same packed tensors as woq.w1 / woq.w2
    woq: WoqWeights | None = None

    def named(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor, FP8 scales included (as fp8.w1_scale, ...), weight-only scales as woq.w1_scale, ..."""
        for f in fields(self):
            t = getattr(self, f.name)
            if isinstance(t, torch.Tensor):
                yield f.name, t
        if self.fp8 is not None:
            for name in ("w1_scale", "w2_scale", "a1_scale", "a2_scale"):
                t = getattr(self.fp8, name)
                if t is not None:
                    yield f"fp8.{name}", t
        if self.woq is not None:
            yield from ((f"woq.{n}", t) for n, t in self.woq.named() if n not in ("w1", "w2"))

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> "MoEWeights":
        """Copy to a device/dtype; routing-selection tensors (correction bias) keep fp32 or wider, FP8
        expert weights stay FP8 and their scales fp32, weight-only quantized ones keep every stored dtype."""
        out: dict[str, object] = {}
        woq = None if self.woq is None else self.woq.map(lambda t: t.to(device=device))
        for f in fields(self):
            t = getattr(self, f.name)
            if not isinstance(t, torch.Tensor) or (woq is not None and f.name in ("w1", "w2")):
                continue
            keep = f.name == "correction_bias" and dtype is not None and dtype != torch.float64
            fp8 = t.dtype == FP8_DTYPE
            out[f.name] = t.to(device=device, dtype=None if fp8 else torch.float32 if keep else dtype)
        if woq is not None:
            out.update(w1=woq.w1, w2=woq.w2)
        return MoEWeights(**out, fp8=None if self.fp8 is None else self.fp8.to(device), woq=woq)

    def contiguous(self) -> "MoEWeights":
        """These weights with every tensor (FP8 scales included) contiguous."""
        out = {f.name: getattr(self, f.name).contiguous() for f in fields(self)
               if isinstance(getattr(self, f.name), torch.Tensor)}
        fp8 = self.fp8
        if fp8 is not None:
            fp8 = replace(fp8, **{n: None if getattr(fp8, n) is None else getattr(fp8, n).contiguous()
                                  for n in ("w1_scale", "w2_scale", "a1_scale", "a2_scale")})
        woq = None if self.woq is None else self.woq.map(torch.Tensor.contiguous)
        if woq is not None:
            out.update(w1=woq.w1, w2=woq.w2)
        return replace(self, **out, fp8=fp8, woq=woq)

    def fp8_channel_scales(self) -> "MoEWeights":
        """FP8 weights whose per-tensor scales are repeated per output row (CHANNEL granularity, the same
        dequantized weights): what the FP8 GEMM's rowwise mode reads. Other scales are kept."""
        f = self.fp8
        if f is None or f.granularity is not ScaleGranularity.TENSOR:
            return self
        e, n1, n2 = self.w1.shape[0], self.w1.shape[1], self.w2.shape[1]
        return replace(self, fp8=replace(f, granularity=ScaleGranularity.CHANNEL,
                                         w1_scale=f.w1_scale.reshape(e, 1).expand(e, n1).contiguous(),
                                         w2_scale=f.w2_scale.reshape(e, 1).expand(e, n2).contiguous()))

    def dequantized(self, dtype: torch.dtype = torch.float64,
                    device: torch.device | str | None = None) -> "MoEWeights":
        """These weights on `device` in `dtype`, FP8 experts dequantized (for references and peers, never for a
        runner): each e4m3 value times its fp32 scale, exact in fp64, rounded once to `dtype`; one expert at a
        time, so no float copy of every expert exists beside the result (DeepSeek-V3's would be tens of GB)."""
        base = self.to(device, dtype)  # FP8 and weight-only quantized W1 / W2 move as they are
        if base.woq is not None:
            return replace(base, woq=None, w1=base.woq.dense("w1", dtype), w2=base.woq.dense("w2", dtype))
        f = base.fp8
        if f is None:
            return base
        from .fp8 import dequantize_weight

        def one_by_one(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            out = torch.empty(q.shape, dtype=dtype, device=q.device)
            for e in range(q.shape[0]):
                out[e:e + 1] = dequantize_weight(q[e:e + 1], scale[e:e + 1], f.granularity, torch.float64)
            return out

        return replace(base, fp8=None, w1=one_by_one(base.w1, f.w1_scale), w2=one_by_one(base.w2, f.w2_scale))

    def for_spec(self, spec: MoESpec) -> "MoEWeights":
        """A checkpoint's weights as `spec`, the checkpoint's spec with the user's overrides, takes them, checked
        against it. Where the spec's quant is none over FP8 or weight-only experts (`--quant none`: an OOTB engine
        of a quantized checkpoint, which OOTB cannot run quantized) the experts are dequantized exactly and rounded
        once to the spec's dtype (AWQ pre-quant scales folded into the weights they scale the input of), the other
        tensors kept as stored; any other mismatch is the check's refusal."""
        from ..spec import Quant
        from .dtypes import TORCH_DTYPE
        weights, dtype = self, TORCH_DTYPE[spec.dtype]
        if spec.quant is Quant.NONE and self.woq is not None:
            weights = replace(self, woq=None, w1=self.woq.dense("w1", dtype, fold_prequant=True),
                              w2=self.woq.dense("w2", dtype, fold_prequant=True))
        elif spec.quant is Quant.NONE and self.fp8 is not None:
            dense = self.dequantized(dtype)
            weights = replace(self, fp8=None, w1=dense.w1, w2=dense.w2)
        weights.check(spec)
        return weights

    def quantized_fp8(self, granularity: ScaleGranularity, static: bool = False,
                      a1_scale: float = 1.0, a2_scale: float = 1.0) -> "MoEWeights":
        """These float weights with W1 / W2 quantized to FP8 of `granularity` (amax / 448 scales): random
        FP8 layers for tests and benchmarks. static: also give calibrated activation scales."""
        w1, s1 = quantize_weight(self.w1, granularity)
        w2, s2 = quantize_weight(self.w2, granularity)
        a1 = torch.tensor(a1_scale, dtype=torch.float32, device=s1.device) if static else None
        a2 = torch.tensor(a2_scale, dtype=torch.float32, device=s1.device) if static else None
        return replace(self, w1=w1, w2=w2, fp8=Fp8Scales(granularity, s1, s2, a1, a2))

    def quantized_woq(self, kind: WoqKind, group_size: int | None, asymmetric: bool = False,
                      awq: bool = False, seed: int = 0) -> "MoEWeights":
        """These float weights with W1 / W2 quantized weight-only (woq.quantize_matrix): random weight-only layers
        for tests and benchmarks. awq: also random AWQ pre-quant scales in [0.5, 2) for both GEMM inputs."""
        q1, s1, z1 = quantize_matrix(kind, self.w1, group_size, asymmetric)
        q2, s2, z2 = quantize_matrix(kind, self.w2, group_size, asymmetric)
        pre = {}
        if awq:
            g = torch.Generator().manual_seed(seed)
            pre = {name: (0.5 + 1.5 * torch.rand(n, generator=g)).to(self.w1.device)
                   for name, n in (("fc1_act_scale", self.w1.shape[-1]), ("fc2_act_scale", self.w2.shape[-1]))}
        group = MXFP4_GROUP if kind is WoqKind.MXFP4 else group_size
        woq = WoqWeights(kind, group, q1, q2, s1, s2, z1, z2, **pre)
        return replace(self, w1=q1, w2=q2, woq=woq)

    def for_rank(self, spec: MoESpec, rank: int) -> "MoEWeights":
        """The weights rank `rank` of `spec`'s expert-parallel group holds: its experts' W1 / b1 / W2 / b2 (and
        FP8 weight scales), the router and shared experts whole (every rank routes and runs the shared experts
        for its own tokens). Views, not copies."""
        n, first = spec.local_experts, rank * spec.local_experts
        mine = slice(first, first + n)

        def cut(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[mine]

        fp8 = None if self.fp8 is None else replace(self.fp8, w1_scale=self.fp8.w1_scale[mine],
                                                     w2_scale=self.fp8.w2_scale[mine])
        woq = None if self.woq is None else self.woq.experts_slice(mine)
        w1, w2 = (self.w1[mine], self.w2[mine]) if woq is None else (woq.w1, woq.w2)
        return replace(self, w1=w1, w2=w2, b1=cut(self.b1), b2=cut(self.b2), fp8=fp8, woq=woq)

    def gate_up_interleaved(self) -> "MoEWeights":
        """These weights with W1 / b1 in `interleave_gate_up`'s order (the sm90 gated epilogue's); FP8 W1's
        per-column scales (CHANNEL: fp8_channel_scales first) in the same order, as the epilogue reads one per
        column, and weight-only W1's codes, scales and zero points, whose rows are W1's (the packed codes run along
        the input). Block-128 scales cover 128 rows that the interleave splits: refused."""
        f = self.fp8
        if f is not None and f.granularity is not ScaleGranularity.CHANNEL:
            raise ValueError(f"W1's {f.granularity.value} FP8 scales: the gate/up interleave needs one scale per "
                             "row (fp8_channel_scales first; block-128 scales cannot follow it)")
        w1 = self.w1
        if w1.dtype == FP8_DTYPE:  # moved as bytes: the same values, any torch's copy kernels
            w1 = interleave_gate_up(w1.view(torch.uint8)).view(FP8_DTYPE)
        else:
            w1 = interleave_gate_up(w1)
        q = self.woq
        if q is not None:  # w1 is the same tensor as woq.w1
            q = replace(q, w1=w1, w1_scale=interleave_gate_up(q.w1_scale),
                        w1_zero=None if q.w1_zero is None else interleave_gate_up(q.w1_zero))
        return replace(self, w1=w1, b1=None if self.b1 is None else interleave_gate_up(self.b1),
                       fp8=None if f is None else replace(f, w1_scale=interleave_gate_up(f.w1_scale)), woq=q)

    def int4_tiled(self) -> "MoEWeights":
        """These weights with the weight-only W1 / W2's int4 codes in 16-row tiles (WoqWeights.as_int4_tiles; w1 / w2
        are the same tensors as woq.w1 / woq.w2)."""
        q = self.woq.as_int4_tiles()
        return replace(self, w1=q.w1, w2=q.w2, woq=q)

    def blocked_64x64(self) -> "MoEWeights":
        """These weights with W1 and W2 stored in `block_64x64`'s layout (the sm90 GEMMs' fastest)."""
        return replace(self, w1=block_64x64(self.w1), w2=block_64x64(self.w2))

    def check(self, spec: MoESpec) -> None:
        """Raise MoeBuildError naming the first tensor whose shape does not fit `spec`."""
        from ..errors import MoeBuildError
        E, H, I = spec.num_experts, spec.hidden_size, spec.intermediate_size
        S = spec.stored_experts  # one rank's experts (ep_rank set), else all
        n1 = spec.fc1_out_features
        want: dict[str, tuple[int, ...] | None] = {
            "router_weight": (E, H), "w1": (S, n1, H), "w2": (S, H, I),
            "router_bias": (E,) if spec.routing.router_bias else None,
            "correction_bias": (E,) if spec.routing.correction_bias else None,
            "b1": (S, n1) if spec.expert_bias else None, "b2": (S, H) if spec.expert_bias else None,
        }
        if spec.shared.count:
            si = spec.shared.intermediate_size
            want.update(shared_w1=(si * (2 if spec.activation.is_gated else 1), H), shared_w2=(H, si),
                        shared_gate=(1, H) if spec.shared.sigmoid_gate else None)
        else:
            want.update(shared_w1=None, shared_w2=None, shared_gate=None)
        self._check_fp8(spec)
        self._check_woq(spec)
        if self.woq is not None:  # W1 / W2 are the packed data, checked by _check_woq
            want.pop("w1"), want.pop("w2")
        for name, shape in want.items():
            t = getattr(self, name)
            if shape is None and t is not None:
                raise MoeBuildError(name, "present but the spec does not use it", "absent")
            if shape is not None and (t is None or tuple(t.shape) != shape):
                got = None if t is None else tuple(t.shape)
                raise MoeBuildError(name, f"shape {got} does not match the spec", f"shape {shape}")

    def _check_woq(self, spec: MoESpec) -> None:
        """Weight-only quantized experts present exactly where the spec's quant says so, of its kind, shapes and
        scales (woq.py's contract; WoqWeights validated its own consistency when it was made)."""
        from ..errors import MoeBuildError
        from ..spec import ActScale, Quant
        q = self.woq
        if q is None:
            if spec.quant in QUANT_KIND:
                raise MoeBuildError("w1", f"quant={spec.quant.value} needs weight-only quantized expert weights",
                                    f"{QUANT_KIND[spec.quant].value} W1 / W2 with their scales (moe_build/weights/woq.py)")
            return
        if QUANT_KIND.get(spec.quant) is not q.kind:
            raise MoeBuildError("quant", f"{q.kind.value} expert weights given for quant={spec.quant.value}",
                                [k.value for k, v in QUANT_KIND.items() if v is q.kind])
        if self.w1 is not q.w1 or self.w2 is not q.w2:
            raise MoeBuildError("w1", "W1 / W2 are not the weight-only quantized data woq holds", "woq.w1 / woq.w2")
        grouped = q.kind is not WoqKind.INT8 and q.group_size is not None
        if grouped and q.group_size != spec.quant_group_size:
            raise MoeBuildError("quant_group_size", f"{spec.quant_group_size} but the weights are quantized in groups "
                                f"of {q.group_size}", str(q.group_size))
        what = {"quant_zero_points": "int4 zero points", "quant_per_channel": "one scale per output channel",
                "quant_prequant_scales": "AWQ pre-quant scales"}
        for name, has in q.storage_flags().items():
            if getattr(spec, name) != has:
                raise MoeBuildError(name, f"{getattr(spec, name)} but the weights {'have' if has else 'have no'} "
                                    f"{what[name]}", "true" if has else "false")
        static = spec.quant is Quant.W4AFP8 and spec.act_scale is ActScale.STATIC
        if (q.a1_scale is not None) != static:
            raise MoeBuildError("act_scale", f"quant={spec.quant.value} act_scale={spec.act_scale.value} but the "
                                f"weights carry {'static FP8 input' if q.a1_scale is not None else 'no input'} "
                                "scales", "a1_scale / a2_scale exactly for w4afp8 with static activations")
        if q.fc1_act_scale is not None and not spec.quant.has_act_prequant_scales:
            raise MoeBuildError("woq.fc1_act_scale", f"AWQ pre-quant scales given for quant={spec.quant.value}",
                                "w4a16_awq, w4afp8")
        n1, H, I, E = spec.fc1_out_features, spec.hidden_size, spec.intermediate_size, spec.stored_experts
        for name, shape in q.expected_shapes(E, n1, H, I).items():
            t = getattr(q, name)
            if t is not None and tuple(t.shape) != shape:
                raise MoeBuildError(f"woq.{name}", f"shape {tuple(t.shape)} does not match the spec", f"shape {shape}")

    def _check_fp8(self, spec: MoESpec) -> None:
        from ..errors import MoeBuildError
        from ..spec import ActScale, Quant
        fp8_spec = spec.quant in (Quant.FP8, Quant.FP8_BLOCK)
        if self.fp8 is None:
            if fp8_spec:
                raise MoeBuildError("w1", f"quant={spec.quant.value} needs FP8 expert weights with scales",
                                    "float8_e4m3fn W1 / W2 and their scales")
            return
        if not fp8_spec:
            raise MoeBuildError("quant", f"FP8 expert weights given for quant={spec.quant.value}", "fp8, fp8_block")
        f = self.fp8
        block = f.granularity is ScaleGranularity.BLOCK128
        if block != (spec.quant is Quant.FP8_BLOCK):
            raise MoeBuildError("quant", f"{spec.quant.value} with {f.granularity.value} weight scales",
                                "fp8_block with block128 scales, fp8 with tensor or channel scales")
        if f.static != (spec.act_scale is ActScale.STATIC) or (f.a1_scale is None) != (f.a2_scale is None):
            raise MoeBuildError("act_scale", f"{spec.act_scale.value} but the weights carry "
                                f"{'static' if f.static else 'no'} activation scales", "a1_scale and a2_scale "
                                "for static, neither for dynamic")
        for name in ("w1", "w2"):
            t = getattr(self, name)
            if t.dtype != FP8_DTYPE:
                raise MoeBuildError(name, f"dtype {t.dtype} with FP8 scales", "float8_e4m3fn")
        n1, H, I, E = spec.fc1_out_features, spec.hidden_size, spec.intermediate_size, spec.stored_experts
        for name, shape in f.expected_shapes(E, n1, H, I).items():
            got = tuple(getattr(f, name).shape)
            if got != shape:
                raise MoeBuildError(name, f"shape {got} does not match {f.granularity.value} scales of the spec",
                                    f"shape {shape}")
        for name in ("a1_scale", "a2_scale"):
            t = getattr(f, name)
            if t is not None and (t.numel() != 1 or not bool(torch.isfinite(t).all()) or not bool((t > 0).all())):
                raise MoeBuildError(name, "a static activation scale must be one finite number > 0",
                                    "a positive fp32 scalar")

    @classmethod
    def random(cls, spec: MoESpec, seed: int = 0, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu", scale: float = 1.0) -> "MoEWeights":
        """Random weights with unit-variance activations through the layer (fan-in scaling)."""
        g = torch.Generator(device="cpu").manual_seed(seed)
        E, H, I = spec.num_experts, spec.hidden_size, spec.intermediate_size
        n1 = spec.fc1_out_features

        def rnd(*shape: int, fan_in: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=g, dtype=torch.float32) * (scale / fan_in ** 0.5)).to(device, dtype)

        w = cls(router_weight=rnd(E, H, fan_in=H), w1=rnd(E, n1, H, fan_in=H), w2=rnd(E, H, I, fan_in=I))
        if spec.routing.router_bias:
            w.router_bias = rnd(E, fan_in=1) * 0.1
        if spec.routing.correction_bias:
            w.correction_bias = (torch.randn(E, generator=g) * 0.1).to(device, torch.float32)
        if spec.expert_bias:
            w.b1, w.b2 = rnd(E, n1, fan_in=16), rnd(E, H, fan_in=16)
        if spec.shared.count:
            si = spec.shared.intermediate_size
            w.shared_w1 = rnd(si * (2 if spec.activation.is_gated else 1), H, fan_in=H)
            w.shared_w2 = rnd(H, si, fan_in=si)
            if spec.shared.sigmoid_gate:
                w.shared_gate = rnd(1, H, fan_in=H)
        return w

