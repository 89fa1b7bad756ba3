"""The kernel library builds with nvcc and exports exactly the C ABI of moe_build_kernels.h, and
the ctypes binding agrees with the header (function names, argument counts, enum values).

Needs nvcc and the nvidia-cutlass headers, not a GPU: CI compiles every cpp/src/*.cu here, so a
kernel that does not compile fails CI. The build is cached (one per session at most; the
CUTLASS GEMM sources take about a minute each on two cores).
"""
from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import pytest

from moe_build import kernel_build, kernels

HEADER_TEXT = kernel_build.HEADER.read_text()


def header_functions() -> dict[str, int]:
    """Every function the header declares -> its parameter count."""
    decls = re.findall(r"^\s*(?:mb_status|size_t|int|const char\s*\*)\s*(mb_\w+)\s*\(([^)]*)\)\s*;", HEADER_TEXT,
                       flags=re.MULTILINE)
    return {name: 0 if params.strip() in ("", "void") else params.count(",") + 1 for name, params in decls}


def header_enum(prefix: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(rf"\b{prefix}(\w+)\s*=\s*(\d+)", HEADER_TEXT)}


def test_header_parses() -> None:
    funcs = header_functions()
    assert "mb_last_error" in funcs and "mb_routing" in funcs and len(funcs) >= 13


def test_binding_matches_header() -> None:
    funcs = header_functions()
    assert set(kernels.SIGNATURES) == set(funcs)
    for name, count in funcs.items():
        assert len(kernels.SIGNATURES[name][1]) == count, name


@pytest.mark.parametrize("prefix,enum", [("MB_ERR_", kernels.Status), ("MB_ACT_", kernels.Activation),
                                         ("MB_WEIGHTS_", kernels.WeightLayout)])
def test_enums_match_header(prefix: str, enum: type) -> None:
    values = header_enum(prefix)
    if prefix == "MB_ERR_":
        values["OK"] = 0
    assert values == {m.name: m.value for m in enum}


@pytest.mark.parametrize("enum", [kernels.DType, kernels.Routing])
def test_dtype_and_routing_enums_match_header(enum: type) -> None:
    values = header_enum("MB_")
    assert {m.name: m.value for m in enum} == {m.name: values.get(m.name) for m in enum}


def test_missing_nvcc_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    for var in ("CUDACXX", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(kernel_build.KernelBuildError, match="nvcc not found"):
        kernel_build.build()


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
def test_rebuild_is_cached(built: kernel_build.BuildResult) -> None:
    again = kernel_build.build()
    assert again.cached and again.library == built.library and again.key == built.key


@needs_nvcc
def test_bad_arch_is_rejected() -> None:
    with pytest.raises(kernel_build.KernelBuildError, match="--arch"):
        kernel_build.arch_flags(["sm90"])
