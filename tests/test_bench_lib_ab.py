"""bench/lib_ab.py's comparison (the libraries' runs and their ratios), on hand-made bench files; the runs themselves
need a GPU and are the device scripts'."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def lib_ab():
    spec = importlib.util.spec_from_file_location("lib_ab", ROOT / "bench" / "lib_ab.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["lib_ab"] = module
    spec.loader.exec_module(module)
    return module


def bench_file(points: list[tuple[str | None, str, int, dict[str, float | None]]]) -> dict:
    """A `moe-build bench --json` file's points: (quant or None for the 16-bit bench, shape, tokens, variant: us)."""
    out = []
    for quant, shape, tokens, variants in points:
        p = {"shape": shape, "tokens": tokens, "variants": {v: {"graph_us": us} for v, us in variants.items()}}
        if quant is not None:
            p["quant"] = quant
        out.append(p)
    return {"points": out}


def test_graph_times_keys_every_point_and_variant(lib_ab) -> None:
    f = bench_file([("fp8", "qwen3-30b-a3b", 16, {"ours": 120.0, "ours:finalize=separate": 125.5}),
                    (None, "mixtral-8x7b", 1, {"ours": 182.25, "torch": None})])
    assert lib_ab.graph_times(f) == {("fp8", "qwen3-30b-a3b", 16, "ours"): 120.0,
                                     ("fp8", "qwen3-30b-a3b", 16, "ours:finalize=separate"): 125.5,
                                     ("bf16", "mixtral-8x7b", 1, "ours"): 182.25}


def test_compare_sums_rounds_against_the_first_library(lib_ab) -> None:
    k1, k2 = ("fp8", "a", 1, "ours"), ("fp8", "b", 16, "ours")
    runs = {"main": [{k1: 10.0, k2: 100.0}, {k1: 12.0, k2: 100.0}],
            "new": [{k1: 9.0, k2: 110.0}, {k1: 13.0}],      # round 2 lacks point b
            "other": [{k1: 20.0, k2: 50.0}, {k1: 24.0, k2: 50.0}]}
    rows = lib_ab.compare(runs)
    assert [(r["shape"], r["tokens"]) for r in rows] == [("a", 1), ("b", 16)]
    assert rows[0]["us"] == {"main": [10.0, 12.0], "new": [9.0, 13.0], "other": [20.0, 24.0]}
    assert rows[0]["over_first"] == {"new": pytest.approx(22.0 / 22.0), "other": pytest.approx(44.0 / 22.0)}
    assert rows[1]["us"]["new"] == [110.0, None] and rows[1]["over_first"] == {"new": None, "other": 0.5}
    text = lib_ab.table(rows)
    assert "new/main 1.000" in text and "other/main 2.000" in text and "new 110.0 -" in text


@pytest.mark.parametrize("text,words", [("main=/nonexistent.so,new=/nonexistent.so", "is not a file"),
                                        ("main", "is not NAME=PATH"), ("=x", "is not NAME=PATH"),
                                        ("main=x@", "is not NAME=PATH")])
def test_bad_libs_are_refused_by_name(lib_ab, text: str, words: str) -> None:
    with pytest.raises(SystemExit, match=words):
        lib_ab.parse_libs(text)


def test_one_library_is_refused(lib_ab, tmp_path: Path) -> None:
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"")
    with pytest.raises(SystemExit, match="two libraries or more"):
        lib_ab.parse_libs(f"main={lib}")
    assert lib_ab.parse_libs(f"main={lib},new={lib}") == {"main": (str(lib), None), "new": (str(lib), None)}


def test_a_library_may_name_its_source_tree(lib_ab, tmp_path: Path) -> None:
    """NAME=PATH@TREE: the bench of that library runs from TREE, which must hold a moe_build package."""
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"")
    with pytest.raises(SystemExit, match="holds no moe_build package"):
        lib_ab.parse_libs(f"main={lib}@{tmp_path},new={lib}")
    (tmp_path / "moe_build").mkdir()
    (tmp_path / "moe_build" / "__init__.py").write_text("")
    assert lib_ab.parse_libs(f"main={lib}@{tmp_path},new={lib}") == {"main": (str(lib), str(tmp_path)),
                                                                     "new": (str(lib), None)}
