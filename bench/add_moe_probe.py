"""Probe which IMoELayer (network.add_moe) configurations TensorRT-RTX builds on this machine.

Why: the layer's constraints are undocumented for TensorRT-RTX; each configuration is built in a
fresh subprocess (a failed build can abort the process) and the outcome recorded verbatim.
Usage: python bench/add_moe_probe.py [--json out.json]
"""
from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import sys
from typing import Any

K = 2


def _build(cfg: dict[str, Any], queue: "mp.Queue[dict[str, Any]]") -> None:
    import numpy as np
    import tensorrt_rtx_bindings as trt

    E, H, I = (8, 1024, 2048) if cfg.get("big") else (4, 128, 256)
    tok = (16, 16, 16) if cfg.get("static") else (1, 8, 64)

    errors: list[str] = []

    class Log(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: "trt.ILogger.Severity", msg: str) -> None:
            if severity <= trt.ILogger.Severity.WARNING:
                errors.append(msg)

    log = Log()
    builder = trt.Builder(log)
    net = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    act = {"fp16": trt.float16, "bf16": trt.bfloat16, "fp32": trt.float32}[cfg["dtype"]]
    np_act = np.float16 if cfg["dtype"] == "fp16" else np.float32
    t = 16 if cfg.get("static") else -1
    hidden = net.add_input("hidden", act, (1, t, H) if cfg["rank3"] else (t, H))
    ids = net.add_input("ids", trt.int32 if cfg["ids"] == "int32" else trt.int64,
                        (1, t, K) if cfg["rank3"] else (t, K))
    scores = net.add_input("scores", trt.float32 if cfg.get("scores_fp32") else act,
                           (1, t, K) if cfg["rank3"] else (t, K))
    gu_shape, d_shape = ((E, H, I), (E, I, H)) if cfg["layout"] == "EHI" else ((E, I, H), (E, H, I))
    keep: list[Any] = []  # numpy buffers must outlive the build (trt.Weights does not copy)

    def weight(shape: tuple[int, ...]) -> Any:
        if cfg.get("weights_input"):
            return net.add_input(f"w{net.num_inputs}", act, shape)
        data = (np.random.randn(*shape) * 0.05).astype(np.float32)
        keep.append(data)
        if cfg["weights"] == "plain":
            if cfg["dtype"] == "bf16":
                c = net.add_constant(shape, trt.Weights(data))
                return net.add_cast(c.get_output(0), act).get_output(0)
            data = data.astype(np_act)
            keep.append(data)
            return net.add_constant(shape, trt.Weights(data)).get_output(0)
        # quantized weights: fp32 constant -> Q (fp8/fp4) -> DQ to the activation type
        c = net.add_constant(shape, trt.Weights(data)).get_output(0)
        to = trt.fp8 if cfg["weights"] == "fp8_qdq" else trt.fp4
        scale_np = np.array(0.01 if to == trt.fp8 else 0.1, dtype=np.float32)
        if to == trt.fp4:
            scale_np = np.full(shape[:-1] + (shape[-1] // 16,), 0.1, dtype=np.float32)
        keep.append(scale_np)
        scale = net.add_constant(scale_np.shape, trt.Weights(scale_np)).get_output(0)
        q = net.add_quantize(c, scale, to)
        if to == trt.fp4:
            q.block_shape = trt.Dims([1] * (len(shape) - 1) + [16])
        dq = net.add_dequantize(q.get_output(0), scale, act)
        if to == trt.fp4:
            dq.block_shape = trt.Dims([1] * (len(shape) - 1) + [16])
        return dq.get_output(0)

    moe = net.add_moe(hidden, ids, scores)
    moe.set_gated_weights(weight(gu_shape), weight(gu_shape), weight(d_shape),
                          trt.MoEActType.SILU if cfg["act"] == "silu" else trt.MoEActType.NONE)
    if cfg["swiglu"]:
        moe.set_swiglu_params(7.0, 1.702, 1.0)
    if cfg["static_q"]:
        s = np.array(1.0, dtype=np.float32)
        keep.append(s)
        moe.set_quantization_static(net.add_constant((), trt.Weights(s)).get_output(0), trt.fp8)
    net.mark_output(moe.get_output(0))
    config = builder.create_builder_config()
    config.num_compute_capabilities = 1
    config.set_compute_capability(getattr(trt.ComputeCapability, cfg["sm"]), 0)
    profile = builder.create_optimization_profile()
    if not cfg.get("static"):
        for name, last in (("hidden", H), ("ids", K), ("scores", K)):
            lead = (1,) if cfg["rank3"] else ()
            profile.set_shape(name, lead + (tok[0], last), lead + (tok[1], last), lead + (tok[2], last))
        config.add_optimization_profile(profile)
    try:
        engine = builder.build_serialized_network(net, config)
    except Exception as exc:  # noqa: BLE001 - the probe records whatever the builder raises
        errors.append(f"exception: {exc}")
        engine = None
    queue.put({"ok": engine is not None, "bytes": 0 if engine is None else engine.nbytes,
               "errors": [e for e in errors if "ERROR" in e.upper() or "error" in e.lower()][:4] or errors[:4]})


def probe(cfg: dict[str, Any]) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q: "mp.Queue[dict[str, Any]]" = ctx.Queue()
    p = ctx.Process(target=_build, args=(cfg, q))
    p.start()
    p.join(120)
    if p.is_alive():
        p.kill()
        return {**cfg, "ok": False, "errors": ["timeout"]}
    if q.empty():
        return {**cfg, "ok": False, "errors": [f"process died with exit code {p.exitcode}"]}
    return {**cfg, **q.get()}


def configs_round2() -> list[dict[str, Any]]:
    """Second round: shapes/typing variations of the documented (E,H,I)/(E,I,H) layout."""
    base = dict(layout="EHI", dtype="fp16", weights="plain", sm="SM89", rank3=True, ids="int32", act="silu",
                swiglu=False, static_q=False)
    out = []
    for sm in ("SM89", "SM120"):
        out += [{**base, "sm": sm, "static": True}, {**base, "sm": sm, "scores_fp32": True},
                {**base, "sm": sm, "weights_input": True}, {**base, "sm": sm, "big": True},
                {**base, "sm": sm, "big": True, "static": True, "weights": "fp8_qdq", "static_q": True},
                {**base, "sm": sm, "dtype": "bf16", "big": True, "scores_fp32": True, "static": True}]
    return out


def configs() -> list[dict[str, Any]]:
    base = dict(layout="EHI", dtype="fp16", weights="plain", sm="SM89", rank3=True, ids="int32", act="silu",
                swiglu=False, static_q=False)
    variants: list[dict[str, Any]] = []
    for layout, dtype, sm in itertools.product(("EHI", "EIH"), ("fp16", "bf16", "fp32"), ("SM89", "SM120")):
        variants.append({**base, "layout": layout, "dtype": dtype, "sm": sm})
    for weights, sm in itertools.product(("fp8_qdq", "fp4_qdq"), ("SM89", "SM120")):
        variants.append({**base, "weights": weights, "sm": sm})
        variants.append({**base, "weights": weights, "sm": sm, "static_q": True})
    variants += [{**base, "static_q": True}, {**base, "static_q": True, "sm": "SM120"},
                 {**base, "swiglu": True}, {**base, "act": "none"}, {**base, "ids": "int64"},
                 {**base, "rank3": False}, {**base, "sm": "SM80"}, {**base, "sm": "SM86"}, {**base, "sm": "SM121"},
                 {**base, "sm": "SM75"}]
    return variants


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--round", type=int, default=1, choices=(1, 2))
    args = ap.parse_args()
    results = []
    for cfg in (configs() if args.round == 1 else configs_round2()):
        r = probe(cfg)
        results.append(r)
        print(json.dumps(r), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print(f"built: {sum(r['ok'] for r in results)}/{len(results)}", file=sys.stderr)


if __name__ == "__main__":
    main()
