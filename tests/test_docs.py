"""Every path a document names exists, and nothing a user reads cites a file outside the repository.

Documents: README.md, docs/*.md, bench/README.md, engines/README.md. Paths are markdown link targets
(relative ones) and code-formatted words that look like repository paths; both are resolved against the
document's folder and the repository root. Citations a user sees also come from the planner's gates
(`fusion-report` prints each gate's source): a source that names a repository file must name one that exists.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from moe_build.errors import UnsupportedCombination
from moe_build.planner import make_plan
from moe_build.spec.presets import PRESETS
from moe_build.target import Flavour, MoePlugin, Target

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", ROOT / "bench" / "README.md", ROOT / "engines" / "README.md",
               *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\s]+)`")
PATHLIKE = re.compile(r"^[\w.\-/]+(/|\.(py|md|json|png|txt|cu|cuh|h|sh|toml|cfg|yml))$")
OUTSIDE = ("shared/", "ENVIRONMENT.md", "../shared")


def _exists(doc: Path, target: str) -> bool:
    target = target.split("#", 1)[0]
    return not target or (doc.parent / target).exists() or (ROOT / target).exists()


def _named_paths(doc: Path) -> list[str]:
    text = doc.read_text()
    links = [t for t in LINK.findall(text) if not re.match(r"^[a-z]+:", t) and not t.startswith("#")]
    code = [t for t in CODE.findall(text) if PATHLIKE.match(t) and "/" in t and not t.startswith(("/", "~", "$"))]
    return links + code


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_named_path_exists(doc: Path) -> None:
    missing = sorted({t for t in _named_paths(doc) if not _exists(doc, t)})
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_no_document_cites_files_outside_the_repository(doc: Path) -> None:
    text = doc.read_text()
    assert not [o for o in OUTSIDE if o in text], doc


def test_the_readme_stays_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


def test_every_gate_source_that_names_a_repository_file_exists() -> None:
    """fusion-report prints each gate's source: TensorRT-LLM's file:line (upstream), "moe-build", or a file of
    this repository, which must exist."""
    targets = [Target(sm=sm, flavour=flavour, moe_plugin=plugin) for sm in (80, 89, 90)
               for flavour in (Flavour.TENSORRT, Flavour.TENSORRT_RTX) for plugin in (MoePlugin.AUTO, MoePlugin.DISABLE)
               if flavour is Flavour.TENSORRT or sm != 90]
    sources = set()
    for spec in PRESETS.values():
        for target in targets:
            try:
                plan = make_plan(spec, target, 16)
            except UnsupportedCombination as refused:  # e.g. an FP8 preset below SM 89: the refusing gate's source
                sources.add(refused.source)
                continue
            sources |= {g.source for g in plan.path_gates} | {g.source for s in plan.stages for g in s.gates}
    ours = [part for s in sources for part in s.split(", ") if not part.startswith("TensorRT-LLM ")]
    named = {m for s in ours for m in re.findall(r"(?:docs|moe_build|cpp)/[\w./-]+", s)}
    assert named, "expected some gate sources to name repository files"
    assert all((ROOT / m).exists() for m in named), sorted(m for m in named if not (ROOT / m).exists())
    assert not [s for s in sources if any(o in s for o in OUTSIDE)]


def _slug(heading: str) -> str:
    """A markdown heading's anchor as GitHub writes it: formatting marks dropped, lower case, punctuation other than
    hyphens and underscores removed, each space a hyphen."""
    text = re.sub(r"[`*]", "", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    """Every heading anchor of `doc` (a repeated heading's later anchors take -1, -2, ... as GitHub numbers them)."""
    seen: dict[str, int] = {}
    anchors = set()
    in_code = False
    for line in doc.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            slug = _slug(m.group(1))
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_link_anchor_names_a_heading(doc: Path) -> None:
    """A link to `file.md#anchor` (or `#anchor` in the same document) lands on a heading of that document: anchors
    follow headings, so a renamed or re-dated heading must take its links along."""
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+:", target) or "#" not in target:
            continue
        path, anchor = target.split("#", 1)
        md = doc if not path else next((p for p in (doc.parent / path, ROOT / path) if p.exists()), None)
        if md is not None and md.suffix == ".md" and anchor not in _anchors(md):
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)} links to headings that do not exist: {sorted(set(broken))}"


def test_the_readme_python_example_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """README's "From Python" example on a tiny Qwen3-MoE checkpoint that transformers writes: on a CUDA GPU it runs
    whole and prints the runner's error against the fp64 reference; without one, every line before the runner runs
    and the runner refuses in its one line."""
    import torch
    transformers = pytest.importorskip("transformers")
    from moe_build.errors import MoeBuildError
    text = (ROOT / "README.md").read_text()
    example = re.search(r"## From Python\n.*?```python\n(.*?)```", text, re.S)
    assert example is not None, "README has no From Python example"
    config = transformers.Qwen3MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                         head_dim=16, num_experts=8, num_experts_per_tok=2, vocab_size=64)
    transformers.Qwen3MoeForCausalLM(config).to(torch.bfloat16).save_pretrained(tmp_path)
    code = example[1].replace("path/to/checkpoint", str(tmp_path))
    assert code != example[1]
    if not torch.cuda.is_available():
        with pytest.raises(MoeBuildError, match="no CUDA device is available"):
            exec(compile(code, "README.md", "exec"), {})
        return
    exec(compile(code, "README.md", "exec"), {})
    assert float(capsys.readouterr().out.strip().splitlines()[-1]) < 1e-2
