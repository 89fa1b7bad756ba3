"""Rendering of plans: rich table, JSON, Markdown, the SM x dtype x quant sweep, and --explain.

Pure presentation: every word here is read off a `Plan`; nothing is decided.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..errors import MoeBuildError, UnsupportedCombination
from . import PLAN_SCHEMA_VERSION, Plan, StageDecision, make_plan
from .gates import bands_text
from .plan import MATRIX_STAGES
from ..spec import DType, MoESpec, Quant
from ..target import SUPPORTED_SMS, Target, named_part

REPORT_SCHEMA_VERSION = "moe-build.fusion-report/10"
SWEEP_SCHEMA_VERSION = "moe-build.fusion-sweep/7"
STAGE_TITLES = {
    "routing_prologue": "routing prologue", "routing": "routing (top-k)", "expand_rows": "expand rows",
    "gemm_kernel": "GEMM kernel",
    "fc1_activation": "FC1 activation", "fc2_prequant": "FC2 pre-quant", "finalize": "finalize",
    "fc1_input_quant": "GEMM1 input FP8", "fc2_input_quant": "GEMM2 input FP8", "fp8_accumulation": "FP8 accumulation",
    "w1_order": "W1 order", "weight_layout": "weight layout", "gemm1_tactic": "GEMM1 tactic",
    "gemm2_tactic": "GEMM2 tactic", "token_digits": "token digits", "expert_compute": "expert compute (OOTB)",
    "expand_rows_tactic": "expansion kernel", "fc1_input_quant_tactic": "GEMM1 input quantize kernel",
    "fc1_activation_tactic": "activation kernel", "fc2_input_quant_tactic": "GEMM2 input quantize kernel",
}


def _bands_text(d: StageDecision, sep: str = "; ") -> str:
    """The stage's bands, e.g. "1-256 fused; 257+ three_step", or "all" for a token-independent stage."""
    return bands_text(d.bands, sep) if d.token_dependent else "all"


def _path_reason(plan: Plan) -> str:
    failed = [g for g in plan.path_gates if not g.held]
    if plan.path == "plugin":
        kernels = plan.path_gate("plugin_kernels_sm")
        ours = ("" if kernels.held else f"; moe-build has no kernels for sm{kernels.value} yet, {kernels.name} fails: "
                "the stages show TensorRT-LLM's matrix and `build` refuses this plan")
        return "MoE plugin enabled and the flavour can add plugin layers" + ours
    return "; ".join(f"{g.name}: {g.condition} does not hold (value {g.value}) [{g.source}]" for g in failed
                     if g.name in ("moe_plugin", "flavour_plugin_layers"))


def report_dict(plan: Plan) -> dict[str, Any]:
    """The documented `--json` document (schema `moe-build.fusion-report/1`).

    Top level: schema, plan_schema, path, path_reason, tokens, target, spec, path_gates, stages.
    Each stage: stage, choice (at `tokens`), fallback, bands [[lo, hi|null, choice], ...] covering every
    token count from 1, forced, summary, gates: [{name, value, condition, held, source, token_dependent}].
    """
    d = plan.to_dict()
    return {"schema": REPORT_SCHEMA_VERSION, "plan_schema": PLAN_SCHEMA_VERSION, "path": plan.path,
            "path_reason": _path_reason(plan), "tokens": plan.tokens, "target": d["target"], "spec": d["spec"],
            "path_gates": d["path_gates"], "stages": d["stages"]}


def _gate_text(d: StageDecision, sep: str = ", ") -> str:
    """The stage's failed gates, `sep` between them (the table puts each on its own line: run together,
    a folded column reads as other gates). A fused choice the planner made itself
    (not forced) had every gate of its own hold, so any that failed belong to the other choices of the
    stage (FC1's SM80 kernel when the TMA WS gated epilogue was chosen): they are marked as such, not
    shown as the choice's."""
    failed = d.failed_gates()
    if not failed:
        return "all gates hold"
    text = sep.join(f"{g.name}={g.value}" for g in failed)
    lead = "\n" if sep == "\n" else " "  # the table's gates start on the line after the label
    return f"other choices:{lead}{text}" if d.fused and not d.forced else text


def _ep_text(spec: dict) -> str:
    """", expert-parallel over N ranks (rank r): E / N experts each" for a split layer, else nothing."""
    size = int(spec.get("ep_size", 1))
    if size == 1:
        return ""
    rank = spec.get("ep_rank")
    which = f" (rank {rank})" if rank is not None else ""
    return f", expert-parallel over {size} ranks{which}: {int(spec['num_experts']) // size} experts each"


def _target_text(t: dict) -> str:
    """"sm90", or "h200, sm90" for a target named by its part (--gpu)."""
    part = named_part(str(t.get("sm_source", "")))
    return f"{part}, sm{t['sm']}" if part else f"sm{t['sm']}"


def render_table(plan: Plan, console: Console) -> None:
    t = plan.target
    source = str(t.get("flavour_source", ""))
    why = f", as {source[len('target ('):-1]}" if source.startswith("target (") else ""
    title = (f"MoE fusion plan: {plan.spec.get('name', 'moe')}{_ep_text(plan.spec)} on {_target_text(t)} "
             f"({t['flavour']}{why}), "
             f"{plan.tokens} token{'s' if plan.tokens != 1 else ''}")
    console.print(f"[bold]{escape(title)}[/bold]")
    console.print(f"path: [bold]{plan.path}[/bold] ({escape(_path_reason(plan))})")
    table = Table(show_lines=False)
    for col in ("stage", "choice", "fallback", "by tokens", "failed gates", "what runs"):
        table.add_column(col, overflow="fold")
    for d in plan.stages:
        style = "green" if d.fused else ("yellow" if d.failed_gates() else "")
        table.add_row(STAGE_TITLES.get(d.stage, d.stage), f"[{style}]{d.choice}[/{style}]" if style else d.choice,
                      d.fallback, escape(_bands_text(d, "\n")), escape(_gate_text(d, "\n")),
                      escape(d.summary + (" [forced]" if d.forced else "")))
    console.print(table)


