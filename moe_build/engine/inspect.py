"""Describe a verified engine: the report `moe-build inspect` prints (or dumps with --json).

Why both sources: TensorRT's EngineInspector needs a deserialised engine, which needs a GPU the
flavour supports; on machines without one the report shows what the builder recorded (I/O,
layers, plan) and says that deserialisation was unavailable, never pretending otherwise.
Verification itself (sha256, manifest against plan) is manifest.py's; loading is runtime.py's.
An expert-parallel layer's folder (`<out>/<name>/` with `rank<r>/` subfolders, ranks.py) is inspected as a
group: every rank verified, listed with its experts, and the ranks checked to be one layer's split. A build's
output folder is inspected as what it holds: its one engine in full, or every engine and group verified and
listed.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..errors import MoeBuildError, VerificationError
from ..outputs import TEMP_PREFIX
from ..planner import Plan
from .manifest import manifest_path_for, verify
from .ranks import RANK_FOLDER, rank_folders


def _inspector_layers(info: dict[str, Any]) -> list[dict[str, str]]:
    """The engine inspector's layers as {name, type}: objects (Name, LayerType) at detailed
    profiling verbosity, which Polygraphy's config sets; bare names otherwise."""
    layers = []
    for layer in info.get("Layers", []):
        if isinstance(layer, dict):
            layers.append({"name": str(layer.get("Name", "")), "type": str(layer.get("LayerType", ""))})
        else:
            layers.append({"name": str(layer), "type": ""})
    return layers


def _inspect_deserialised(manifest: dict[str, Any], engine: bytes) -> dict[str, Any]:
    """TensorRT's own view of the engine, or why it cannot be had on this machine."""
    from .runtime import deserialize, ensure_runnable_here  # torch: only once the pair has verified
    try:
        backend, sm = ensure_runnable_here(manifest)
    except MoeBuildError as exc:
        return {"available": False, "reason": str(exc)}
    cuda_engine = deserialize(backend, engine, manifest["plan"]["path"])
    io = []
    for i in range(cuda_engine.num_io_tensors):
        name = cuda_engine.get_tensor_name(i)
        io.append({"name": name, "mode": cuda_engine.get_tensor_mode(name).name.lower(),
                   "dtype": cuda_engine.get_tensor_dtype(name).name, "shape": list(cuda_engine.get_tensor_shape(name))})
    info = json.loads(cuda_engine.create_engine_inspector().get_engine_information(
        backend.trt.LayerInformationFormat.JSON))
    return {"available": True, "device_sm": sm, "io": io, "layers": _inspector_layers(info)}


def inspect_engine(path: str | Path) -> dict[str, Any]:
    """Verify the engine/manifest pair and return the report (what `moe-build inspect` prints)."""
    manifest, engine = verify(path)
    graph, plan = manifest["graph"], manifest["plan"]
    return {
        "verified": True,
        "engine": str(manifest_path_for(path)[0]),
        "engine_sha256": manifest["engine_sha256"],
        "engine_bytes": manifest["engine_bytes"],
        "flavour": manifest["flavour"],
        "target": manifest["target"],
        "profile": manifest["profile"],
        "spec": manifest["spec"],
        "quant": manifest["quant"],
        "plan_path": plan["path"],
        "stages": Plan.from_dict(plan).choices(),
        "expert_compute": graph.get("expert_compute"),
        "plugin": graph.get("plugin"),
        "routing_input": graph["routing_input"],
        "recorded": {"inputs": [{**t, "mode": "input"} for t in graph["inputs"]],
                     "outputs": [{**t, "mode": "output"} for t in graph["outputs"]], "layers": graph["layers"]},
        "deserialised": _inspect_deserialised(manifest, engine),
        "build": manifest["build"],
        "ep": manifest["ep"],
    }


def inspect_path(path: str | Path) -> dict[str, Any]:
    """`moe-build inspect PATH`: an engine or manifest file (or their common stem), one rank's folder
    (`.../<name>/rank<r>`), an expert-parallel layer's folder with rank subfolders (`inspect_group`), or a
    build's output folder (`inspect_folder`)."""
    path = Path(path)
    if path.is_dir():
        if RANK_FOLDER.match(path.name) and not rank_folders(path):
            return inspect_engine(path / f"{path.parent.name}.engine")
        if rank_folders(path):
            return inspect_group(path)
        return inspect_folder(path)
    if not any(p.exists() for p in manifest_path_for(path)):
        raise MoeBuildError("engine", f"{path}: no such engine or manifest", "an .engine file built by moe-build")
    return inspect_engine(path)


