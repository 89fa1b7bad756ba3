"""pyproject.toml lists every package: setuptools installs only the listed ones into a wheel (an editable install,
as the README's, finds unlisted subpackages anyway, so nothing else would notice a missing one)."""
from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_is_listed() -> None:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "moe_build").rglob("__init__.py")}
    # plugins/ installs as moe_build.plugins
    assert (ROOT / tool["package-dir"]["moe_build.plugins"] / "__init__.py").exists()
    assert set(tool["packages"]) == on_disk | {"moe_build.plugins"}
