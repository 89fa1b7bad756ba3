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
