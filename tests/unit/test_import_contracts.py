"""The layering of docs/architecture.md, stated once as import contracts (pyproject.toml's
[tool.importlinter]) and enforced here: a new cycle, a wing importing up, SQL or click outside
their home, or a pure module doing I/O fails this test with import-linter's account of it."""

from __future__ import annotations

import shutil
import subprocess
import sys
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
