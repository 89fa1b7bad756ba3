"""The canonical in-memory layout of one MoE layer's weights.

Every loader (Hugging Face families, random test weights) produces this one layout and every
consumer (reference, ONNX/TensorRT graph, CUDA runner, plugin) reads it, so layout conversions
(fused gate_up, transposes, GPT-OSS interleaving) happen once, in the loader.

Layout (nn.Linear convention: [out_features, in_features]):
- router_weight [E, H]; router_bias [E] or None; correction_bias [E] or None (DeepSeek-V3)
- w1 [E, N1, H] with N1 = 2*I for gated activations: rows [0, I) are the gate, rows [I, 2I) the up projection
- b1 [E, N1] or None
- w2 [E, H, I]; b2 [E, H] or None
- shared_w1 [N1s, H] (gate rows then up rows), shared_w2 [H, Is], shared_gate [1, H] or None

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

    def named(self) -> Iterator[tuple[str, torch.Tensor]]:
        for f in fields(self):
            t = getattr(self, f.name)
            if t is not None:
                yield f.name, t

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> "MoEWeights":
        """Copy to a device/dtype; routing-selection tensors (correction bias) keep fp32 or wider."""
        out = {}
        for name, t in self.named():
            keep = name == "correction_bias" and dtype is not None and dtype != torch.float64
            out[name] = t.to(device=device, dtype=torch.float32 if keep else dtype)
        return MoEWeights(**out)

    def gate_up_interleaved(self) -> "MoEWeights":
        """These weights with W1 / b1 in `interleave_gate_up`'s order (the sm90 gated epilogue's)."""
        return replace(self, w1=interleave_gate_up(self.w1),
                       b1=None if self.b1 is None else interleave_gate_up(self.b1))

    def blocked_64x64(self) -> "MoEWeights":
        """These weights with W1 and W2 stored in `block_64x64`'s layout (the sm90 GEMMs' fastest)."""
        return replace(self, w1=block_64x64(self.w1), w2=block_64x64(self.w2))

    def check(self, spec: MoESpec) -> None:
        """Raise MoeBuildError naming the first tensor whose shape does not fit `spec`."""
        from ..errors import MoeBuildError
        E, H, I = spec.num_experts, spec.hidden_size, spec.intermediate_size
        n1 = spec.fc1_out_features
        want: dict[str, tuple[int, ...] | None] = {
            "router_weight": (E, H), "w1": (E, n1, H), "w2": (E, H, I),
            "router_bias": (E,) if spec.routing.router_bias else None,
            "correction_bias": (E,) if spec.routing.correction_bias else None,
            "b1": (E, n1) if spec.expert_bias else None, "b2": (E, H) if spec.expert_bias else None,
        }
        if spec.shared.count:
            si = spec.shared.intermediate_size
            want.update(shared_w1=(si * (2 if spec.activation.is_gated else 1), H), shared_w2=(H, si),
                        shared_gate=(1, H) if spec.shared.sigmoid_gate else None)
        else:
            want.update(shared_w1=None, shared_w2=None, shared_gate=None)
        for name, shape in want.items():
            t = getattr(self, name)
            if shape is None and t is not None:
                raise MoeBuildError(name, "present but the spec does not use it", "absent")
            if shape is not None and (t is None or tuple(t.shape) != shape):
                got = None if t is None else tuple(t.shape)
                raise MoeBuildError(name, f"shape {got} does not match the spec", f"shape {shape}")

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
