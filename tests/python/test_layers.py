"""The frontend's layers: each module of python/genie imports only modules of the layers below
it (pyproject.toml [tool.importlinter], docs/frontend.md "Layers"), checked with import-linter."""
from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _lint_imports(config: pathlib.Path, cwd: pathlib.Path = ROOT / "python") -> subprocess.CompletedProcess:
    command = shutil.which("lint-imports", path=str(pathlib.Path(sys.executable).parent)) or "lint-imports"
    return subprocess.run([command, str(config), "--no-cache"], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_python_genie_keeps_its_layers():
    out = _lint_imports(ROOT / "pyproject.toml")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "1 kept, 0 broken" in out.stdout, out.stdout[-2000:]


def test_the_contract_catches_an_import_upward(tmp_path):
    # The same contract on a copy of the package (renamed: the installed genie would be found
    # first) in which the IR imports the runtime.
    package = tmp_path / "genie_copy"
    shutil.copytree(ROOT / "python/genie", package, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    graph = package / "graph.py"
    graph.write_text(graph.read_text() + "\nfrom . import runtime as _upward  # noqa\n")
    config = tmp_path / "pyproject.toml"
    config.write_text(re.sub(r"\bgenie(?=[.\"])", "genie_copy", (ROOT / "pyproject.toml").read_text()))
    out = _lint_imports(config, cwd=tmp_path)
    assert out.returncode != 0, out.stdout[-3000:]
    assert "genie_copy.graph is not allowed to import genie_copy.runtime" in out.stdout, out.stdout[-3000:]
