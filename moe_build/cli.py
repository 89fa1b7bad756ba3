"""The `moe-build` command line: thin click wrappers over spec_source -> target -> planner -> ...

Errors in user input surface as one line on stderr and exit code 2 (1 for a failed verification).
"""
from __future__ import annotations

import json
import sys
from typing import Any, Callable

import click
from rich.console import Console

from .errors import MoeBuildError, VerificationError
from .target import GPU_PARTS

# Pipes and CI logs get a wide table instead of rich's 80-column default.
STDOUT = Console(width=None if sys.stdout.isatty() else 160)


def layer_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options that describe the layer: a preset or flags (a checkpoint argument is per command)."""
    options = [
        click.option("--preset", help="Named layer preset (see `moe-build presets`)."),
        click.option("--hidden", type=int, help="Hidden size."),
        click.option("--inter", type=int, help="Expert intermediate size."),
        click.option("--experts", type=int, help="Number of experts."),
        click.option("--top-k", "top_k", type=int, help="Experts per token."),
        click.option("--activation", help="swiglu|geglu|silu|gelu|relu|identity|swiglu_clamp"),
        click.option("--dtype", help="fp32|fp16|bf16"),
        click.option("--quant", help="none|fp8|fp8_block|w8a16|w4a16_awq|w4afp8|nvfp4|wfp4a16"),
        click.option("--output-dtype", "output_dtype", help="Layer output dtype (default: --dtype)."),
        click.option("--fp8-input", "fp8_input", is_flag=True, help="W4AFP8: activations arrive in FP8."),
        click.option("--group-size", "group_size", type=int,
                     help="Group-wise quant: input columns per weight scale (a checkpoint's config sets it)."),
        click.option("--zero-points", "zero_points", is_flag=True,
                     help="w4a16_awq / w4afp8: int4 weights with zero points (AutoAWQ, asymmetric)."),
        click.option("--per-channel", "per_channel", is_flag=True,
                     help="w8a16 / w4a16_awq: one weight scale per output channel."),
        click.option("--prequant-scales", "prequant_scales", is_flag=True,
                     help="w4a16_awq / w4afp8: AWQ pre-quant scales stored (ModelOpt's pre_quant_scale)."),
        click.option("--act-scale", "act_scale",
                     help="fp8 / w4afp8: static (a calibrated scale per GEMM input, ModelOpt's input_scale) or "
                          "dynamic (per row at run time) activation scales (a checkpoint's config sets it)."),
        click.option("--lora", is_flag=True, help="The layer carries LoRA adapters."),
        click.option("--ep-size", "ep_size", type=int, help="Expert parallelism: ranks the experts are split over."),
        click.option("--ep-rank", "ep_rank", type=int, help="Build only this rank (default: every rank)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def target_options(f: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--sm", type=int, help="Target SM: 80|86|89|90|100|103|120|121 (default: local GPU, else 89)."),
        click.option("--gpu", help="Target GPU part, for its SM, multiprocessors, L2 and memory rate (the GEMM "
                     f"tactics read them): {'|'.join(GPU_PARTS)} (default: the local GPU, else the SM's default "
                     "part)."),
        click.option("--flavour", help="tensorrt|tensorrt-rtx (default: the installed one)."),
        click.option("--moe-plugin", "moe_plugin", default="auto", show_default=True, help="auto|disable"),
        click.option("--deterministic", is_flag=True, help="Deterministic kernels (fixed reduction order)."),
        click.option("--force", "force", multiple=True, metavar="STAGE=CHOICE",
                     help="Pin a stage's choice (repeatable); refused where its gates fail."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _split_layer_target(kw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    layer_keys = ("preset", "hidden", "inter", "experts", "top_k", "activation", "dtype", "quant", "output_dtype",
                  "fp8_input", "group_size", "zero_points", "per_channel", "prequant_scales", "act_scale", "lora",
                  "ep_size", "ep_rank")
    layer = {k: kw.pop(k) for k in layer_keys}
    target = {k: kw.pop(k) for k in ("sm", "gpu", "flavour", "moe_plugin", "deterministic")}
    from .planner import parse_force
    return layer, target, parse_force(kw.pop("force"))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="moe-build")
def cli() -> None:
    """Build fused Mixture-of-Experts TensorRT engines, and explain every fusion decision."""


@cli.command("fusion-report")
@click.argument("checkpoint", required=False, type=click.Path())
@layer_options
@target_options
@click.option("--tokens", type=int, default=1, show_default=True,
              help="Token count the table shows each stage's choice at (the bands cover every count).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report (schema moe-build.fusion-report/10).")
@click.option("--markdown", is_flag=True, help="Markdown report.")
@click.option("--sweep", is_flag=True, help="The matrix across SMs x dtypes x quant modes for this layer (only the "
              "ones given, where --sm, --dtype or --quant is).")
@click.option("--explain", "explain_stage", metavar="STAGE", help="Every gate of one stage (or 'path') and why.")
def fusion_report(checkpoint: str | None, tokens: int, as_json: bool, markdown: bool, sweep: bool,
                  explain_stage: str | None, **kw: Any) -> None:
    """Print the build plan: path (plugin or OOTB) and each fusion stage with the gates that decided it."""
    from .planner import make_plan, report
    from .spec import DType, Quant
    from .spec.source import resolve_spec
    from .target import MAX_TOKENS, SUPPORTED_SMS, resolve_target

    _one_output(json=as_json, markdown=markdown, explain=explain_stage is not None, sweep=sweep,
                allowed_pairs={("json", "sweep")})
    layer, target_kw, force = _split_layer_target(kw)
    if not 1 <= tokens <= MAX_TOKENS:
        raise MoeBuildError("tokens", f"must be from 1 to {MAX_TOKENS}, got {tokens}", f"1..{MAX_TOKENS}")
    spec = resolve_spec(checkpoint, **layer)
    target = resolve_target(**target_kw)
    if sweep:
        if force:
            raise MoeBuildError("force", "--sweep plans every cell without forced stages", "--force or --sweep")
        cells = report.sweep(spec, target, tokens,
                             sms=(target.sm,) if target_kw["sm"] or target_kw["gpu"] else SUPPORTED_SMS,
                             dtypes=(spec.dtype,) if layer["dtype"] else tuple(DType),
                             quants=(spec.quant,) if layer["quant"] else tuple(Quant))
        if as_json:
            click.echo(json.dumps(report.sweep_dict(cells, spec, target, tokens), indent=2))
        else:
            report.render_sweep(cells, STDOUT)
        return
    plan = make_plan(spec, target, tokens, force)
    if explain_stage:
        click.echo(report.explain(plan, explain_stage))
    elif as_json:
        click.echo(json.dumps(report.report_dict(plan), indent=2))
    elif markdown:
        click.echo(report.render_markdown(plan), nl=False)
    else:
        report.render_table(plan, STDOUT)


def _one_output(allowed_pairs: set[tuple[str, str]], **given: bool) -> None:
    """Refuse output options that cannot be honoured together, naming both (never pick one silently)."""
    chosen = sorted(name for name, on in given.items() if on)
    for i, a in enumerate(chosen):
        for b in chosen[i + 1:]:
            if (a, b) not in allowed_pairs:
                raise MoeBuildError(f"--{a}/--{b}", "these output options cannot be combined",
                                    "one of --json, --markdown, --explain, --sweep (--sweep --json is allowed)")


@cli.command("build")
@click.argument("checkpoint", required=False, type=click.Path())
@click.option("--layer", type=int, help="Decoder layer index of the MoE layer to build (default: the first).")
@click.option("--all-layers", is_flag=True, help="One engine per MoE layer of the checkpoint.")
@layer_options
@target_options
@click.option("--min-tokens", "min_tokens", type=int, default=1, show_default=True)
@click.option("--opt-tokens", "opt_tokens", type=int, default=16, show_default=True)
@click.option("--max-tokens", "max_tokens", type=int, default=256, show_default=True)
@click.option("--opt-level", "opt_level", type=int, default=3, show_default=True,
              help="Builder optimization level, 0..5.")
@click.option("--workspace-mb", "workspace_mb", type=int, help="Builder workspace memory pool limit (MiB).")
@click.option("--timing-cache", "timing_cache", type=click.Path(),
              help="Timing cache file, reused across builds (full TensorRT; default: in the output folder).")
@click.option("--out", "out_dir", default="engines", show_default=True, type=click.Path(), help="Output folder.")
@click.option("--name", help="Engine name (default: preset or checkpoint name, plus the layer).")
@click.option("--routing-input", "routing_input",
              help="hidden|logits|topk: engine inputs besides hidden (router logits, or top-k ids + weights). "
                   "Default: hidden on the OOTB path, logits on the plugin path (the only one it takes).")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True,
              help="Seed of the random weights (no checkpoint).")
def build(checkpoint: str | None, layer: int | None, all_layers: bool, min_tokens: int, opt_tokens: int,
          max_tokens: int, opt_level: int, workspace_mb: int | None, timing_cache: str | None, out_dir: str,
          name: str | None, routing_input: str | None, seed: int, **kw: Any) -> None:
    """Build TensorRT engine(s) + manifests; with no arguments, the embedded tiny default.

    Every refusal (options, layer, plan, a plugin path without full TensorRT) comes before the
    plan is printed and before any weight is loaded; progress goes to stderr, results to stdout.
    With --ep-size N: one engine + manifest per rank (or only --ep-rank's) in OUT/NAME/rank<r>/, each
    from its own plan and holding only its experts' weights.
    """
    from pathlib import Path

    from .engine.jobs import BuildJob, run_build_jobs
    from .engine.options import BuildOptions, check_options
    from .engine.preflight import prepare_build
    from .engine.ranks import split_ranks
    from .planner import make_plan, report
    from .spec.source import resolve_spec
    from .target import TokenProfile, resolve_target

    layer_kw, target_kw, force = _split_layer_target(kw)
    if checkpoint is None and (layer is not None or all_layers):
        raise MoeBuildError("layer", "--layer/--all-layers need a checkpoint", "CHECKPOINT with --layer N")
    if layer is not None and all_layers:
        raise MoeBuildError("layer", "give --layer or --all-layers, not both", "one of --layer, --all-layers")
    options = BuildOptions(output_dir=Path(out_dir), optimization_level=opt_level, workspace_mib=workspace_mb,
                           timing_cache=Path(timing_cache) if timing_cache else None, routing_input=routing_input)
    check_options(options)
    profile = TokenProfile(min=min_tokens, opt=opt_tokens, max=max_tokens)
    spec, ranks = split_ranks(resolve_spec(checkpoint, **layer_kw))
    target = resolve_target(profile=profile, **target_kw)
    plan = make_plan(spec, target, opt_tokens, force)
    rank_plans = [(r, make_plan(spec.for_rank(r), target, opt_tokens, force)) for r in ranks]
    jobs = BuildJob.for_source(spec, plan, checkpoint, layer, all_layers, seed, name, rank_plans)
    for s, p in [(spec, plan)] + [(spec.for_rank(r), p) for r, p in rank_plans]:
        prepare_build(s, p, options)
    report.render_table(plan, STDOUT)
    workspace = "TensorRT's default" if workspace_mb is None else f"{workspace_mb} MiB"
    total = len(jobs) * max(1, len(ranks))
    for i, r in enumerate(run_build_jobs(jobs, options), 1):
        STDOUT.print(f"[{i}/{total}] built {r.engine_path} ({r.engine_path.stat().st_size / 2**20:.1f} MiB) + "
                     f"{r.manifest_path.name} in {r.manifest['build']['seconds']:.1f} s "
                     f"(optimization level {opt_level}, workspace {workspace})")


@cli.command("export")
@click.argument("checkpoint", required=False, type=click.Path())
@click.option("--layer", type=int, help="Decoder layer index of the MoE layer (default: the first).")
@click.option("--onnx", "onnx_path", required=True, type=click.Path(),
              help="Where to write the graph; weights over 1 GiB go to PATH.data beside it.")
@layer_options
@click.option("--routing-input", "routing_input", default="hidden", show_default=True,
              help="hidden|logits|topk: the graph's inputs besides hidden (router logits, or top-k ids + weights).")
@click.option("--sm", type=int, help="Target SM of the plan (default: local GPU, else 89).")
@click.option("--flavour", help="tensorrt|tensorrt-rtx: the plan's flavour (default: the installed one).")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True,
              help="Seed of the random weights (no checkpoint).")
def export_cmd(checkpoint: str | None, layer: int | None, onnx_path: str, routing_input: str, sm: int | None,
               flavour: str | None, seed: int, **layer_kw: Any) -> None:
    """Write one MoE layer's OOTB ONNX graph, the graph an OOTB engine is built from, for other tools
    (onnxruntime, Polygraphy, ...); with no checkpoint, a preset's or the flags' layer with random weights.

    The graph takes `hidden` [tokens, H] in the layer's dtype (and --routing-input's inputs) and gives
    `output` [tokens, H]; its expert compute is the plan's for --sm/--flavour. It is written as one unit:
    a failure or Ctrl-C leaves no file.
    """
    import dataclasses
    from pathlib import Path

    from .graph.export import check_onnx_destination, write_onnx
    from .graph.ootb import check_routing_input
    from .planner import make_plan
    from .spec.hf_config import select_moe_layers
    from .spec.source import resolve_spec
    from .target import resolve_target
    from .weights import MoEWeights

    if checkpoint is None and layer is not None:
        raise MoeBuildError("layer", "--layer needs a checkpoint", "CHECKPOINT with --layer N")
    check_routing_input(routing_input)
    if onnx_path.endswith(("/", "\\")):  # Path() would drop the slash and write a file of the folder's name
        raise MoeBuildError("onnx", f"{onnx_path} names a folder", "a file path such as layer.onnx")
    destination = Path(onnx_path)
    check_onnx_destination(destination)
    spec = resolve_spec(checkpoint, **layer_kw)
    plan = make_plan(spec, resolve_target(sm=sm, flavour=flavour, moe_plugin="disable"))
    if checkpoint is None:
        source = f"{spec.name} (random weights, seed {seed})"
        weights = MoEWeights.random(spec, seed=seed)  # the whole layer's, as a checkpoint's
    else:
        from .weights.checkpoint import load_moe_layer
        index = select_moe_layers(checkpoint, layer, all_layers=False)[0]
        source = f"{checkpoint} layer {index}"
        click.echo(f"loading {source}", err=True)
        # the whole layer's weights, fit to the overrides (--quant none dequantizes quantized experts)
        weights = load_moe_layer(checkpoint, index).weights.for_spec(dataclasses.replace(spec, ep_rank=None))
    if spec.ep_rank is not None:  # --ep-rank: that rank's graph (its experts only, its partial sum)
        weights = weights.for_rank(spec, spec.ep_rank)
    click.echo(f"exporting ONNX (expert_compute={plan.stage('expert_compute').choice})", err=True)
    files = write_onnx(spec, weights, plan, destination, routing_input)
    sizes = " + ".join(f"{p} ({p.stat().st_size / 2**20:.1f} MiB)" for p in files)
    click.echo(f"wrote {sizes}: {source}, {spec.dtype.value}, inputs hidden [tokens, {spec.hidden_size}]"
               f"{'' if routing_input == 'hidden' else ' + ' + routing_input}, output [tokens, {spec.hidden_size}] "
               f"{spec.out_dtype.value}")


@cli.command("check")
@click.argument("checkpoint", type=click.Path())
@click.option("--layer", type=int, help="Decoder layer index of the MoE layer (default: the first).")
@click.option("--tokens", type=int, default=64, show_default=True, help="Random hidden states to run.")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True,
              help="Seed of the hidden states.")
@click.option("--rtol", type=float, help="Relative tolerance per element (default 1e-4; 1e-2 for an fp16 --onnx).")
@click.option("--atol", type=float, help="Absolute tolerance per element (default: rtol x the RMS of "
              "transformers' output).")
@click.option("--onnx", "onnx_path", type=click.Path(),
              help="Check this graph (from `moe-build export`, --routing-input hidden, fp32 or fp16) instead of "
                   "a fresh fp32 export.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result (schema moe-build.check/1).")
def check_cmd(checkpoint: str, layer: int | None, tokens: int, seed: int, rtol: float | None, atol: float | None,
              onnx_path: str | None, as_json: bool) -> None:
    """Check a layer's ONNX graph against the checkpoint's own transformers MoE block.

    Both run on the same seeded random hidden states: the graph with onnxruntime (CPU), transformers'
    block (its model class on the meta device, only this block loaded through transformers' own key
    conversions, eager experts) in fp32. The graph is exported in fp32, so the check is of its math
    (router, top-k, experts, shared experts) on the checkpoint's exact weights; an engine in the
    layer's 16-bit dtype runs the same graph with casts. Tokens within round-off of an expert tie are
    left out, and said so. Exit 0 within tolerance, 1 outside it or where the two pick different
    experts without a tie, 2 for bad input. Needs transformers 5.x, and memory for the layer's weights
    in fp32 a few times over (and temporary disk for the fp32 graph).
    """
    from .check import check_layer, render
    from .errors import VerificationError
    result = check_layer(checkpoint, layer, tokens, seed, rtol, atol, onnx_path,
                         log=lambda line: click.echo(f"check: {line}", err=True))
    click.echo(json.dumps(result.to_dict(), indent=2) if as_json else render(result))
    if not result.passed:
        raise VerificationError(f"check of {checkpoint} layer {result.layer}: {result.failure}")


@cli.command("inspect")
@click.argument("engine", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
def inspect_cmd(engine: str, as_json: bool) -> None:
    """Show an engine's manifest, I/O and layers, and verify engine, manifest and plan agree; for an
    expert-parallel layer's folder (OUT/NAME with rank<r>/ subfolders), every rank and its experts; for a build's
    output folder, its one engine, or every engine it holds verified and listed."""
    from .engine.inspect import inspect_path, render_folder, render_group, render_inspection
    result = inspect_path(engine)
    if as_json:
        click.echo(json.dumps(result, indent=2, default=str))
    elif "engines" in result:
        render_folder(result, STDOUT)
    elif "ranks" in result:
        render_group(result, STDOUT)
    else:
        render_inspection(result, STDOUT)


@cli.command("bench")
@click.option("--shapes", default=None, help="Comma-separated bench shapes (default mixtral-8x7b,qwen3-30b-a3b,"
              "deepseek-v2-lite,gpt-oss-20b; with --quant also deepseek-v3).")
@click.option("--tokens", default=None, help="Comma-separated token counts (default 1,16,256,4096; with --sweep: "
              "geometric steps of 1.25 from 1 to 8192 plus both ends of every band of each shape's plan).")
@click.option("--variants", default=None, help="Comma-separated variants: ours, ours:STAGE=CHOICE[+STAGE=CHOICE] "
              "(stages forced), naive, grouped_mm, hf_eager (default: ours, each fusion forced off, and the "
              "peers; with --sweep: ours).")
@click.option("--sweep", is_flag=True, help="The token sweep: graph replays only, a chart of time over the floor "
              "against tokens, and the counts that sit far from their neighbours.")
@click.option("--quant", default="none", show_default=True, help="none (bf16 layers), or fp8, fp8_static (static "
              "input scales), fp8_block comma-separated: the FP8 bench (variants ours, ours:fc1_input_quant=separate, "
              "ours:fc2_input_quant=separate, ours_bf16, scaled_grouped_mm, grouped_mm_dequant; JSON default "
              "bench_fp8.json), or w4a16_awq, w8a16, wfp4a16, w4afp8 (static input scales), w4afp8_dynamic "
              "comma-separated: the weight-only bench "
              "(variants ours, each fusion forced off, ours_bf16, grouped_mm_dequant; JSON default bench_woq.json).")
@click.option("--iters", type=int, default=20, show_default=True, help="Timed rounds per point.")
@click.option("--warmup", type=int, default=3, show_default=True, help="Warm-up calls per variant.")
@click.option("--input-sets", "input_sets", type=int, default=4, show_default=True,
              help="Input sets rotated among (no warm-cache flattery).")
@click.option("--json", "json_path", type=click.Path(), default=None,
              help="Where to write the raw results (default bench.json, or sweep.json with --sweep).")
@click.option("--png", "png_path", type=click.Path(), default=None, help="Chart (matplotlib).")
def bench_cmd(shapes: str | None, tokens: str | None, variants: str | None, sweep: bool, quant: str, iters: int,
              warmup: int, input_sets: int, json_path: str | None, png_path: str | None) -> None:
    """Time the fused runner against its peers and the hardware floor on the local GPU."""
    import json as json_module
    from pathlib import Path

    from .bench import fp8_layer, layer, sweep as sweep_module, woq_layer
    from .bench.workload import FP8_SHAPES, SHAPES, TOKENS
    items = [q.strip() for q in quant.split(",") if q.strip()]
    known_quants = ["none", *fp8_layer.MODES, *woq_layer.QUANTS]
    unknown_quants = [q for q in items if q not in known_quants]
    if unknown_quants:
        raise MoeBuildError("quant", f"unknown {', '.join(repr(q) for q in unknown_quants)}", known_quants)
    woq_quants = [q for q in items if q in woq_layer.QUANTS]
    if woq_quants and len(woq_quants) != len(items):
        raise MoeBuildError("quant", f"{quant!r} mixes weight-only modes with others",
                            f"weight-only modes only: {', '.join(woq_layer.QUANTS)}")
    quants = [] if woq_quants else fp8_layer.parse_quants(quant)
    known = FP8_SHAPES if quants else tuple(SHAPES)
    names = _csv("shapes", shapes, str) if shapes is not None else list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise MoeBuildError("shapes", f"unknown {unknown}", sorted(known))
    counts = _csv("tokens", tokens, int) if tokens else None
    if counts is not None and min(counts) < 1:
        raise MoeBuildError("tokens", f"must be >= 1, got {min(counts)}", "integers >= 1")
    log = lambda line: click.echo(line, err=True)  # noqa: E731
    if woq_quants:
        if sweep:
            raise MoeBuildError("quant", "the token sweep times bf16 layers only", "none with --sweep")
        chosen_woq = _csv("variants", variants, str) if variants else None
        if chosen_woq is not None:
            woq_layer.check_variants(chosen_woq)
        results = woq_layer.run_woq_bench(woq_quants, names, counts or list(TOKENS),
                                          Path(json_path or "bench_woq.json"), iters, warmup, input_sets,
                                          log=log, variants=chosen_woq)
        click.echo(woq_layer.table(results))
        return
    if quants:
        if sweep:
            raise MoeBuildError("quant", "the token sweep times bf16 layers only", "none with --sweep")
        chosen = _csv("variants", variants, str) if variants else list(fp8_layer.FP8_VARIANTS)
        fp8_layer.check_variants(chosen)
        results = fp8_layer.run_fp8_bench(quants, names, counts or TOKENS, Path(json_path or "bench_fp8.json"),
                                          Path(png_path) if png_path else None, iters, warmup, input_sets, chosen,
                                          log=log)
        click.echo(fp8_layer.table(results))
        return
    default_variants = ["ours"] if sweep else [*layer.RUNNER_VARIANTS, *layer.PEERS]
    chosen = _csv("variants", variants, str) if variants else default_variants
    for v in chosen:
        if layer.runner_force(v) is None and v not in layer.PEERS:
            raise MoeBuildError("variants", f"unknown variant {v!r}", ["ours", "ours:STAGE=CHOICE", *layer.PEERS])
    out = Path(json_path or ("sweep.json" if sweep else "bench.json"))
    if not sweep:
        results = layer.run_bench(names, counts or TOKENS, out, Path(png_path) if png_path else None, iters,
                                  warmup, input_sets, chosen, log=log)
        click.echo(layer.table(results))
        return
    layer.require_bench_gpu()  # before the sweep asks torch.cuda for the GPU's target
    target = sweep_module.device_sweep_target()
    results = {}
    for name in names:
        part = layer.run_bench([name], counts or sweep_module.sweep_counts(name, target), None, None, iters, warmup,
                               input_sets, chosen, log=log, eager=False)
        results = part if not results else {**results, "points": results["points"] + part["points"]}
        out.write_text(json_module.dumps(results, indent=1, default=str))  # partial results survive a time-out
    if png_path:
        sweep_module.plot(results, Path(png_path))
    click.echo(sweep_module.summary(results))


def _csv(field: str, text: str, kind: Callable[[str], Any]) -> list[Any]:
    """A comma-separated option as a list, or a one-line error naming the option."""
    try:
        items = [kind(part.strip()) for part in text.split(",") if part.strip()]
    except ValueError:
        raise MoeBuildError(field, f"cannot read {text!r}", "comma-separated values") from None
    if not items:
        raise MoeBuildError(field, "is empty", "comma-separated values")
    return items


@cli.command("bench-ep")
@click.option("--nproc", type=int, default=None, help="GPUs (ranks) to spread over (default: every visible GPU).")
@click.option("--iters", type=int, default=20, show_default=True,
              help="Timed rounds per point, each of 10 calls back to back.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the results here.")
@click.option("--layers", default=None, help="Comma-separated layers to time whole (default: every one: "
              "qwen3-30b-a3b,deepseek-v3-shaped).")
def bench_ep_cmd(nproc: int | None, iters: int, json_path: str | None, layers: str | None) -> None:
    """Expert parallelism on this host's GPUs: dispatch + combine against worst-case all-to-all and the link,
    the whole layer (dual-batch overlap off and on) against one GPU, and the memory the exact sizes save (one
    process per GPU, torchrun)."""
    import os
    import subprocess

    import torch

    from .bench.ep import LAYERS
    known = [name for name, *_ in LAYERS]
    chosen = known if layers is None else _csv("layers", layers, str)
    for name in chosen:
        if name not in known:
            raise MoeBuildError("layers", f"unknown layer {name!r}", known)
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < 2:
        raise MoeBuildError("device", f"moe-build bench-ep needs 2 or more CUDA GPUs of one host, this machine has "
                            f"{have}", "a host with 2+ NVIDIA GPUs")
    n = have if nproc is None else nproc
    if not 2 <= n <= have:
        raise MoeBuildError("nproc", f"{n} ranks on a machine with {have} CUDA GPUs", f"2..{have}")
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
           "NVSHMEM_DISABLE_NVLS": "1"}
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", "-m",
            "moe_build.bench.ep", str(iters), os.path.abspath(json_path) if json_path else "", ",".join(chosen)]
    raise SystemExit(subprocess.run(args, env=env).returncode)


@cli.command("kernels")
@click.option("--out", "out_dir", type=click.Path(), default=None,
              help="Folder for the library and its build.json (default: the cache, ~/.cache/moe_build/kernels).")
@click.option("--arch", default="80,90a", show_default=True, help="Comma-separated target architectures.")
@click.option("-j", "--jobs", type=int, default=None,
              help="Parallel nvcc processes (default: the CPU count, fewer where memory is short).")
@click.option("--force", is_flag=True, help="Rebuild even where a verified library is there.")
def kernels_cmd(out_dir: str | None, arch: str, jobs: int | None, force: bool) -> None:
    """Build the CUDA kernel library ahead of time (needs nvcc and the CUTLASS headers: pip install
    'moe-build[kernels]'), or find the verified one already built, and say where it is."""
    from pathlib import Path

    from .kernels.build import KernelBuildError, build_command
    if jobs is not None and jobs < 1:
        raise MoeBuildError("jobs", f"must be >= 1, got {jobs}", "integers >= 1")
    try:
        build_command(Path(out_dir) if out_dir else None, arch, jobs, force,
                      echo=lambda line: click.echo(line, err=True))
    except KernelBuildError as e:
        if e.output:
            click.echo(e.output, err=True)
        raise MoeBuildError("kernels", e.message) from None


@cli.command("presets")
def presets_cmd() -> None:
    """List the named layer presets."""
    from .spec.presets import PRESETS
    for name, spec in PRESETS.items():
        click.echo(f"{name:18s} hidden={spec.hidden_size} inter={spec.intermediate_size} experts={spec.num_experts} "
                   f"top_k={spec.top_k} {spec.activation.value} {spec.dtype.value}")


EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell's convention
EXIT_TERMINATED = 143   # 128 + SIGTERM


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so that it unwinds like Ctrl-C: every cleanup runs."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated()


# What Click 8.2 on raises for `moe-build` without a command; 8.1 printed the help itself and has no such class (an
# empty tuple: an except clause that catches nothing).
_NO_ARGS_IS_HELP: type[Exception] | tuple[()] = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _allowed_names(e: click.UsageError) -> str:
    """What click's message for an unknown option or command leaves out, the names it could have been, in the
    "(allowed: ...)" form of every other input error; "" for other usage errors, whose messages say it already."""
    ctx = e.ctx
    if ctx is None:
        return ""
    if isinstance(e, click.NoSuchOption):
        names = sorted(opt for param in ctx.command.get_params(ctx) for opt in param.opts if opt.startswith("--"))
    elif isinstance(ctx.command, click.Group) and e.format_message().startswith("No such command"):
        names = ctx.command.list_commands(ctx)
    else:
        return ""
    return f" (allowed: {', '.join(names)})"


def main() -> None:
    """Console entry point: one-line errors and the documented exit codes (2 bad input, 1 failed
    verification, 130 interrupted, 143 terminated)."""
    import signal
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        cli.main(standalone_mode=False)
    except MoeBuildError as e:
        click.echo(f"moe-build: error: {e}", err=True)
        sys.exit(e.exit_code)
    except VerificationError as e:
        click.echo(f"moe-build: verification failed: {e}", err=True)
        sys.exit(VerificationError.exit_code)
    except _NO_ARGS_IS_HELP as e:  # `moe-build` alone: the help, as `moe-build --help` prints it
        click.echo(e.format_message())
    except click.UsageError as e:  # a bad option or argument: one line, like every other input error
        where = f" {e.ctx.command_path}" if e.ctx is not None else ""
        click.echo(f"moe-build{where.removeprefix(' moe-build') if where else ''}: error: {e.format_message()}"
                   f"{_allowed_names(e)}", err=True)
        sys.exit(2)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except (click.Abort, KeyboardInterrupt) as e:
        terminated = isinstance(e, _Terminated) or isinstance(e.__cause__, _Terminated)
        click.echo(f"moe-build: {'terminated' if terminated else 'interrupted'}; nothing half-written is left",
                   err=True)
        sys.exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)
    except OSError as e:  # the machine refused: disk full, a name too long, no permission
        where = f" ({e.filename})" if e.filename else ""
        click.echo(f"moe-build: error: {e.strerror or e}{where}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
