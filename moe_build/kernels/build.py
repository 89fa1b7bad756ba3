"""Build `libmoe_build_kernels.so` from every `cpp/src/**/*.cu` with nvcc, and find a verified build.

One object per source, compiled in parallel, linked into one shared library. The library lives under
`<cache root>/<key>/` (cache root: `$MOE_BUILD_CACHE`, else `~/.cache/moe_build/kernels`), the key hashing
the sources, headers, flags and target architectures only, so that finding a built library needs
neither nvcc nor the CUTLASS headers. Beside it a build writes `build.json` (the key, the library's
sha256, the nvcc version line, the CUTLASS version, the architectures, when it was built); a library is
used only where its sha256 matches that stamp, and one that does not is refused (and rebuilt where
nvcc and the CUTLASS headers are there). `cpp/CMakeLists.txt` builds the same library with the same flags.

`build_command` is what ``moe-build kernels [--out DIR] [--arch 80,90a] [-j N] [--force]`` runs.
"""
from __future__ import annotations

import concurrent.futures
import datetime
import hashlib
import importlib.metadata
import importlib.util
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

LIB_NAME = "libmoe_build_kernels.so"
STAMP_NAME = "build.json"


def _cpp_dir() -> Path:
    """The kernel sources: the checkout's top-level cpp/ (an editable install), else the copy a wheel carries as
    moe_build/cpp (pyproject.toml's package data)."""
    here = Path(__file__).resolve().parents[1]
    checkout = here.parent / "cpp"
    return checkout if (checkout / "src").is_dir() else here / "cpp"


