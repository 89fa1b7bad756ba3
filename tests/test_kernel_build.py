"""The kernel library builds with nvcc and exports exactly the C ABI of moe_build_kernels.h, the ctypes
binding agrees with the header (function names, argument counts, enum values, the tactic struct), the
library decides nothing from the environment, and a built library is found and checked without the
toolchain.

The real build needs nvcc and the nvidia-cutlass headers, not a GPU: CI compiles every cpp/src/**/*.cu
here, so a kernel that does not compile fails CI. It is cached (one per session at most; the CUTLASS
GEMM source takes a few minutes on two cores). The cache tests run a stand-in nvcc on small fake files
under a temporary $MOE_BUILD_CACHE.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moe_build import kernels
from moe_build.errors import MoeBuildError
from moe_build.kernels import build as kernel_build
from moe_build.kernels import library

HEADER_TEXT = kernel_build.HEADER.read_text()


def header_functions() -> dict[str, int]:
    """Every function the header declares -> its parameter count."""
    decls = re.findall(r"^\s*(?:mb_status|size_t|int|const char\s*\*)\s*(mb_\w+)\s*\(([^)]*)\)\s*;", HEADER_TEXT,
                       flags=re.MULTILINE)
    return {name: 0 if params.strip() in ("", "void") else params.count(",") + 1 for name, params in decls}


def header_enum(prefix: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(rf"\b{prefix}(\w+)\s*=\s*(\d+)", HEADER_TEXT)}


def header_struct(name: str) -> list[tuple[str, str]]:
    """(C type, field name) of each field of `typedef struct name { ... } name;`, in order."""
    body = re.search(rf"typedef struct {name}\s*\{{(.*?)\}}\s*{name}\s*;", HEADER_TEXT, flags=re.DOTALL)
    assert body, f"struct {name} not found in the header"
    text = re.sub(r"/\*.*?\*/", "", body.group(1), flags=re.DOTALL)
    return [(m.group(1), m.group(2)) for m in re.finditer(r"(\w+)\s+(\w+)\s*;", text)]


def test_header_parses() -> None:
    funcs = header_functions()
    assert "mb_last_error" in funcs and "mb_routing" in funcs and len(funcs) >= 13


def test_binding_matches_header() -> None:
    funcs = header_functions()
    assert set(kernels.SIGNATURES) == set(funcs)
    for name, count in funcs.items():
        assert len(kernels.SIGNATURES[name][1]) == count, name


@pytest.mark.parametrize("prefix,enum", [("MB_ERR_", kernels.Status), ("MB_ACT_", kernels.Activation),
                                         ("MB_WEIGHTS_", kernels.WeightLayout), ("MB_GEMM_", kernels.GemmKernel),
                                         ("MB_TILE_", kernels.GemmTile), ("MB_LAUNCH_", kernels.GemmLaunch),
                                         ("MB_OUTPUT_L2_", kernels.OutputL2), ("MB_WOQ_", kernels.WoqKind),
                                         ("MB_INPUT_", kernels.WoqInput), ("MB_STEP_", kernels.StepTactic)])
def test_enums_match_header(prefix: str, enum: type) -> None:
    values = header_enum(prefix)
    if prefix == "MB_ERR_":
        values["OK"] = 0
    assert values == {m.name: m.value for m in enum}


@pytest.mark.parametrize("enum", [kernels.DType, kernels.Routing])
def test_dtype_and_routing_enums_match_header(enum: type) -> None:
    values = header_enum("MB_")
    assert {m.name: m.value for m in enum} == {m.name: values.get(m.name) for m in enum}


def test_tactic_struct_matches_header() -> None:
    """mb_gemm_tactic's fields, in order and as int32, are GemmTacticStruct's: it is passed by value."""
    fields = header_struct("mb_gemm_tactic")
    assert [name for _, name in fields] == [name for name, _ in kernels.GemmTacticStruct._fields_]
    assert all(ctype == "int32_t" for ctype, _ in fields)
    assert all(ct is ctypes.c_int32 for _, ct in kernels.GemmTacticStruct._fields_)


def test_tile_names_are_the_planners() -> None:
    """tile_name (gemm/tactic.cuh, the library's messages) spells every mb_gemm_tile as the planner does, and the
    tactic struct of each planner tile carries that enum value."""
    from moe_build.kernels.ops import tactic_struct
    from moe_build.planner.tactics.tactic import MMA_TILES, WGMMA_TILES
    text = (kernel_build.SRC_DIR / "gemm" / "tactic.cuh").read_text()
    spelled = {kernels.GemmTile[m.group(1)]: m.group(2)
               for m in re.finditer(r'case MB_TILE_(\w+): return "([^"]+)";', text)}
    assert set(spelled) == set(kernels.GemmTile)
    for tile in WGMMA_TILES:
        assert spelled[kernels.GemmTile(tactic_struct(f"wgmma:{tile}:plain:plain").tile)] == tile
    for tile in MMA_TILES:
        assert spelled[kernels.GemmTile(tactic_struct(f"mma:{tile}:plain:plain").tile)] == tile
    assert spelled[kernels.GemmTile(tactic_struct("decode:staged_ksplit2:plain:plain").tile)] == "staged"
    assert spelled[kernels.GemmTile(tactic_struct("decode:digits_ksplit2:plain:plain").tile)] == "digits"
    assert kernels.GemmTile(tactic_struct("decode:ksplit2:plain:plain").tile) is kernels.GemmTile.NONE


def test_token_digits_record_size_matches_header() -> None:
    """A token digits record's bytes (MB_TOKEN_DIGITS_BATCH_BYTES) as the planner, the wrappers and the runner count
    them (tactics.woq.DIGITS_GROUP_BYTES)."""
    from moe_build.planner.tactics.woq import DIGITS_GROUP_BYTES
    text = (kernel_build.INCLUDE_DIR / "moe_build_kernels.h").read_text()
    value = int(re.search(r"#define MB_TOKEN_DIGITS_BATCH_BYTES (\d+)", text).group(1))
    assert value == DIGITS_GROUP_BYTES


def test_every_gemm_entry_point_takes_a_tactic() -> None:
    for name in ("mb_grouped_gemm_sm80", "mb_grouped_gemm_sm90", "mb_grouped_gemm_sm90_finalize",
                 "mb_grouped_gemm_sm90_gated"):
        assert kernels.GemmTacticStruct in kernels.SIGNATURES[name][1], name


def test_library_reads_no_environment() -> None:
    """The planner chooses every tactic: no source of the library reads an environment variable."""
    readers = [p.relative_to(kernel_build.SRC_DIR).as_posix() for p in sorted(kernel_build.SRC_DIR.rglob("*"))
               if p.is_file() and "getenv" in p.read_text(errors="replace")]
    assert not readers, f"getenv in {readers}"


def test_sources_and_objects_are_found_recursively() -> None:
    names = [kernel_build.source_name(s) for s in kernel_build.sources()]
    assert "gemm/sm90_abi.cu" in names and "stages/fc1_activation.cu" in names and "common/status.cu" in names
    stems = [kernel_build.object_stem(s) for s in kernel_build.sources()]
    assert len(set(stems)) == len(stems) and "gemm_sm90_abi" in stems
    headers = {h.relative_to(kernel_build.CPP_DIR).as_posix() for h in kernel_build.headers()}
    assert {"include/moe_build_kernels.h", "src/common/common.cuh", "src/gemm/mma.cuh"} <= headers


# ---- finding a built library (CPU, a stand-in nvcc) -----------------------------------------------

FAKE_NVCC = """#!{python}
import pathlib, sys
args = sys.argv[1:]
if args == ["--version"]:
    print("nvcc: NVIDIA (R) Cuda compiler driver")
    print("Cuda compilation tools, release 99.9, V99.9.1")
    sys.exit(0)
out = pathlib.Path(args[args.index("-o") + 1])
out.write_bytes(b"not an ELF file: " + " ".join(args).encode())
"""


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("MOE_BUILD_CACHE", str(root))
    monkeypatch.delenv("MOE_BUILD_KERNELS_LIB", raising=False)
    monkeypatch.setattr(library, "_lib", None)
    return root


@pytest.fixture
def fake_toolchain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in nvcc (writes small fake objects and libraries) and an empty CUTLASS include dir."""
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(FAKE_NVCC.format(python=sys.executable))
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(kernel_build, "find_nvcc", lambda: str(nvcc))
    monkeypatch.setattr(kernel_build, "cutlass_include_dir", lambda: tmp_path / "cutlass")
    return nvcc


def no_toolchain(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> None:
        raise AssertionError("the toolchain was asked for")
    monkeypatch.setattr(kernel_build, "find_nvcc", refuse)
    monkeypatch.setattr(kernel_build, "cutlass_include_dir", refuse)
    monkeypatch.setattr(kernel_build, "nvcc_version", refuse)


def test_cache_key_needs_no_toolchain(monkeypatch: pytest.MonkeyPatch) -> None:
    no_toolchain(monkeypatch)
    key = kernel_build.cache_key(kernel_build.DEFAULT_ARCHS)
    assert re.fullmatch(r"[0-9a-f]{20}", key)
    assert kernel_build.cache_key(("80",)) != key


def test_build_writes_a_stamp_and_reports_progress(cache_root: Path, fake_toolchain: Path) -> None:
    lines: list[str] = []
    result = kernel_build.build(progress=lines.append)
    assert not result.cached and result.library == cache_root / result.key / kernel_build.LIB_NAME
    stamp = json.loads((result.library.parent / kernel_build.STAMP_NAME).read_text())
    assert stamp["key"] == result.key and stamp["sha256"] == kernel_build.file_sha256(result.library)
    assert stamp["nvcc"] == "Cuda compilation tools, release 99.9, V99.9.1"
    assert stamp["archs"] == list(kernel_build.DEFAULT_ARCHS) and stamp["cutlass"] and stamp["created"]
    for src in kernel_build.sources():
        name = kernel_build.source_name(src)
        assert f"compiling {name}" in lines
        assert any(re.fullmatch(rf"compiled {re.escape(name)} in \d+\.\d s \(\d+ of \d+\)", line) for line in lines), name
    n = len(kernel_build.sources())
    assert sorted(int(re.search(r"\((\d+) of (\d+)\)$", x).group(1)) for x in lines if x.startswith("compiled ")) \
        == list(range(1, n + 1)) and all(x.endswith(f" of {n})") for x in lines if x.startswith("compiled "))
    assert lines[-1] == "linking"
    assert set(result.compile_seconds) == {kernel_build.source_name(s) for s in kernel_build.sources()}
    objects = sorted(p.name for p in (cache_root / "objects").iterdir())
    assert len(objects) == len(kernel_build.sources()) and any(o.startswith("gemm_sm90_abi-") for o in objects)


def test_objects_of_each_architecture_set_are_kept(cache_root: Path, fake_toolchain: Path, tmp_path: Path) -> None:
    """A library for one GPU (--arch 90a) and the default one (80,90a) share the object cache without evicting each
    other's objects; objects named before the architectures were are removed."""
    objects = cache_root / "objects"
    objects.mkdir(parents=True)
    legacy = objects / "gemm_sm90_abi-0123456789abcdef0123.o"
    legacy.write_bytes(b"old")
    kernel_build.build(tmp_path / "a", ("90a",))
    kernel_build.build(tmp_path / "b")
    n = len(kernel_build.sources())
    names = sorted(p.name for p in objects.iterdir())
    assert len(names) == 2 * n and not legacy.exists()
    assert sum("-90a-" in x for x in names) == n and sum("-80_90a-" in x for x in names) == n
    lines: list[str] = []
    kernel_build.build(tmp_path / "c", ("90a",), progress=lines.append)
    assert not any(line.startswith("compiling") for line in lines) and sum("reused" in x for x in lines) == n


def test_cached_library_is_found_without_the_toolchain(cache_root: Path, fake_toolchain: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    built = kernel_build.build()
    no_toolchain(monkeypatch)
    lines: list[str] = []
    again = kernel_build.build(progress=lines.append)
    assert again.cached and again.library == built.library and again.key == built.key
    assert lines == [f"cached: {built.library}"]


def test_a_tampered_library_is_refused(cache_root: Path, fake_toolchain: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    built = kernel_build.build()
    built.library.write_bytes(built.library.read_bytes() + b"\0")
    with pytest.raises(kernel_build.KernelBuildError) as err:
        kernel_build.verify_library(built.library)
    assert str(built.library) in str(err.value) and "does not match" in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(kernel_build.KernelBuildError, match="does not match") as err:
        library.load_library(built.library)
    assert "\n" not in str(err.value)
    no_toolchain(monkeypatch)

    def missing_nvcc() -> str:
        raise kernel_build.KernelBuildError("nvcc not found: put the CUDA toolkit's nvcc on PATH")
    monkeypatch.setattr(kernel_build, "find_nvcc", missing_nvcc)
    with pytest.raises(kernel_build.KernelBuildError) as err:
        kernel_build.build()
    message = str(err.value)
    assert str(built.library) in message and "does not match" in message and "nvcc not found" in message
    assert "\n" not in message


def test_a_tampered_library_is_rebuilt_where_it_can_be(cache_root: Path, fake_toolchain: Path) -> None:
    built = kernel_build.build()
    built.library.write_bytes(b"tampered")
    lines: list[str] = []
    again = kernel_build.build(progress=lines.append)
    assert not again.cached and again.library == built.library
    assert lines[0].startswith(f"rebuilding: {built.library}") and "does not match" in lines[0]
    assert kernel_build.verify_library(again.library).sha256 == kernel_build.file_sha256(again.library)
    assert all(line.startswith("reused ") for line in lines if " gemm/" in line or " stages/" in line)


def test_a_library_without_its_stamp_is_rebuilt(cache_root: Path, fake_toolchain: Path) -> None:
    built = kernel_build.build()
    (built.library.parent / kernel_build.STAMP_NAME).unlink()
    again = kernel_build.build()
    assert not again.cached
    kernel_build.verify_library(again.library)


def test_prebuilt_library_needs_its_stamp(cache_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tmp_path / "prebuilt" / kernel_build.LIB_NAME
    lib.parent.mkdir()
    lib.write_bytes(b"a library")
    monkeypatch.setenv("MOE_BUILD_KERNELS_LIB", str(lib))
    no_toolchain(monkeypatch)
    with pytest.raises(kernel_build.KernelBuildError) as err:
        library.load_library()
    message = str(err.value)
    assert "\n" not in message
    assert f"MOE_BUILD_KERNELS_LIB={lib}" in message and kernel_build.STAMP_NAME in message
    assert "moe-build kernels --out DIR" in message
    # A stamp of other bytes is refused the same way; a matching one passes the check (and only then
    # is the file handed to the dynamic loader, which rejects these bytes).
    stamp = kernel_build.BuildStamp("k", "0" * 64, "nvcc", "cutlass", ("90a",), "now")
    stamp.write(lib.with_name(kernel_build.STAMP_NAME))
    with pytest.raises(kernel_build.KernelBuildError, match="does not match"):
        library.load_library()
    kernel_build.BuildStamp("k", kernel_build.file_sha256(lib), "nvcc", "cutlass", ("90a",), "now").write(
        lib.with_name(kernel_build.STAMP_NAME))
    assert kernel_build.verify_library(lib).key == "k"
    with pytest.raises(OSError):
        library.load_library()


def test_build_command_ends_with_the_library(cache_root: Path, fake_toolchain: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    lines: list[str] = []
    lib = kernel_build.build_command(out, "80,90a", jobs=2, echo=lines.append)
    assert lib == out / kernel_build.LIB_NAME and kernel_build.verify_library(lib)
    assert lines[-1].startswith("library (built in ") and lines[-1].endswith(f": {lib}")
    no_toolchain(monkeypatch)
    lines.clear()
    assert kernel_build.build_command(out, ("80", "90a"), echo=lines.append) == lib
    assert lines == [f"cached: {lib}", lines[-1]] and lines[-1].endswith(f": {lib}")
    with pytest.raises(kernel_build.KernelBuildError, match="--arch"):
        kernel_build.build_command(out, "sm90", echo=lines.append)


def test_kernels_command(cache_root: Path, fake_toolchain: Path, tmp_path: Path) -> None:
    """`moe-build kernels --out DIR` builds there with progress on stderr and ends saying where; a toolchain
    failure is the CLI's one-line error (exit 2)."""
    from click.testing import CliRunner

    from moe_build.cli import cli
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["kernels", "--out", str(out), "--arch", "90a", "-j", "1"])
    assert r.exit_code == 0, r.output
    printed = r.stderr.strip().splitlines()
    assert "compiling gemm/sm90_abi.cu" in printed and printed[-1].endswith(str(out / kernel_build.LIB_NAME))
    assert json.loads((out / kernel_build.STAMP_NAME).read_text())["archs"] == ["90a"]
    bad = CliRunner().invoke(cli, ["kernels", "--out", str(out), "--arch", "sm90"], standalone_mode=False)
    assert isinstance(bad.exception, MoeBuildError) and "--arch" in str(bad.exception)


def test_missing_nvcc_is_a_clear_error(cache_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    for var in ("CUDACXX", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(kernel_build.KernelBuildError, match="nvcc not found"):
        kernel_build.build()


# A stand-in nvcc that fails on one source the way FAIL says (error: a compile error on stdout, kill: killed by
# SIGKILL, exit137: nvcc reporting a killed cicc), once WAIT_FOR other compiles have started; the others it
# compiles in a child process that sleeps SLOW seconds (as nvcc runs cicc), marking in STARTED that the child runs
# and in DONE each source it finished.
FAILING_NVCC = """#!{python}
import os, pathlib, signal, subprocess, sys, time
args = sys.argv[1:]
if args == ["--version"]:
    print("Cuda compilation tools, release 99.9, V99.9.1")
    sys.exit(0)
src = args[args.index("-c") + 1]
started = pathlib.Path("{done}").with_name("started")
if src.endswith("{fail_on}"):
    deadline = time.monotonic() + 20
    while len(list(started.iterdir())) < {wait_for} and time.monotonic() < deadline:
        time.sleep(0.05)
    if "{fail}" == "error":
        print(src + "(12): error: identifier \\"undefined_thing\\" is undefined")
        print("1 error detected in the compilation of " + src)
        sys.exit(1)
    if "{fail}" == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(137)
if {slow}:  # a child of its own, as nvcc runs cicc: stopping the build must stop it too
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep({slow})  # fake-cicc-sleeper"])
    pathlib.Path(started, pathlib.Path(src).name).write_text(str(child.pid))
    child.wait()
pathlib.Path(args[args.index("-o") + 1]).write_bytes(b"object")
pathlib.Path("{done}", pathlib.Path(src).name).write_text("done")
"""


def running(pid: int) -> bool:
    """Whether process `pid` runs (a zombie waiting for whoever adopted it to reap it does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def failing_toolchain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: str, slow: float,
                      wait_for: int = 0) -> Path:
    """The FAILING_NVCC stand-in failing on common/status.cu, the first source in path order (so compiled first),
    once `wait_for` others have started their child; returns the folder its finished sources land in."""
    done = tmp_path / "done"
    done.mkdir()
    (tmp_path / "started").mkdir()
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(FAILING_NVCC.format(python=sys.executable, fail_on="common/status.cu", fail=fail, slow=slow,
                                        wait_for=wait_for, done=done))
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(kernel_build, "find_nvcc", lambda: str(nvcc))
    monkeypatch.setattr(kernel_build, "cutlass_include_dir", lambda: tmp_path / "cutlass")
    return done


def test_a_compile_error_stops_the_build_at_once(cache_root: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The first failing source ends the build without waiting for the others (each would take 60 s here), its
    message is one line naming the source and the compiler's error, and the compiler's whole output comes with it."""
    done = failing_toolchain(tmp_path, monkeypatch, "error", slow=60, wait_for=3)  # the 3 other compiles of 4 jobs
    assert kernel_build.source_name(kernel_build.sources()[0]) == "common/status.cu"
    start = time.monotonic()
    with pytest.raises(kernel_build.KernelBuildError) as info:
        kernel_build.build(jobs=4)
    assert time.monotonic() - start < 30
    e = info.value
    assert "\n" not in e.message and e.message.startswith("nvcc failed on common/status.cu (exit 1): ")
    assert 'identifier "undefined_thing" is undefined' in e.message
    assert "1 error detected" in e.output and str(e) == f"{e.message}\n{e.output}"
    assert not list(done.iterdir())  # the slow compiles were stopped, not finished
    children = [int(p.read_text()) for p in (tmp_path / "started").iterdir()]
    assert len(children) == 3
    time.sleep(0.5)
    assert not [pid for pid in children if running(pid)], "a compile's child outlived the build"
    assert not (cache_root / "objects").exists() or not list((cache_root / "objects").iterdir())


@pytest.mark.parametrize("fail", ["kill", "exit137"])
def test_a_killed_compile_says_memory_and_how_to_build_with_less(cache_root: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch, fail: str) -> None:
    failing_toolchain(tmp_path, monkeypatch, fail, slow=0)
    with pytest.raises(kernel_build.KernelBuildError) as info:
        kernel_build.build(jobs=3)
    message = info.value.message
    assert message.startswith("nvcc was killed on common/status.cu (signal 9, SIGKILL)"), message
    assert "out-of-memory" in message and "3 compiles ran at once" in message and "-j 1" in message


def test_kernels_command_prints_the_compiler_output_then_one_line(cache_root: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    failing_toolchain(tmp_path, monkeypatch, "error", slow=0)
    r = subprocess.run([sys.executable, "-c", "from moe_build.cli import main; main()", "kernels", "--out",
                        str(tmp_path / "out"), "-j", "2"], capture_output=True, text=True,
                       env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "CUDACXX": "",
                            "MOE_BUILD_CACHE": str(cache_root)})
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert "1 error detected in the compilation of" in r.stderr
    assert lines[-1].startswith("moe-build: error: kernels: nvcc failed on common/status.cu (exit 1): ")
    assert "Traceback" not in r.stderr and not (tmp_path / "out" / kernel_build.LIB_NAME).exists()


def test_default_jobs_leave_each_compile_its_memory() -> None:
    gb = 1 << 30
    per = kernel_build.NVCC_JOB_GB
    assert kernel_build.default_jobs(cpus=16, memory=4 * per * gb + gb) == 4
    assert kernel_build.default_jobs(cpus=2, memory=64 * per * gb) == 2
    assert kernel_build.default_jobs(cpus=8, memory=gb) == 1
    assert kernel_build.default_jobs(cpus=8, memory=None) in (8, max(1, min(8, (kernel_build.available_memory() or 0)
                                                                              // kernel_build.NVCC_JOB_BYTES)))


def test_a_build_short_of_memory_compiles_fewer_at_once_and_says_so(cache_root: Path, fake_toolchain: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_build, "available_memory", lambda: 3 << 30)
    monkeypatch.setattr(kernel_build.os, "cpu_count", lambda: 8)
    lines: list[str] = []
    kernel_build.build(progress=lines.append)
    assert lines[0] == f"compiling 1 at a time, not 8: 3.0 GB of memory available, {kernel_build.NVCC_JOB_GB} GB a compile"
    lines.clear()
    shutil.rmtree(cache_root / "objects")
    kernel_build.build(jobs=2, force=True, progress=lines.append)  # an explicit -j is the user's: not remarked on
    assert any(line.startswith("compiling ") for line in lines) and not any("at a time" in line for line in lines)


def test_available_memory_takes_the_container_limit(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       33554432 kB\nMemAvailable:   16777216 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    assert kernel_build.available_memory(meminfo, cgroup) == 16 << 30  # no cgroup files: the machine's
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text(f"{1 << 30}\n")
    assert kernel_build.available_memory(meminfo, cgroup) == 16 << 30  # no limit
    (cgroup / "memory.max").write_text(f"{6 << 30}\n")
    assert kernel_build.available_memory(meminfo, cgroup) == 5 << 30  # the limit less what is used
    assert kernel_build.available_memory(tmp_path / "none", tmp_path / "none") is None


# ---- the real build (nvcc and the CUTLASS headers) ----------------------------------------------

def _toolchain_ready() -> bool:
    try:
        kernel_build.find_nvcc()
        kernel_build.cutlass_include_dir()
    except kernel_build.KernelBuildError:
        return False
    return True


needs_nvcc = pytest.mark.skipif(not _toolchain_ready(), reason="needs nvcc and the nvidia-cutlass headers")


@pytest.fixture(scope="session")
def built() -> kernel_build.BuildResult:
    return kernel_build.build()


@needs_nvcc
@pytest.mark.slow
def test_library_exports_every_header_function(built: kernel_build.BuildResult) -> None:
    lib = ctypes.CDLL(str(built.library))
    missing = [name for name in header_functions() if not hasattr(lib, name)]
    assert not missing, f"{built.library} lacks {missing}"
    if shutil.which("nm"):
        out = subprocess.run(["nm", "-D", "--defined-only", str(built.library)], capture_output=True, text=True,
                             check=True).stdout
        exported = set(re.findall(r"\bT (mb_\w+)$", out, flags=re.MULTILINE))
        assert exported == set(header_functions()), "exported mb_* symbols differ from the header"


@needs_nvcc
@pytest.mark.slow
def test_built_library_matches_its_stamp(built: kernel_build.BuildResult) -> None:
    stamp = kernel_build.verify_library(built.library)
    assert stamp.key == built.key and stamp.archs == kernel_build.DEFAULT_ARCHS
    assert "release" in stamp.nvcc


@needs_nvcc
@pytest.mark.slow
def test_rebuild_is_cached(built: kernel_build.BuildResult, monkeypatch: pytest.MonkeyPatch) -> None:
    no_toolchain(monkeypatch)
    again = kernel_build.build()
    assert again.cached and again.library == built.library and again.key == built.key


@pytest.mark.parametrize("arch", ["sm90", "75", "90", "100a", "120"])
def test_an_arch_the_kernels_are_not_written_for_is_refused_before_compiling(arch: str) -> None:
    """75 lacks the bf16 mma, plain 90 compiles the wgmma kernels to a trap, and the SM 10x / 12x builds are not
    written: nvcc would fail (or worse, succeed) minutes into the build."""
    with pytest.raises(kernel_build.KernelBuildError, match=f"--arch: '{arch}' .*allowed: 80, 86, 89, 90a"):
        kernel_build.parse_archs(f"80,{arch}")


def test_a_failed_compile_says_what_nvcc_said(tmp_path: Path) -> None:
    """nvcc's front end writes its errors (a template that does not instantiate) to stdout: the build's error carries
    them, not an empty message."""
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(f"#!{sys.executable}\nimport sys\nprint('kernel.cu(12): error: class has no member \"kFastOnly\"')\n"
                    "sys.exit(1)\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    src = kernel_build.SRC_DIR / "gemm" / "fp8_sm90.cu"  # read by no one: the stand-in nvcc fails at once
    with pytest.raises(kernel_build.KernelBuildError, match=r"(?s)gemm/fp8_sm90.cu \(exit 1\).*has no member \"kFastOnly\""):
        kernel_build._compile_one(str(nvcc), [], src, tmp_path / "kernel.o", tmp_path / "cache" / "kernel.o",
                                  kernel_build._Compiles(), jobs=1)
    assert not (tmp_path / "cache" / "kernel.o").exists()