def inspect_group(folder: str | Path) -> dict[str, Any]:
    """Every rank of an expert-parallel layer's folder, verified (exit 1 if any is not), and the ranks checked to
    split one layer: each rank folder holds its own rank's engine, all of one ep size and one spec. Ranks not
    built here (a build with --ep-rank) are listed as missing, not refused."""
    folder = Path(folder)
    found = rank_folders(folder)
    if not found:
        raise MoeBuildError("engine", f"{folder} is a folder without rank<r> subfolders",
                            "an .engine file, or an expert-parallel layer's folder (moe-build build --ep-size N)")
    ranks = [inspect_engine(sub / f"{folder.name}.engine") for _, sub in found]
    for (rank, sub), result in zip(found, ranks):
        ep = result["ep"]
        if ep is None or ep["rank"] != rank:
            holds = "a layer on one GPU" if ep is None else f"rank {ep['rank']}'s engine"
            raise VerificationError(f"{sub} holds {holds}, not rank {rank}'s")
    size = ranks[0]["ep"]["size"]
    whole = {k: v for k, v in ranks[0]["spec"].items() if k != "ep_rank"}
    for (_, sub), result in zip(found, ranks):
        if result["ep"]["size"] != size or {k: v for k, v in result["spec"].items() if k != "ep_rank"} != whole:
            raise VerificationError(f"{sub} and {found[0][1]} are not ranks of one layer (ep size "
                                    f"{result['ep']['size']} vs {size}, or another spec): a stale rank folder of "
                                    "an earlier build?")
    present = {rank for rank, _ in found}
    return {"verified": True, "group": str(folder), "ep_size": size, "ranks": ranks,
            "missing": [r for r in range(size) if r not in present]}


def inspect_folder(folder: Path) -> dict[str, Any]:
    """A build's output folder (`--out`, default engines/), as a user names it after `build`: the one engine (or
    expert-parallel layer) it holds, in full; or, where it holds more (`--all-layers`, several builds), every
    engine and group verified (exit 1 at the first that is not) and listed. Temporary files of a build still
    running, or killed, are not engines."""
    engines = sorted(p for p in folder.glob("*.engine") if not p.name.startswith(TEMP_PREFIX))
    groups = sorted(sub for sub in folder.iterdir() if sub.is_dir() and rank_folders(sub))
    if not engines and not groups:
        raise MoeBuildError("engine", f"{folder} holds no engine built by moe-build",
                            "an .engine file, a build's output folder, or an expert-parallel layer's folder "
                            "(moe-build build --ep-size N)")
    if len(engines) == 1 and not groups:
        return inspect_engine(engines[0])
    if len(groups) == 1 and not engines:
        return inspect_group(groups[0])
    return {"verified": True, "folder": str(folder), "engines": [inspect_engine(e) for e in engines],
            "groups": [inspect_group(g) for g in groups]}


# ---- rendering -------------------------------------------------------------------------------

def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def _shape(dims: Sequence[int]) -> str:
    """[-1, 64] as [tokens, 64]: the only dynamic dimension of these engines is the token count."""
    return "[" + ", ".join("tokens" if d == -1 else str(d) for d in dims) + "]"


def _quant_text(quant: dict[str, Any]) -> str:
    """The quant record in words: 'fp8: channel weight scales, dynamic activation scales', 'w4a16_awq: int4
    weights, group128 scales, zero points, pre-quant scales', or 'none'."""
    if quant["mode"] == "none":
        return "none"
    storage = quant.get("weight_storage")
    if storage is None:
        return (f"{quant['mode']}: {quant['weight_scale_granularity']} weight scales, "
                f"{quant['act_scale']} activation scales")
    extras = [name for name, key in (("zero points", "zero_points"), ("pre-quant scales", "prequant_scales"))
              if storage[key] is not None]
    return ", ".join([f"{quant['mode']}: {storage['kind']} weights", f"{storage['granularity']} scales", *extras])


def ep_text(ep: dict[str, Any]) -> str:
    """The ep record in words: 'rank 1 of 4: experts 32..63; ...' (last expert inclusive)."""
    first, end = ep["experts"]
    text = f"rank {ep['rank']} of {ep['size']}: experts {first}..{end - 1}"
    if ep["dispatch"] == "allreduce":
        return text + f"; output is this rank's partial sum: add the {ep['size']} ranks' outputs (allreduce)"
    return text + f"; dispatch {ep['dispatch']}"


def _facts(result: dict[str, Any]) -> Table:
    spec, target, profile, build = result["spec"], result["target"], result["profile"], result["build"]
    flavour = result["flavour"]
    sm = target["sm"]
    cc = f" ({target['compute_capability']})" if target.get("compute_capability") else ""
    path = result["plan_path"]
    if path == "ootb":
        path_text = f"ootb: expert compute {result['expert_compute']}"
    else:
        plugin = result["plugin"]
        path_text = (f"plugin: {plugin['name']} v{plugin['version']} ({plugin['namespace']}), "
                     f"weights as {plugin['weights']}")
    workspace = build.get("workspace_bytes")
    rows = [
        ("engine", f"{Path(result['engine']).name}, {_size(result['engine_bytes'])}, "
                   f"sha256 {result['engine_sha256'][:16]}..."),
        ("flavour", f"{flavour['name']} {flavour['version']}, SM {sm // 10}.{sm % 10}{cc}"),
        ("profile", f"{profile['min']}..{profile['max']} tokens, optimized for {profile['opt']}"),
        ("layer", f"{spec['name']}: hidden {spec['hidden_size']}, intermediate {spec['intermediate_size']}, "
                  f"{spec['num_experts']} experts, top-{spec['top_k']}, {spec['activation']}, {spec['dtype']}"),
        ("quant", _quant_text(result["quant"])),
        ("path", path_text),
        *([("expert parallel", ep_text(result["ep"]))] if result["ep"] is not None else []),
        ("routing input", result["routing_input"]),
        ("built", f"in {build['seconds']:.1f} s on {build['hostname']} by moe-build {build['moe_build_version']}, "
                  f"optimization level {build['optimization_level']}, workspace "
                  + ("TensorRT's default" if workspace is None else f"{workspace // 2**20} MiB")),
    ]
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, escape(value))
    return table


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    return table


