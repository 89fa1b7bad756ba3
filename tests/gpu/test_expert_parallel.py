"""Expert parallelism on 2 and 4 GPUs: tests/gpu/ep_worker.py under torchrun (it asserts every case itself and
exits non-zero on the first failure); skipped where the GPUs are not there."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
WORKER = Path(__file__).with_name("ep_worker.py")
# NVLink multicast stays off everywhere (the device hosts' KINDS.md): NCCL's NVLS and symmetric memory's.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@pytest.mark.parametrize("ranks", [2, 4])
def test_expert_parallel_matches_single_gpu_and_reference(ranks: int, tmp_path: Path) -> None:
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < ranks:
        pytest.skip(f"needs {ranks} CUDA GPUs, this machine has {have} (scripts/device_run.sh on a multi-GPU kind)")
    # the per-case errors are kept where MOE_BUILD_GPU_RESULTS names a folder (the device script's results)
    out = Path(os.environ.get("MOE_BUILD_GPU_RESULTS", tmp_path)) / f"ep_{ranks}_ranks.json"
    env = {**os.environ, **NO_MULTICAST}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                        str(WORKER), str(out)], env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["world"] == ranks and len(doc["cases"]) == ranks * 103
    checked = [c for c in doc["cases"] if c["tokens"]]
    assert checked and all(c["rel_err_runner"] < 2 * 2.0 ** -8 and c["rel_err_reference"] < 1e-2 for c in checked)
    assert {c["backend"] for c in checked} == {"nvlink", "nccl"}
    assert any(c.get("overflow") == 1 for c in checked) and any(c.get("overflow") == 0 for c in checked)
    assert any("graph_rel_err" in c for c in checked)
    # dual-batch overlap ran on both dispatches, held against the same layer without it, and graph-replayed
    overlapped = [c for c in checked if c["overlap"]]
    assert {c["backend"] for c in overlapped if "rel_err_plain" in c} == {"nvlink", "nccl"}
    assert all(c["rel_err_plain"] < 2 * 2.0 ** -8 for c in overlapped if "rel_err_plain" in c)
    assert any("graph_rel_err" in c for c in overlapped) and any(c.get("overflow") == 1 for c in overlapped)
    # the grouped formats ran, graph-replayed, the batched one overflowing too; deterministic plans bit-identical
    assert {"permuted", "batched"} <= {c["format"] for c in checked}
    assert any("graph_rel_err" in c for c in checked if c["format"] == "permuted")
    assert any(c.get("overflow") == 1 for c in checked if c["format"] == "batched")
    assert sum(bool(c.get("bit_identical")) for c in checked) >= ranks * 12
    grouped = {(c["backend"], c["format"]) for c in checked}
    assert {("nvlink", "permuted"), ("nvlink", "batched"), ("nccl", "permuted"), ("nccl", "batched")} <= grouped
    assert {c["backend"] for c in checked if c.get("bit_identical")} == {"nvlink", "nccl"}
    # the nccl dispatch's all-gather form ran (captured and replayed: the two-phase form refuses a capture), with
    # and without overlap
    gathered = [c for c in checked if c["backend"] == "nccl" and c["counts"]]
    assert sum("graph_rel_err" in c for c in gathered) == ranks * 13
    assert any(c["overlap"] and "rel_err_plain" in c for c in gathered)
