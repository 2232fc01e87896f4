"""Genie's C++ package as another project uses it: `cmake --install build --component genie`,
then a project outside the tree (tests/install/consumer) finds it with
`find_package(Genie CONFIG REQUIRED)`, links genie::client, and talks to a real genie-node;
the installed genie-node and genie-bench run from the install prefix."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("GENIE_BUILD_DIR", ROOT / "build"))


def _run(command: list, **kwargs) -> str:
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=600, **kwargs)
    assert done.returncode == 0, f"{command}: {(done.stdout + done.stderr)[-3000:]}"
    return done.stdout


def test_a_project_outside_the_tree_builds_against_the_installed_package(tmp_path, genie_node):
    prefix = tmp_path / "prefix"
    _run(["cmake", "--install", BUILD, "--prefix", prefix, "--component", "genie"])
    for path in ("lib/cmake/Genie/GenieConfig.cmake", "lib/libgenie_client.a", "include/genie/client/client.h",
                 "include/genie/wire/genie_generated.h", "include/genie/transport/worker.h", "bin/genie-node",
                 "bin/genie-bench"):
        assert (prefix / path).exists(), path
    assert not (prefix / "include/genie/node").exists()  # the node's headers need libtorch: not installed
    # The installed programs find their UCX and torch (RPATH), from anywhere.
    assert "genie-node" in _run([prefix / "bin/genie-node", "--help"], cwd=tmp_path)
    assert "genie-bench" in _run([prefix / "bin/genie-bench", "--help"], cwd=tmp_path).lower()

    configure = ["cmake", "-S", ROOT / "tests/install/consumer", "-B", tmp_path / "build", "-G", "Ninja",
                 f"-DCMAKE_PREFIX_PATH={prefix}"]
    if shutil.which("ccache"):
        configure.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
    _run(configure)
    _run(["cmake", "--build", tmp_path / "build"])
    host, port = genie_node
    out = _run([tmp_path / "build/genie_consumer", host, port], env={**os.environ, "UCX_NET_DEVICES": "lo"})
    assert out.strip().endswith("ok"), out