CPP_DIR = _cpp_dir()
SRC_DIR = CPP_DIR / "src"
INCLUDE_DIR = CPP_DIR / "include"
HEADER = INCLUDE_DIR / "moe_build_kernels.h"
DEFAULT_ARCHS = ("80", "90a")
# The architectures the kernels are written for: the mma.sync kernels need SM 8.0 (bf16 mma), the FP8 decode
# kernel SM 8.9, the wgmma ones sm_90a's arch-specific features (plain 90 compiles them to a trap). Others
# are refused before nvcc runs, not after minutes of compiling.
KNOWN_ARCHS = ("80", "86", "89", "90a")
# Keep in step with cpp/CMakeLists.txt. Sources include "moe_build_kernels.h" (cpp/include) and their
# siblings by their path under cpp/src ("common/common.cuh", "gemm/mma.cuh").
BASE_FLAGS = ("-std=c++17", "-O3", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC")
INCLUDE_DIRS = (INCLUDE_DIR, SRC_DIR)

Progress = Callable[[str], None]

# Memory one compile may take at its peak: cicc on the mixed-input wgmma sources (gemm/woq_sm90_gated.cu, sm_90a,
# nvcc 13.0) peaked at 10.3 GB on a 2-core CPU machine (2026-12-05), the lighter sources at a few GB. The default
# number of parallel compiles leaves each this much of the memory available, so that a machine with many cores
# and little memory compiles fewer sources at once rather than have the out-of-memory killer stop nvcc.
NVCC_JOB_GB = 11
NVCC_JOB_BYTES = NVCC_JOB_GB << 30


class KernelBuildError(RuntimeError):
    """The kernel library could not be built or found (no nvcc, no CUTLASS headers, a compile error, a
    library that does not match its build.json). `message` is one line; `output` what the compiler said, where
    it said something, which the exception's text carries after that line (the CLI prints it before its one-line
    error)."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(f"{message}\n{output}" if output else message)
        self.message = message
        self.output = output


@dataclass
class BuildResult:
    """What `build` produced: the library path, its cache key, and per-source compile times."""

    library: Path
    key: str
    cached: bool
    compile_seconds: dict[str, float | None] = field(default_factory=dict)  # None: object reused
    link_seconds: float = 0.0


@dataclass(frozen=True)
class BuildStamp:
    """build.json: what a build wrote beside its library, and how the library is recognised (sha256)."""

    key: str
    sha256: str
    nvcc: str
    cutlass: str
    archs: tuple[str, ...]
    created: str

    @classmethod
    def read(cls, path: Path) -> BuildStamp:
        """The stamp at `path`; KernelBuildError (one line) if it is missing or not a stamp."""
        try:
            data = json.loads(path.read_text())
            return cls(str(data["key"]), str(data["sha256"]), str(data["nvcc"]), str(data["cutlass"]),
                       tuple(str(a) for a in data["archs"]), str(data["created"]))
        except FileNotFoundError:
            raise KernelBuildError(f"{path} is missing") from None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise KernelBuildError(f"{path} is not a build stamp ({type(e).__name__}: {e})") from None

    def write(self, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**asdict(self), "archs": list(self.archs)}, indent=2) + "\n")
        os.replace(tmp, path)


# ---- the toolchain (needed to compile, never to find a built library) -------------------------

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


def cutlass_version() -> str:
    try:
        return importlib.metadata.version("nvidia-cutlass")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def nvcc_version(nvcc: str) -> str:
    """`nvcc --version`'s release line (e.g. "Cuda compilation tools, release 13.0, V13.0.88")."""
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    return next((line for line in lines if "release" in line), lines[-1] if lines else "unknown")


# ---- what is compiled ---------------------------------------------------------------------------

def sources() -> list[Path]:
    """Every translation unit of the library: all of cpp/src/**/*.cu, in path order."""
    srcs = sorted(SRC_DIR.rglob("*.cu"))
    if not srcs:
        raise KernelBuildError(f"no .cu sources under {SRC_DIR}")
    return srcs


def headers() -> list[Path]:
    """Every header the sources may include: *.cuh and *.h under cpp/src and cpp/include, recursively."""
    found = {p for d in (SRC_DIR, INCLUDE_DIR) for pattern in ("*.cuh", "*.h") for p in d.rglob(pattern)}
    return sorted(found)


def source_name(src: Path) -> str:
    """A source's path under cpp/src, e.g. "gemm/sm90_abi.cu" (how progress and timings name it)."""
    return src.relative_to(SRC_DIR).as_posix()


def object_stem(src: Path) -> str:
    """The object's file stem, unique per source: "gemm/sm90_abi.cu" -> "gemm_sm90_abi"."""
    return source_name(src)[: -len(".cu")].replace("/", "_")


def arch_flags(archs: Sequence[str]) -> list[str]:
    """`-gencode` pairs: real machine code for each architecture (no PTX, so no JIT at load)."""
    out: list[str] = []
    for a in archs:
        if a not in KNOWN_ARCHS:
            raise KernelBuildError(f"--arch: {a!r} is not an architecture the kernels are written for "
                                   f"(allowed: {', '.join(KNOWN_ARCHS)})")
        out += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    return out


def parse_archs(text: str) -> tuple[str, ...]:
    """"80,90a" -> ("80", "90a"); KernelBuildError for an empty list or a bad entry."""
    archs = tuple(a.strip() for a in text.split(",") if a.strip())
    if not archs:
        raise KernelBuildError(f"--arch: {text!r} names no SM (e.g. 80,90a)")
    arch_flags(archs)
    return archs


def compile_flags(archs: Sequence[str], cutlass_inc: Path) -> list[str]:
    return [*BASE_FLAGS, *arch_flags(archs), *(f"-I{d}" for d in INCLUDE_DIRS), f"-I{cutlass_inc}"]


def _digest(files: Sequence[Path], *texts: str) -> str:
    """sha256 (20 hex digits) over the files (their path under cpp/ and their bytes), then the texts."""
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(CPP_DIR).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    for t in texts:
        h.update(t.encode() + b"\0")
    return h.hexdigest()[:20]


def _flags_text(archs: Sequence[str]) -> str:
    # The include paths themselves are not hashed (they differ per checkout and virtualenv); which
    # directories of the tree are on the path is.
    dirs = [d.relative_to(CPP_DIR.parent).as_posix() for d in INCLUDE_DIRS]  # cpp/include, cpp/src either way
    return "\0".join([*BASE_FLAGS, *arch_flags(archs), *dirs])


def cache_key(archs: Sequence[str] = DEFAULT_ARCHS) -> str:
    """The library's key: every source and header, the flags and the target architectures. Computed from
    the tree alone (no nvcc, no CUTLASS headers), so a built library is found without them."""
    return _digest([*sources(), *headers()], _flags_text(archs))


def _object_key(src: Path, archs: Sequence[str], nvcc_line: str, cutlass: str) -> str:
    """A compiled object's key: its source, every header, the flags and the toolchain's versions (an
    object is only ever reused by a compile, which has the toolchain at hand)."""
    return _digest([src, *headers()], _flags_text(archs), cutlass, nvcc_line)


def default_cache_root() -> Path:
    env = os.environ.get("MOE_BUILD_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "moe_build" / "kernels"


# ---- verifying a built library ------------------------------------------------------------------

def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_library(lib: Path) -> BuildStamp:
    """The stamp of `lib` (build.json beside it) where the library's sha256 matches it; otherwise a one-line
    KernelBuildError naming the file. A library is loaded only after this."""
    lib = Path(lib)
    if not lib.is_file():
        raise KernelBuildError(f"{lib}: no such kernel library")
    stamp = BuildStamp.read(lib.with_name(STAMP_NAME))
    actual = file_sha256(lib)
    if actual != stamp.sha256:
        raise KernelBuildError(f"{lib}: sha256 {actual[:16]}... does not match its {STAMP_NAME} "
                               f"({stamp.sha256[:16]}...); refusing to load it")
    return stamp


def _cached(out: Path, key: str) -> tuple[bool, str | None]:
    """(usable, why not) for the library in `out`: usable where its stamp has `key` and its sha256. `why`
    is set only for a library that is there but refused (None when there is simply none)."""
    lib = out / LIB_NAME
    if not lib.is_file():
        return False, None
    try:
        stamp = verify_library(lib)
    except KernelBuildError as e:
        return False, str(e)
    if stamp.key != key:
        return False, None  # an older build in an explicit --out directory: rebuilt
    return True, None


# ---- building -----------------------------------------------------------------------------------

def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().split()[0]
    except (OSError, IndexError):
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def available_memory(meminfo: Path = Path("/proc/meminfo"), cgroup: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes this process may still take: /proc/meminfo's MemAvailable, lowered to what the cgroup's limit
    leaves (v2 memory.max - memory.current, v1 limit_in_bytes - usage_in_bytes) where a container sets one;
    None where neither can be read (not Linux)."""
    found: list[int] = []
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        limit, usage = _read_int(cgroup / limit_file), _read_int(cgroup / usage_file)
        if limit is not None and usage is not None and limit < 1 << 60:  # v1 writes a huge number for none
            found.append(max(0, limit - usage))
    return min(found) if found else None


def default_jobs(cpus: int | None = None, memory: int | None = None) -> int:
    """Parallel compiles by default: the CPU count (`cpus`, else os.cpu_count()), at most one per NVCC_JOB_BYTES
    of `memory` (else available_memory(); no bound where that is unknown), and at least one."""
    cpus = cpus or os.cpu_count() or 1
    memory = memory if memory is not None else available_memory()
    return max(1, min(cpus, memory // NVCC_JOB_BYTES) if memory is not None else cpus)


class _Compiles:
    """The nvcc processes running for one build, so that the first failure (or an interrupt) stops the others at
    once instead of waiting minutes for sources whose objects would be thrown away."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen] = set()
        self.stopped = False

    def run(self, cmd: list[str]) -> subprocess.CompletedProcess | None:
        """cmd's completed process, or None where the build was stopped before or while it ran. Its output goes to
        files, not pipes, and only cmd itself is waited for: a process it started that outlives it (one started
        just as stop() looked) cannot hold the build up."""
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            with self._lock:
                if self.stopped:
                    return None
                proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
                self._running.add(proc)
            try:
                proc.wait()
            finally:
                with self._lock:
                    self._running.discard(proc)
                    stopped = self.stopped
            if stopped:
                return None
            out.seek(0)
            err.seek(0)
            return subprocess.CompletedProcess(cmd, proc.returncode, out.read(), err.read())

    def stop(self) -> None:
        """No compile starts after this; the running ones are terminated, each with the processes it started (nvcc's
        cicc and ptxas). They stay in the caller's process group, so a signal to the group (a terminal's Ctrl-C,
        `kill -- -PGID`) still reaches them as well."""
        with self._lock:
            self.stopped = True
            for proc in self._running:
                for pid in [proc.pid, *_descendants(proc.pid)]:  # nvcc first: it would go on as its cicc ends
                    try:
                        os.kill(pid, signal.SIGTERM)
                    except (ProcessLookupError, PermissionError):
                        pass


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (its children, theirs, ...), from /proc (Linux; none found elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()  # after the command's name
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat_file.parent.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _killed_by(returncode: int) -> int | None:
    """The signal that killed a compile, from nvcc's exit status (negative, or 128 + the signal where nvcc
    reports a killed cicc or ptxas), else None."""
    return -returncode if returncode < 0 else returncode - 128 if returncode in (128 + 9, 128 + 15) else None


def _signal_text(sig: int) -> str:
    try:
        return f"signal {sig}, {signal.Signals(sig).name}"
    except ValueError:
        return f"signal {sig}"


def _compile_one(nvcc: str, flags: list[str], src: Path, obj: Path, cached: Path, compiles: _Compiles,
                 jobs: int) -> float | None:
    """Compiles src to obj, or copies the object cached under its own key (source + every header):
    editing one kernel file then recompiles that file alone. Returns seconds, None if reused or if the build
    was stopped (another source failed)."""
    if cached.is_file():
        shutil.copyfile(cached, obj)
        return None
    start = time.perf_counter()
    proc = compiles.run([nvcc, *flags, "-c", str(src), "-o", str(obj)])
    if proc is None:
        return None
    if proc.returncode != 0:
        # nvcc's front end writes its errors to stdout, the rest of the toolchain to stderr
        said = "\n".join(x.strip() for x in (proc.stdout, proc.stderr) if x.strip())
        sig = _killed_by(proc.returncode)
        if sig == signal.SIGKILL:
            raise KernelBuildError(
                f"nvcc was killed on {source_name(src)} ({_signal_text(sig)}), most often by the out-of-memory "
                f"killer: {jobs} compiles ran at once and one can take {NVCC_JOB_GB} GB; build with fewer "
                f"(`moe-build kernels -j 1`, which the tests and the runner then find in the cache)", said)
        if sig is not None:
            raise KernelBuildError(f"nvcc was killed on {source_name(src)} ({_signal_text(sig)})", said)
        first = next((line.strip() for line in said.splitlines() if "error" in line.lower()),
                     said.splitlines()[0].strip() if said else "no output")
        raise KernelBuildError(f"nvcc failed on {source_name(src)} (exit {proc.returncode}): {first}", said)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    shutil.copyfile(obj, tmp)
    os.replace(tmp, cached)
    return time.perf_counter() - start


def build(out_dir: Path | None = None, archs: Sequence[str] = DEFAULT_ARCHS, jobs: int | None = None,
          force: bool = False, progress: Progress | None = None) -> BuildResult:
    """Find or build the library. `out_dir` defaults to `<cache root>/<key>/`. A library there whose
    build.json has the current key and its sha256 is used as it is (no nvcc, no CUTLASS headers needed)
    unless `force`; anything else is compiled, `jobs` sources at a time (default: default_jobs(), the CPU count
    bounded by the memory available); the first failure stops the other compiles.
    `progress`, if given, is called with one line per step: "compiling gemm/sm90_abi.cu",
    "compiled gemm/sm90_abi.cu in 73.2 s (3 of 31)", "linking", "cached: <library>"."""
    lock = threading.Lock()

    def say(line: str) -> None:
        if progress is not None:
            with lock:
                progress(line)

    key = cache_key(archs)
    out = Path(out_dir) if out_dir is not None else default_cache_root() / key
    lib = out / LIB_NAME
    if not force:
        usable, refused = _cached(out, key)
        if usable:
            say(f"cached: {lib}")
            return BuildResult(lib, key, cached=True)
        if refused is not None:
            try:
                find_nvcc()
                cutlass_include_dir()
            except KernelBuildError as e:
                raise KernelBuildError(f"{refused}, and it cannot be rebuilt here: {e}") from None
            say(f"rebuilding: {refused}")

    nvcc = find_nvcc()
    cutlass_inc = cutlass_include_dir()
    nvcc_line, cutlass = nvcc_version(nvcc), cutlass_version()
    flags = compile_flags(archs, cutlass_inc)
    out.mkdir(parents=True, exist_ok=True)
    srcs = sources()
    objects = default_cache_root() / "objects"  # shared by every output folder: one compile per source version
    tag = "_".join(archs)  # objects of other architecture sets (a device's 90a beside the tests' 80,90a) stay
    cached = {s: objects / f"{object_stem(s)}-{tag}-{_object_key(s, archs, nvcc_line, cutlass)}.o" for s in srcs}
    times: dict[str, float | None] = {}
    to_compile = sum(not c.is_file() for c in cached.values())
    if jobs is None:
        cpus, memory = os.cpu_count() or 1, available_memory()
        jobs = default_jobs(cpus, memory)
        if memory is not None and to_compile and jobs < min(cpus, to_compile):
            say(f"compiling {jobs} at a time, not {cpus}: {memory / (1 << 30):.1f} GB of memory available, "
                f"{NVCC_JOB_GB} GB a compile")
    compiles = _Compiles()
    # Objects and the library go to a private directory first, so a concurrent reader never sees a
    # half-written library, and the stamp is written last: an interrupted build leaves none that matches.
    with tempfile.TemporaryDirectory(dir=out, prefix=".build-") as tmp:
        tmp_dir = Path(tmp)

        compiled = itertools.count(1)  # how far a long build has come, in its progress lines

        def compile_one(src: Path) -> float | None:
            if compiles.stopped:
                return None
            if not cached[src].is_file():
                say(f"compiling {source_name(src)}")
            secs = _compile_one(nvcc, flags, src, tmp_dir / f"{object_stem(src)}.o", cached[src], compiles, jobs)
            if compiles.stopped:
                return secs
            if secs is None:
                say(f"reused {source_name(src)} (cached object)")
            else:
                with lock:
                    n = next(compiled)
                say(f"compiled {source_name(src)} in {secs:.1f} s ({n} of {to_compile})")
            return secs

        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(compile_one, s): s for s in srcs}
            try:
                for fut in concurrent.futures.as_completed(futures):
                    times[source_name(futures[fut])] = fut.result()
            except BaseException:  # a compile failed, or Ctrl-C: no source waits on the others
                compiles.stop()
                for fut in futures:
                    fut.cancel()
                raise
        # Older objects of these sources for these architectures are superseded (and those named before the
        # architectures were, "<stem>-<key>.o"): the cache keeps one object per source and architecture set.
        keep = set(cached.values())
        for s in srcs:
            stem = object_stem(s)
            for old in [*objects.glob(f"{stem}-{tag}-*.o"), *objects.glob(f"{stem}-{'?' * 20}.o")]:
                if old not in keep:
                    old.unlink(missing_ok=True)
        say("linking")
        start = time.perf_counter()
        tmp_lib = tmp_dir / LIB_NAME
        link = subprocess.run([nvcc, "-shared", *arch_flags(archs), "-o", str(tmp_lib),
                               *(str(tmp_dir / f"{object_stem(s)}.o") for s in srcs)], capture_output=True, text=True)
        if link.returncode != 0:
            raise KernelBuildError(f"linking {LIB_NAME} failed (exit {link.returncode})", link.stderr.strip())
        link_s = time.perf_counter() - start
        stamp = BuildStamp(key, file_sha256(tmp_lib), nvcc_line, cutlass, tuple(archs),
                           datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
        os.replace(tmp_lib, lib)
        stamp.write(out / STAMP_NAME)
    return BuildResult(lib, key, cached=False, compile_seconds=dict(sorted(times.items())), link_seconds=link_s)


def build_command(out: Path | None = None, archs: str | Sequence[str] | None = None, jobs: int | None = None,
                  force: bool = False, echo: Progress = print) -> Path:
    """What `moe-build kernels [--out DIR] [--arch 80,90a] [-j N] [--force]` does: find or build the library,
    `echo`ing each step (`build`'s progress lines), then one last line saying where the library is.
    `archs` as "80,90a" or a sequence (default DEFAULT_ARCHS). Returns the library's path; a failure is a
    KernelBuildError."""
    arch_list = DEFAULT_ARCHS if archs is None else parse_archs(archs) if isinstance(archs, str) else tuple(archs)
    start = time.perf_counter()
    result = build(out, arch_list, jobs, force, progress=echo)
    if result.cached:
        echo(f"library (up to date, key {result.key}): {result.library}")
    else:
        echo(f"library (built in {time.perf_counter() - start:.1f} s, key {result.key}, archs "
             f"{','.join(arch_list)}): {result.library}")
    return result.library
