"""The main loop of each kernel in a cubin, from its SASS: the backward-branch region with the most mma instructions,
its instruction, HMMA and global-load counts, and (--waits) the scoreboards its loads set and its instructions wait
on. How the decode kernels' "instructions per 4 KB of weights" in cpp/src/gemm/woq_decode.cu were counted, and how
their register ring was found to wait, each batch, on every load issued the batch before (docs/experiments.md).

    nvcc -std=c++17 -O3 --expt-relaxed-constexpr -arch=sm_90a -Icpp/include -Icpp/src -I$CUTLASS_INC \\
        -cubin cpp/src/gemm/woq_decode.cu -o /tmp/woq_decode.cubin
    python bench/sass_loops.py /tmp/woq_decode.cubin codes_kernelI13__nv_bfloat16Li1E [--waits]

nvdisasm comes from $NVDISASM, PATH or the `nvidia-cuda-nvdisasm` wheel. Control bits (Volta and later: the top 23
bits of each 128-bit instruction): stall 4 bits, yield 1, write scoreboard 3 (7: none), read scoreboard 3, wait mask 6.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys


def nvdisasm() -> str:
    found = os.environ.get("NVDISASM") or shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia.cu13  # the nvidia-cuda-nvdisasm wheel's (namespace) package
        return os.path.join(list(nvidia.cu13.__path__)[0], "bin", "nvdisasm")
    except ImportError:
        sys.exit("nvdisasm not found: set NVDISASM, put it on PATH or pip install nvidia-cuda-nvdisasm")


def functions(cubin: str) -> dict[str, list[tuple[str, str, int | None]]]:
    """Per function: (address or 'label', text, control bits) in order."""
    text = subprocess.run([nvdisasm(), "-hex", "-c", cubin], capture_output=True, text=True, check=True).stdout
    lines = text.split("\n")
    out: dict[str, list[tuple[str, str, int | None]]] = {}
    cur = None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^\.text\.(\S+):", line)
        if m:
            cur = m.group(1)
            out[cur] = []
        elif cur is not None:
            lab = re.match(r"^\s*(\.L_x_\d+):", line)
            ins = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?);\s+/\* (0x[0-9a-f]{16}) \*/", line)
            if lab:
                out[cur].append(("label", lab.group(1), None))
            elif ins and i + 1 < len(lines):
                hi = re.search(r"/\* (0x[0-9a-f]{16}) \*/", lines[i + 1])
                out[cur].append((ins.group(1), ins.group(2), int(hi.group(1), 16) >> 41 if hi else None))
                i += 1
        i += 1
    return out


def main_loop(body: list[tuple[str, str, int | None]]) -> list[tuple[str, str, int | None]]:
    """The backward-branch region holding the most HMMA (empty when there is none)."""
    labels = {t: k for k, (a, t, _) in enumerate(body) if a == "label"}
    best: tuple[int, list] = (-1, [])
    for k, (a, t, _) in enumerate(body):
        m = re.search(r"BRA.*?(\.L_x_\d+)", t) if a != "label" else None
        if m and m.group(1) in labels and labels[m.group(1)] < k:
            seg = body[labels[m.group(1)]:k + 1]
            hmma = sum("HMMA" in x[1] for x in seg)
            if hmma > best[0]:
                best = (hmma, seg)
    return best[1]


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    cubin, pattern, waits = sys.argv[1], sys.argv[2], "--waits" in sys.argv[3:]
    for name, body in functions(cubin).items():
        if pattern not in name:
            continue
        loop = [x for x in main_loop(body) if x[0] != "label"]
        hmma = sum("HMMA" in t for _, t, _ in loop)
        ldg = sum("LDG" in t for _, t, _ in loop)
        print(f"{name[:110]}: {len(loop)} instructions in the main loop, {hmma} HMMA, {ldg} LDG")
        if not waits:
            continue
        for addr, t, c in loop:
            if c is None:
                continue
            wb, wait = (c >> 5) & 7, [b for b in range(6) if (c >> 11) >> b & 1]
            if "LDG" in t or wait:
                print(f"  {addr} sets SB{wb if wb != 7 else '-'} waits {wait or '-'}  {t[:80]}")


if __name__ == "__main__":
    main()
