"""`--help` of every program the project builds or ships prints its help and exits 0, and does
nothing else: no file appears in the working directory, nothing starts (each runs in an empty
directory, with a time limit)."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("GENIE_BUILD_DIR", ROOT / "build")) / "bin"


def _binaries() -> list[pathlib.Path]:
    return sorted(p for p in BIN.iterdir() if p.is_file() and os.access(p, os.X_OK))


def _programs() -> list[tuple[str, list[str]]]:
    programs = [(p.name, [str(p)]) for p in _binaries()]
    programs += [(f"python -m {m}", [sys.executable, "-m", *m.split()]) for m in ("genie", "genie config", "genie explain", "genie.demo",
                                                                                     "genie.compile.worker")]
    programs += [(str(p.relative_to(ROOT)), [sys.executable, str(p)]) for p in sorted((ROOT / "perf").rglob("*.py"))]
    programs += [(str(p.relative_to(ROOT)), ["bash", str(p)])
                 for p in sorted([*(ROOT / "tools").glob("*.sh"), *(ROOT / "perf").glob("*.sh")])]
    return programs


def test_the_build_has_its_programs():
    names = {p.name for p in _binaries()}
    assert {"genie-node", "genie-bench", "make_seed_corpus", "units_test"} <= names, sorted(names)


@pytest.mark.parametrize("name,command", _programs(), ids=[name for name, _ in _programs()])
def test_help_prints_and_does_nothing_else(name, command, tmp_path):
    done = subprocess.run([*command, "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
    assert len(done.stdout.strip().splitlines()) >= 2, done.stdout + done.stderr  # a help text, not a line of noise
    assert list(tmp_path.iterdir()) == [], f"{name} --help left {list(tmp_path.iterdir())}"
