"""Build `libmoe_build_kernels.so` from every `cpp/src/*.cu` with nvcc.

One object per source, compiled in parallel, linked into one shared library. The result is
cached under a key that hashes the sources, headers, flags, target architectures, the CUTLASS
headers' version and `nvcc --version`, so an unchanged tree never recompiles and any change
(even of the compiler) does. `cpp/CMakeLists.txt` builds the same library with the same flags.

CLI: ``python -m moe_build.kernel_build [--out DIR] [--arch 80,90a]``.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

LIB_NAME = "libmoe_build_kernels.so"
REPO_ROOT = Path(__file__).resolve().parent.parent
SRC_DIR = REPO_ROOT / "cpp" / "src"
INCLUDE_DIR = REPO_ROOT / "cpp" / "include"
HEADER = INCLUDE_DIR / "moe_build_kernels.h"
DEFAULT_ARCHS = ("80", "90a")
# Keep in step with cpp/CMakeLists.txt.
BASE_FLAGS = ("-std=c++17", "-O3", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC")
_STAMP = "build.key"


class KernelBuildError(RuntimeError):
    """The kernel library could not be built (no nvcc, no CUTLASS headers, a compile error)."""


@dataclass
class BuildResult:
    """What `build` produced: the library path, its cache key, and per-source compile times."""

    library: Path
    key: str
    cached: bool
    compile_seconds: dict[str, float | None] = field(default_factory=dict)  # None: object reused
    link_seconds: float = 0.0


def find_nvcc() -> str:
    """nvcc from $CUDACXX, PATH or $CUDA_HOME/bin, else a KernelBuildError saying how to get one."""
    candidates = [os.environ.get("CUDACXX"), shutil.which("nvcc")]
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home:
        candidates.append(str(Path(cuda_home) / "bin" / "nvcc"))
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    raise KernelBuildError("nvcc not found: put the CUDA toolkit's nvcc on PATH, or set CUDACXX or CUDA_HOME "
                           "(CUDA 12.4+; the kernels target sm_80 and sm_90a)")


def cutlass_include_dir() -> Path:
    """CUTLASS/CuTe headers shipped by the `nvidia-cutlass` wheel (`cutlass_library/source/include`)."""
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or spec.origin is None:
        raise KernelBuildError("CUTLASS headers not found: pip install nvidia-cutlass (the GEMM kernels include "
                               "cutlass/ and cute/ from its cutlass_library/source/include)")
    inc = Path(spec.origin).parent / "source" / "include"
    if not (inc / "cutlass" / "cutlass.h").is_file():
        raise KernelBuildError(f"the installed nvidia-cutlass has no headers at {inc}")
    return inc


def _cutlass_version() -> str:
    try:
        return importlib.metadata.version("nvidia-cutlass")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def sources() -> list[Path]:
    """Every translation unit of the library: all of cpp/src/*.cu, in name order."""
    srcs = sorted(SRC_DIR.glob("*.cu"))
    if not srcs:
        raise KernelBuildError(f"no .cu sources under {SRC_DIR}")
    return srcs


def arch_flags(archs: Sequence[str]) -> list[str]:
    """`-gencode` pairs: real machine code for each architecture (no PTX, so no JIT at load)."""
    out: list[str] = []
    for a in archs:
        if not a.rstrip("a").isdigit():
            raise KernelBuildError(f"--arch: {a!r} is not an SM number such as 80 or 90a")
        out += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    return out


def compile_flags(archs: Sequence[str], cutlass_inc: Path) -> list[str]:
    return [*BASE_FLAGS, *arch_flags(archs), f"-I{INCLUDE_DIR}", f"-I{cutlass_inc}"]


def _nvcc_version(nvcc: str) -> str:
    return subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout


def _headers() -> list[Path]:
    return sorted(SRC_DIR.glob("*.cuh")) + sorted(SRC_DIR.glob("*.h")) + sorted(INCLUDE_DIR.glob("*.h"))


def _key(inputs: Sequence[Path], archs: Sequence[str], nvcc: str, cutlass_inc: Path) -> str:
    """sha256 over the given files, the flags, the CUTLASS version and nvcc's version."""
    h = hashlib.sha256()
    for p in inputs:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    # The include path itself is not hashed (it differs per virtualenv); its version is.
    flags = [f for f in compile_flags(archs, cutlass_inc) if not f.startswith("-I")]
    h.update("\0".join(flags).encode())
    h.update(_cutlass_version().encode())
    h.update(_nvcc_version(nvcc).encode())
    return h.hexdigest()[:20]


def cache_key(archs: Sequence[str], nvcc: str, cutlass_inc: Path) -> str:
    """The library's key: every source and header, the flags, the CUTLASS and nvcc versions."""
    return _key(sources() + _headers(), archs, nvcc, cutlass_inc)


def default_cache_root() -> Path:
    env = os.environ.get("MOE_BUILD_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "moe_build" / "kernels"


def _compile_one(nvcc: str, flags: list[str], src: Path, obj: Path, cached: Path) -> float | None:
    """Compiles src to obj, or copies the object cached under its own key (source + every header):
    editing one kernel file then recompiles that file alone. Returns seconds, None if reused."""
    if cached.is_file():
        shutil.copyfile(cached, obj)
        return None
    start = time.perf_counter()
    proc = subprocess.run([nvcc, *flags, "-c", str(src), "-o", str(obj)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise KernelBuildError(f"nvcc failed on {src.name} (exit {proc.returncode}):\n{proc.stderr.strip()}")
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    shutil.copyfile(obj, tmp)
    os.replace(tmp, cached)
    return time.perf_counter() - start


def build(out_dir: Path | None = None, archs: Sequence[str] = DEFAULT_ARCHS, jobs: int | None = None,
          force: bool = False) -> BuildResult:
    """Build (or reuse) the library. `out_dir` defaults to `<cache root>/<key>/`; a directory whose
    stamp holds the current key is reused unless `force`."""
    nvcc = find_nvcc()
    cutlass_inc = cutlass_include_dir()
    key = cache_key(archs, nvcc, cutlass_inc)
    out = Path(out_dir) if out_dir is not None else default_cache_root() / key
    lib = out / LIB_NAME
    stamp = out / _STAMP
    if not force and lib.is_file() and stamp.is_file() and stamp.read_text().strip() == key:
        return BuildResult(lib, key, cached=True)

    flags = compile_flags(archs, cutlass_inc)
    out.mkdir(parents=True, exist_ok=True)
    # Objects and the library go to a private directory first, so a concurrent reader never sees
    # a half-written library and an interrupted build leaves no stamp behind.
    with tempfile.TemporaryDirectory(dir=out, prefix=".build-") as tmp:
        tmp_dir = Path(tmp)
        srcs = sources()
        headers = _headers()
        objects = (out if out_dir is not None else default_cache_root()) / "objects"
        times: dict[str, float | None] = {}
        cached = {s: objects / f"{s.stem}-{_key([s, *headers], archs, nvcc, cutlass_inc)}.o" for s in srcs}
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
            futures = {pool.submit(_compile_one, nvcc, flags, s, tmp_dir / (s.stem + ".o"), cached[s]): s
                       for s in srcs}
            for fut in concurrent.futures.as_completed(futures):
                times[futures[fut].name] = fut.result()
        # Older objects of these sources are superseded: keep the cache to one object per source.
        keep = set(cached.values())
        for s in srcs:
            for old in objects.glob(f"{s.stem}-*.o"):
                if old not in keep:
                    old.unlink(missing_ok=True)
        start = time.perf_counter()
        tmp_lib = tmp_dir / LIB_NAME
        link = subprocess.run([nvcc, "-shared", *arch_flags(archs), "-o", str(tmp_lib),
                               *(str(tmp_dir / (s.stem + ".o")) for s in srcs)], capture_output=True, text=True)
        if link.returncode != 0:
            raise KernelBuildError(f"linking {LIB_NAME} failed:\n{link.stderr.strip()}")
        link_s = time.perf_counter() - start
        os.replace(tmp_lib, lib)
    stamp.write_text(key + "\n")
    return BuildResult(lib, key, cached=False, compile_seconds=dict(sorted(times.items())), link_seconds=link_s)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moe_build.kernel_build", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: the key-named cache dir)")
    parser.add_argument("--arch", default=",".join(DEFAULT_ARCHS), help="comma-separated SMs (default: 80,90a)")
    parser.add_argument("-j", "--jobs", type=int, default=None, help="parallel nvcc processes (default: CPU count)")
    parser.add_argument("--force", action="store_true", help="rebuild even if the cache key matches")
    args = parser.parse_args(argv)
    archs = tuple(a.strip() for a in args.arch.split(",") if a.strip())
    try:
        start = time.perf_counter()
        result = build(args.out, archs, args.jobs, args.force)
    except KernelBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if result.cached:
        print(f"up to date (key {result.key}): {result.library}")
        return 0
    for name, secs in result.compile_seconds.items():
        print(f"  compiled {name:<28} {secs:7.1f} s" if secs is not None else f"  reused   {name}")
    print(f"  linked   {LIB_NAME:<28} {result.link_seconds:7.1f} s")
    print(f"built {result.library} (key {result.key}, archs {','.join(archs)}) in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
