"""The GPU suite's default selection (tests/pairwise_cases.py and its hook in tests/conftest.py): every pair of
parameter values that some case holds is still run, checked against pairs enumerated here independently."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from itertools import combinations, product
from pathlib import Path

import pytest

from pairwise_cases import pairwise_subset

TESTS = Path(__file__).parent


def occurring_pairs(cases: list[tuple]) -> set[tuple]:
    return {(i, c[i], j, c[j]) for c in cases for i in range(len(c)) for j in range(i + 1, len(c))}


@pytest.mark.parametrize("sizes", [(3, 3, 3), (11, 2, 9, 2), (2, 5, 4, 2, 2, 3, 2), (4, 3, 6)])
def test_a_full_product_keeps_every_pair_in_fewer_cases(sizes):
    cases = list(product(*(range(n) for n in sizes)))
    kept = pairwise_subset(cases)
    assert kept == sorted(set(kept)) and all(0 <= i < len(cases) for i in kept)
    assert occurring_pairs([cases[i] for i in kept]) == occurring_pairs(cases)
    two_largest = sorted(sizes)[-1] * sorted(sizes)[-2]
    assert two_largest <= len(kept) < len(cases)
    assert len(kept) <= 2 * two_largest  # greedy all-pairs stays near the bound for products this small


def test_pairs_that_never_occur_are_not_asked_for():
    """Zipped parameters (`n,k` given as a list of shapes) are two axes whose values only occur in some pairs."""
    shapes = [(256, 512), (272, 400), (768, 2048)]
    cases = [(n, k, tile, bias) for (n, k), tile, bias in product(shapes, ["a", "b", "c", "d"], [False, True])]
    kept = pairwise_subset(cases)
    assert occurring_pairs([cases[i] for i in kept]) == occurring_pairs(cases)
    assert len(kept) == 12  # every shape with every tile; the biases ride along


def test_every_case_is_kept_where_each_holds_a_pair_no_other_does():
    assert pairwise_subset([(1,), (2,), (3,)]) == [0, 1, 2]
    assert pairwise_subset(list(product(range(4), range(5)))) == list(range(20))
    assert pairwise_subset([]) == []
    assert pairwise_subset(list(product(range(4), [7], range(6)))) == list(range(24))


def test_the_choice_depends_only_on_the_cases_and_their_order():
    cases = list(product(range(4), range(3), range(5), range(2)))
    assert pairwise_subset(cases) == pairwise_subset(list(cases))


def test_cases_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="same parameters"):
        pairwise_subset([(1, 2, 3), (1, 2)])


SAMPLE = '''
import pytest

@pytest.mark.gpu
@pytest.mark.parametrize("a", [1, 2, 3])
@pytest.mark.parametrize("b", ["x", "y", "z"])
@pytest.mark.parametrize("c", [True, False])
def test_gpu(a, b, c):
    print(f"CASE {a} {b} {c}")

@pytest.mark.parametrize("a", [1, 2, 3])
@pytest.mark.parametrize("b", ["x", "y", "z"])
@pytest.mark.parametrize("c", [True, False])
def test_cpu(a, b, c):
    pass
'''


def pytest_in(folder: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """pytest run in `folder` (SAMPLE as test_sample.py) under this suite's conftest."""
    for name in ("conftest.py", "pairwise_cases.py"):
        shutil.copy(TESTS / name, folder / name)
    (folder / "test_sample.py").write_text(SAMPLE)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-W",
                           "ignore::pytest.PytestUnknownMarkWarning", *args], cwd=folder, capture_output=True,
                          text=True, timeout=120, env=env)


def run_sample(folder: Path, *args: str) -> str:
    done = pytest_in(folder, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def cases_run(out: str) -> list[tuple[str, str, str]]:
    return re.findall(r"CASE (\S+) (\S+) (\S+)", out)


def test_the_hook_runs_every_pair_of_a_gpu_tests_values_and_every_cpu_case(tmp_path):
    out = run_sample(tmp_path)
    ran = cases_run(out)
    every = [(str(a), b, str(c)) for a, b, c in product([1, 2, 3], "xyz", [True, False])]
    assert len(ran) == len(set(ran)) < len(every)
    assert occurring_pairs(ran) == occurring_pairs(every)
    assert f"{len(ran) + 18} passed, {18 - len(ran)} deselected" in out  # test_cpu's 18 all run
    assert f"GPU cases: {len(ran)} of 18 parametrized ones" in out


def test_gpu_cases_all_runs_every_combination_and_a_named_case_always_runs(tmp_path):
    assert "36 passed" in run_sample(tmp_path, "--gpu-cases=all")
    ran_by_default = cases_run(run_sample(tmp_path, "test_sample.py::test_gpu"))
    a, b, c = next((str(a), b, str(c)) for a, b, c in product([1, 2, 3], "xyz", [True, False])
                   if (str(a), b, str(c)) not in ran_by_default)
    out = run_sample(tmp_path, f"test_sample.py::test_gpu[{c}-{b}-{a}]")  # pytest's id: the lowest decorator first
    assert cases_run(out) == [(a, b, c)] and "1 passed" in out


def test_shards_split_the_selected_tests_without_overlap(tmp_path):
    whole = cases_run(run_sample(tmp_path))
    shards = [cases_run(run_sample(tmp_path, f"--shard={i}/3")) for i in range(3)]
    assert sorted(sum(shards, [])) == sorted(whole) and all(shards)


def test_a_malformed_shard_is_refused_in_one_line(tmp_path):
    done = pytest_in(tmp_path, "--shard=3/3")
    assert done.returncode == 4 and "--shard: '3/3' is not I/N with 0 <= I < N" in done.stderr, done.stderr


def test_a_shard_takes_its_share_of_the_cpu_threads_unless_omp_num_threads_says(tmp_path):
    """N shards side by side each run torch on cores / N threads (at least one); OMP_NUM_THREADS, where set, wins."""
    (tmp_path / "test_threads.py").write_text("import torch\n\ndef test_threads():\n"
                                              "    print(f'THREADS {torch.get_num_threads()}')\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    cores = len(os.sched_getaffinity(0))

    def threads(*args: str, **extra: str) -> int:
        done = pytest_in(tmp_path, "test_threads.py", *args, env={**env, **extra})
        assert done.returncode == 0, done.stdout + done.stderr
        return int(re.search(r"THREADS (\d+)", done.stdout).group(1))

    assert threads("--shard=0/4") == max(1, cores // 4)  # the one test falls to shard 0
    assert threads("--shard=0/1") == threads() == torch_threads_alone(env)
    assert threads("--shard=0/4", OMP_NUM_THREADS="3") == torch_threads_alone({**env, "OMP_NUM_THREADS": "3"})


def torch_threads_alone(env: dict[str, str]) -> int:
    """torch's own thread count in a fresh process (what a run of one shard keeps)."""
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=env,
                          capture_output=True, text=True, timeout=120)
    return int(done.stdout)