def render_markdown(plan: Plan) -> str:
    t = plan.target
    lines = [f"# MoE fusion plan: {plan.spec.get('name', 'moe')}{_ep_text(plan.spec)}", "",
             f"- target: {_target_text(t)}, {t['flavour']} {t.get('flavour_version') or ''}".rstrip(),
             f"- tokens: {plan.tokens}", f"- path: **{plan.path}** ({_path_reason(plan)})", "",
             "| stage | choice | fallback | by tokens | failed gates | what runs |", "|---|---|---|---|---|---|"]
    for d in plan.stages:
        lines.append(f"| {d.stage} | {d.choice} | {d.fallback} | {_bands_text(d, '<br>')} | {_gate_text(d)} | "
                     f"{d.summary} |")
    return "\n".join(lines) + "\n"


def explain(plan: Plan, stage: str) -> str:
    """Every gate of one stage, why it held or not, and its source."""
    if stage == "path":
        decision_gates, head = plan.path_gates, f"path = {plan.path}"
    else:
        try:
            d = plan.stage(stage)
        except KeyError:
            names = ["path", *(s.stage for s in plan.stages)]
            raise MoeBuildError("explain", f"no stage {stage!r} on the {plan.path} path", names) from None
        decision_gates = d.gates
        head = (f"{d.stage} = {d.choice} (fallback {d.fallback}; by tokens: {_bands_text(d)})"
                + (" [forced]" if d.forced else "") + f"\n  {d.summary}")
    out = [head]
    for g in decision_gates:
        mark = "holds " if g.held else "FAILS "
        dep = " (depends on tokens)" if g.token_dependent else ""
        out.append(f"  {mark} {g.name}: {g.condition}; seen {g.value}{dep}\n         source: {g.source}")
    return "\n".join(out)


# ---- sweep -------------------------------------------------------------------------------------

CHOICE_ABBREV = {"fused": "F", "three_step": "3", "prequant_fused": "Q", "plain": "-", "tma_warp_specialized": "W",
                 "ampere": "A", "epilogue": "E", "fused_gated": "G", "gated_epilogue": "g", "separate": "S",
                 "none": "-", "dense_masked": "D", "per_expert_gather": "P"}


def sweep(spec: MoESpec, target: Target, tokens: int,
          sms: Iterable[int] = SUPPORTED_SMS, dtypes: Iterable[DType] = tuple(DType),
          quants: Iterable[Quant] = tuple(Quant)) -> list[dict[str, Any]]:
    """Plan every SM x dtype x quant cell; a refused cell records the refusing rule."""
    cells = []
    for sm in sms:
        for dtype in dtypes:
            for quant in quants:
                cell: dict[str, Any] = {"sm": sm, "dtype": dtype.value, "quant": quant.value}
                try:
                    plan = make_plan(dataclasses.replace(spec, dtype=dtype, quant=quant, output_dtype=None,
                                                         fp8_input=False),
                                     dataclasses.replace(target, sm=sm), tokens)
                    cell.update(path=plan.path, choices={s: c for s, c in plan.choices().items()
                                                         if s in MATRIX_STAGES})
                except UnsupportedCombination as e:
                    cell.update(path=None, refused_by=e.rule, source=e.source, error=str(e))
                cells.append(cell)
    return cells


def sweep_dict(cells: list[dict[str, Any]], spec: MoESpec, target: Target, tokens: int) -> dict[str, Any]:
    return {"schema": SWEEP_SCHEMA_VERSION, "tokens": tokens, "spec": spec.to_dict(), "target": target.to_dict(),
            "cells": cells}


def _cell_text(cell: dict[str, Any]) -> str:
    if cell["path"] is None:
        return f"[red]x {cell['refused_by']}[/red]"
    code = "".join(CHOICE_ABBREV[c] for c in cell["choices"].values())
    return f"{cell['path'][0].upper()}:{code}"


def render_sweep(cells: list[dict[str, Any]], console: Console) -> None:
    quants = list(dict.fromkeys(c["quant"] for c in cells))
    table = Table(title="fusion matrix sweep (rows sm/dtype, columns quant)")
    table.add_column("sm/dtype")
    for q in quants:
        table.add_column(q)
    rows: dict[tuple[int, str], dict[str, str]] = {}
    for c in cells:
        rows.setdefault((c["sm"], c["dtype"]), {})[c["quant"]] = _cell_text(c)
    for (sm, dtype), by_q in rows.items():
        table.add_row(f"sm{sm} {dtype}", *(by_q[q] for q in quants))
    console.print(table)
    console.print("P:/O: = plugin/OOTB path; plugin letters in stage order routing_prologue, expand_rows, "
                  "gemm_kernel, fc1_activation, fc2_prequant, finalize: F fused, 3 three-step, Q prequant-fused, "
                  "- plain/none, W TMA warp-specialized, A Ampere, E epilogue, G fused gated (SM80 kernel), "
                  "g gated epilogue (sm90 TMA WS, moe-build's own), S separate; "
                  "OOTB: D dense-masked, P per-expert gather; x = refused by the named rule.")

