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
        click.option("--lora", is_flag=True, help="The layer carries LoRA adapters."),
        click.option("--experts-per-node", "experts_per_node", type=int, help="Experts on this node (EP)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def target_options(f: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--sm", type=int, help="Target SM: 80|86|89|90|100|103|120|121 (default: local GPU, else 89)."),
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
                  "fp8_input", "lora", "experts_per_node")
    layer = {k: kw.pop(k) for k in layer_keys}
    target = {k: kw.pop(k) for k in ("sm", "flavour", "moe_plugin", "deterministic")}
    force = {}
    for item in kw.pop("force"):
        stage, sep, choice = item.partition("=")
        if not sep:
            raise MoeBuildError("force", f"expected STAGE=CHOICE, got {item!r}", "STAGE=CHOICE")
        force[stage] = choice
    return layer, target, force


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="moe-build")
def cli() -> None:
    """Build fused Mixture-of-Experts TensorRT engines, and explain every fusion decision."""


@cli.command("fusion-report")
@click.argument("checkpoint", required=False, type=click.Path())
@layer_options
@target_options
@click.option("--tokens", type=int, default=1, show_default=True, help="Token count to evaluate the plan at.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report (schema moe-build.fusion-report/1).")
@click.option("--markdown", is_flag=True, help="Markdown report.")
@click.option("--sweep", is_flag=True, help="The whole matrix across SMs x dtypes x quant modes for this layer.")
@click.option("--explain", "explain_stage", metavar="STAGE", help="Every gate of one stage (or 'path') and why.")
def fusion_report(checkpoint: str | None, tokens: int, as_json: bool, markdown: bool, sweep: bool,
                  explain_stage: str | None, **kw: Any) -> None:
    """Print the build plan: path (plugin or OOTB) and each fusion stage with the gates that decided it."""
    from . import report
    from .planner import make_plan
    from .spec_source import resolve_spec
    from .target import resolve_target

    layer, target_kw, force = _split_layer_target(kw)
    spec = resolve_spec(checkpoint, **layer)
    target = resolve_target(**target_kw)
    if sweep:
        cells = report.sweep(spec, target, tokens)
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


@cli.command("build")
@click.argument("checkpoint", required=False, type=click.Path())
@click.option("--layer", type=int, help="Decoder layer index of the MoE layer to build (default: the first).")
@click.option("--all-layers", is_flag=True, help="One engine per MoE layer of the checkpoint.")
@layer_options
@target_options
@click.option("--min-tokens", "min_tokens", type=int, default=1, show_default=True)
@click.option("--opt-tokens", "opt_tokens", type=int, default=16, show_default=True)
@click.option("--max-tokens", "max_tokens", type=int, default=256, show_default=True)
@click.option("--opt-level", "opt_level", type=int, default=3, show_default=True, help="Builder optimization level.")
@click.option("--workspace-mb", "workspace_mb", type=int, help="Builder workspace memory pool limit (MiB).")
@click.option("--timing-cache", "timing_cache", type=click.Path(), help="Timing cache file (reused across builds).")
@click.option("--out", "out_dir", default="engines", show_default=True, type=click.Path(), help="Output folder.")
@click.option("--name", help="Engine name (default: preset or checkpoint name, plus the layer).")
@click.option("--routing-input", "routing_input", default="hidden", show_default=True,
              help="hidden|logits|topk: engine inputs besides hidden (router logits, or top-k ids + weights).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random weights (no checkpoint).")
def build(checkpoint: str | None, layer: int | None, all_layers: bool, min_tokens: int, opt_tokens: int,
          max_tokens: int, opt_level: int, workspace_mb: int | None, timing_cache: str | None, out_dir: str,
          name: str | None, routing_input: str, seed: int, **kw: Any) -> None:
    """Build TensorRT engine(s) + manifests; with no arguments, the embedded tiny default."""
    from pathlib import Path

    from . import report
    from .build_job import BuildJob, run_build_jobs
    from .ootb_graph import ROUTING_INPUTS
    from .planner import make_plan
    from .spec_source import resolve_spec
    from .target import TokenProfile, resolve_target

    layer_kw, target_kw, force = _split_layer_target(kw)
    if routing_input not in ROUTING_INPUTS:
        raise MoeBuildError("routing_input", f"unknown value {routing_input!r}", ROUTING_INPUTS)
    if checkpoint is None and (layer is not None or all_layers):
        raise MoeBuildError("layer", "--layer/--all-layers need a checkpoint", "CHECKPOINT with --layer N")
    if layer is not None and all_layers:
        raise MoeBuildError("layer", "give --layer or --all-layers, not both", "one of --layer, --all-layers")
    profile = TokenProfile(min=min_tokens, opt=opt_tokens, max=max_tokens)
    spec = resolve_spec(checkpoint, **layer_kw)
    target = resolve_target(profile=profile, **target_kw)
    plan = make_plan(spec, target, opt_tokens, force)
    report.render_table(plan, STDOUT)
    jobs = BuildJob.for_source(spec, plan, checkpoint, layer, all_layers, seed, name)
    results = run_build_jobs(jobs, Path(out_dir), opt_level, workspace_mb, timing_cache, routing_input,
                             STDOUT)
    for r in results:
        size_mb = r.engine_path.stat().st_size / 2**20
        STDOUT.print(f"built {r.engine_path} ({size_mb:.1f} MiB) + {r.manifest_path.name} "
                     f"in {r.manifest['build']['seconds']:.1f} s")


@cli.command("inspect")
@click.argument("engine", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
def inspect_cmd(engine: str, as_json: bool) -> None:
    """Show an engine's manifest, I/O and layers, and verify engine, manifest and plan agree."""
    from .inspect_engine import inspect_engine
    from .report import render_inspection
    result = inspect_engine(engine)
    if as_json:
        click.echo(json.dumps(result, indent=2, default=str))
    else:
        render_inspection(result, STDOUT)


@cli.command("bench", context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                        "help_option_names": []})
@click.pass_context
def bench_cmd(ctx: click.Context) -> None:
    """Time the fused runner against its peers on the local GPU (see `moe-build bench --help`)."""
    from .bench import main as bench_main
    sys.exit(bench_main(ctx.args))


@cli.command("presets")
def presets_cmd() -> None:
    """List the named layer presets."""
    from .presets import PRESETS
    for name, spec in PRESETS.items():
        click.echo(f"{name:18s} hidden={spec.hidden_size} inter={spec.intermediate_size} experts={spec.num_experts} "
                   f"top_k={spec.top_k} {spec.activation.value} {spec.dtype.value}")


def main() -> None:
    """Console entry point: one-line errors and the documented exit codes."""
    try:
        cli.main(standalone_mode=False)
    except MoeBuildError as e:
        click.echo(f"moe-build: error: {e}", err=True)
        sys.exit(e.exit_code)
    except VerificationError as e:
        click.echo(f"moe-build: verification failed: {e}", err=True)
        sys.exit(VerificationError.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.Abort:
        click.echo("moe-build: aborted", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
