"""pyproject.toml lists every package: setuptools installs only the listed ones into a wheel (an editable install,
as the README's, finds unlisted subpackages anyway, so nothing else would notice a missing one); and a wheel carries
the kernel sources."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_is_listed() -> None:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "moe_build").rglob("__init__.py")}
    # plugins/ installs as moe_build.plugins
    assert (ROOT / tool["package-dir"]["moe_build.plugins"] / "__init__.py").exists()
    # cpp/ installs as moe_build.cpp (the kernel sources, data only)
    assert (ROOT / tool["package-dir"]["moe_build.cpp"] / "src").is_dir()
    assert set(tool["packages"]) == on_disk | {"moe_build.plugins", "moe_build.cpp"}


def test_a_wheel_carries_the_kernel_sources(tmp_path: Path) -> None:
    """`moe-build kernels` builds from a wheel too: the wheel carries cpp/ as moe_build/cpp (every source and header,
    CMakeLists.txt), and kernels.build, imported from the unpacked wheel, finds them there with the checkout's cache
    key (so a library built from either is found by the other)."""
    setuptools = pytest.importorskip("setuptools", reason="building the wheel without network needs setuptools")
    if tuple(int(x) for x in setuptools.__version__.split(".")[:2]) < (70, 1):  # bdist_wheel built in from 70.1
        pytest.importorskip("wheel", reason="setuptools before 70.1 builds wheels with the wheel package")
    from moe_build.kernels import build

    # from a copy of what the wheel is made of: setuptools' build/ folder in the checkout would carry stale files
    src = tmp_path / "src"
    for folder in ("moe_build", "plugins", "cpp"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for file in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / file, src / file)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist")], check=True, capture_output=True, text=True)
    (wheel,) = (tmp_path / "dist").glob("moe_build-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        z.extractall(tmp_path / "site")
    on_disk = {f"moe_build/cpp/{p.relative_to(ROOT / 'cpp').as_posix()}" for p in [*build.sources(), *build.headers()]}
    assert on_disk <= names and "moe_build/cpp/CMakeLists.txt" in names
    probe = ("import json; from moe_build.kernels import build as b; "
             "print(json.dumps([str(b.CPP_DIR), len(b.sources()), len(b.headers()), b.cache_key()]))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
    cpp_dir, n_src, n_hdr, key = json.loads(out.stdout)
    assert Path(cpp_dir) == tmp_path / "site" / "moe_build" / "cpp"
    assert (n_src, n_hdr, key) == (len(build.sources()), len(build.headers()), build.cache_key())
