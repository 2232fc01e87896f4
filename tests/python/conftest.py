import os
import pathlib
import socket

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("GENIE_BUILD_DIR", ROOT / "build")) / "bin"


@pytest.fixture
def genie_bench():
    path = BIN / "genie-bench"
    assert path.exists(), f"{path} is missing: run tools/setup.sh"
    return path


@pytest.fixture
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