def render_inspection(result: dict[str, Any], console: Console) -> None:
    """`moe-build inspect`: what was verified, the manifest's facts, the plan, I/O and layers."""
    console.print(f"[bold green]verified[/bold green] {escape(result['engine'])}: sha256 matches the manifest; "
                  "manifest, spec and plan agree")
    console.print(_facts(result))
    if result["plan_path"] == "plugin":
        console.print(_table("plugin stages (from the plan)", ("stage", "choice"), list(result["stages"].items())))
    deser = result["deserialised"]
    if deser.get("available"):
        io, layers, origin = deser["io"], deser["layers"], "TensorRT engine inspector"
    else:
        recorded = result["recorded"]
        io, layers, origin = recorded["inputs"] + recorded["outputs"], recorded["layers"], "recorded at build time"
        console.print(escape(f"not deserialised here: {deser.get('reason', '')}"))
    console.print(_table(f"I/O tensors ({origin})", ("name", "mode", "dtype", "shape"),
                         [(t["name"], t["mode"], t["dtype"], _shape(t["shape"])) for t in io]))
    console.print(_table(f"{len(layers)} layers ({origin})", ("#", "name", "type"),
                         [(str(i), layer["name"], layer["type"]) for i, layer in enumerate(layers)]))


def render_folder(result: dict[str, Any], console: Console) -> None:
    """`moe-build inspect` of a build's output folder holding several engines: one line each."""
    engines, groups = result["engines"], result["groups"]
    console.print(f"[bold green]verified[/bold green] {escape(result['folder'])}: {len(engines)} engine(s) and "
                  f"{len(groups)} expert-parallel layer(s), each engine's sha256 matches its manifest; manifests, "
                  "specs and plans agree")
    def row(name: str, r: dict[str, Any], engine_bytes: int) -> tuple[str, ...]:
        spec, sm, profile = r["spec"], r["target"]["sm"], r["profile"]
        return (name, spec["name"], r["plan_path"], spec["dtype"], r["quant"]["mode"],
                f"{r['flavour']['name']}, SM {sm // 10}.{sm % 10}", f"{profile['min']}..{profile['max']}",
                _size(engine_bytes))
    rows = [row(Path(r["engine"]).name, r, r["engine_bytes"]) for r in engines]
    rows += [row(f"{Path(g['group']).name}/ ({len(g['ranks'])} of {g['ep_size']} ranks)", g["ranks"][0],
                 sum(r["engine_bytes"] for r in g["ranks"])) for g in groups]
    columns = ("engine", "layer", "path", "dtype", "quant", "target", "tokens", "size")
    console.print(_table("engines", columns, rows))
    console.print("moe-build inspect FILE (or an expert-parallel layer's folder) shows one engine's plan, I/O and "
                  "layers")


def render_group(result: dict[str, Any], console: Console) -> None:
    """`moe-build inspect` of an expert-parallel layer's folder: every rank with its experts, then the facts
    the ranks share (those of the first rank found)."""
    ranks, size = result["ranks"], result["ep_size"]
    console.print(f"[bold green]verified[/bold green] {escape(result['group'])}: {len(ranks)} of {size} ranks, "
                  "each engine's sha256 matches its manifest; manifests, specs and plans agree")
    rows = []
    for r in ranks:
        first, end = r["ep"]["experts"]
        rows.append((str(r["ep"]["rank"]), f"{first}..{end - 1}", r["engine"], _size(r["engine_bytes"]),
                     r["engine_sha256"][:16] + "...", r["ep"]["dispatch"]))
    console.print(_table(f"expert-parallel over {size} ranks", ("rank", "experts", "engine", "size", "sha256",
                                                                  "dispatch"), rows))
    if ranks[0]["ep"]["dispatch"] == "allreduce":
        console.print(f"each engine's output is its rank's partial sum: add the {size} ranks' outputs (allreduce)")
    if result["missing"]:
        console.print(escape(f"not built here: rank(s) {', '.join(map(str, result['missing']))} of {size}"))
    console.print(f"rank {ranks[0]['ep']['rank']}'s manifest:")
    console.print(_facts(ranks[0]))
