"""The layering of docs/architecture.md, stated once as import contracts (pyproject.toml's
[tool.importlinter]) and enforced here: a new cycle, a wing importing up, SQL or click outside
their home, or a pure module doing I/O fails this test with import-linter's account of it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint(config: Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """lint-imports on ``config``, reading the packages found in ``cwd`` (the first entry of
    its sys.path, before the installed ones)."""
    return subprocess.run(
        [str(LINT_IMPORTS), str(config), "--no-cache"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_import_contracts_are_kept() -> None:
    run = lint(ROOT / "pyproject.toml")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


def test_a_cycle_or_an_import_upwards_breaks_them(tmp_path: Path) -> None:
    """The contracts can fail: a copy of the code with a model module importing the CLI
    (a wing crossed, and with the CLI's imports, a cycle) is refused."""
    copy = tmp_path / "src"
    for package in ("supervisor", "workers"):
        shutil.copytree(ROOT / package, copy / package)
    model = copy / "supervisor" / "model.py"
    model.write_text(model.read_text() + "\nfrom supervisor import cli  # noqa: E402\n")
    config = copy / "pyproject.toml"
    config.write_text((ROOT / "pyproject.toml").read_text())
    run = lint(config, cwd=copy)
    assert run.returncode != 0
    assert "supervisor's wings: imports point down BROKEN" in run.stdout


def test_every_module_of_supervisor_sits_in_a_layer() -> None:
    """A module left out of the layers would be free to import anything: each of
    supervisor's own modules and packages is named in one."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (wings,) = [c for c in config["contracts"] if c["type"] == "layers"]
    named = {name.strip() for layer in wings["layers"] for name in layer.split("|")}
    children = {
        path.stem if path.is_file() else path.name
        for path in (ROOT / "supervisor").iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").exists()
    }
    assert children == named, f"in no layer: {children - named}; gone: {named - children}"
