"""The configuration tables: genie.config (the frontend's) and the transport's, one table each,
read, printed and documented from the same declaration."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_configuration_page_holds_the_frontend_table():
    import genie.config as config
    page = (ROOT / "docs/configuration.md").read_text()
    match = re.search(r"<!-- genie.config: begin -->\n(.*?)<!-- genie.config: end -->", page, re.S)
    assert match, "docs/configuration.md lost its genie.config markers"
    assert match.group(1) == config.markdown(), "run: python -m genie config --markdown, and paste it in"


def test_the_frontend_reads_genie_variables_only_through_its_table():
    import genie.config as config
    readers = re.compile(r"""(?:os\.environ\.get|os\.getenv|os\.environ\[)\(?\s*["'](GENIE_\w+)""")
    direct = [(path.relative_to(ROOT), name) for path in (ROOT / "python/genie").rglob("*.py")
              if path.name != "config.py" for name in readers.findall(path.read_text())]
    assert direct == [], f"read these through genie.config.get: {direct}"
    named = set(re.findall(r"GENIE_[A-Z_]*[A-Z]\b", "".join(p.read_text() for p in (ROOT / "python/genie").rglob("*.py")
                                                       if p.name != "config.py")))
    transport = {row["name"] for row in __import__("genie._C", fromlist=["_C"]).transport_config()}
    known = {s.name for s in config.SETTINGS} | transport
    # Every GENIE_* variable a docstring or message of the frontend names is one of the tables'.
    assert named <= known, f"GENIE_* names in python/genie that no table declares: {sorted(named - known)}"


def test_values_are_parsed_by_type_and_bad_ones_name_the_variable(monkeypatch):
    import genie.config as config
    monkeypatch.setenv("GENIE_TIMEOUT_MS", "1500")
    monkeypatch.setenv("GENIE_GC_FREEZE", "off")
    monkeypatch.delenv("GENIE_ASYNC_CHUNK", raising=False)
    assert config.get("GENIE_TIMEOUT_MS") == 1500
    assert config.get("GENIE_GC_FREEZE") is False
    assert config.get("GENIE_ASYNC_CHUNK") is None
    assert config.get("GENIE_EMBEDDED_DEVICE") == "cpu"
    for name, text in (("GENIE_TIMEOUT_MS", "soon"), ("GENIE_ASYNC_CHUNK", "-1"), ("GENIE_KEEP_HOST_COPY", "maybe")):
        monkeypatch.setenv(name, text)
        with pytest.raises(ValueError, match=name):
            config.get(name)
    with pytest.raises(KeyError):
        config.get("GENIE_NO_SUCH_SETTING")


def test_genie_init_refuses_an_invalid_timeout(monkeypatch):
    import genie
    monkeypatch.setenv("GENIE_TIMEOUT_MS", "1.5s")
    genie.shutdown()
    try:
        with pytest.raises(ValueError, match="GENIE_TIMEOUT_MS"):
            genie.init(server="127.0.0.1:1")
    finally:
        genie.shutdown()


def test_the_transport_table_parses_what_it_prints(monkeypatch):
    import genie._C as C
    monkeypatch.setenv("GENIE_PEER_TIMEOUT_MS", "3000")
    monkeypatch.setenv("GENIE_RNDV_THRESHOLD", "64KiB")
    rows = {row["name"]: row for row in C.transport_config()}
    assert rows["GENIE_PEER_TIMEOUT_MS"]["value"] == "3000"
    assert rows["GENIE_RNDV_THRESHOLD"]["value"] == str(64 * 1024)
    assert rows["GENIE_CLOSE_TIMEOUT_MS"]["value"] == rows["GENIE_CLOSE_TIMEOUT_MS"]["default"] == "1000"
    monkeypatch.setenv("GENIE_CONNECT_TIMEOUT_MS", "5s")
    with pytest.raises(ValueError, match="GENIE_CONNECT_TIMEOUT_MS"):
        C.transport_config()
    # The page documents every row of the transport's table.
    page = (ROOT / "docs/configuration.md").read_text()
    for name in rows:
        assert f"`{name}`" in page, f"docs/configuration.md does not document {name}"


def test_python_m_genie_config_prints_every_setting_with_its_value():
    import genie.config as config
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENIE_")}
    env["GENIE_TIMEOUT_MS"] = "4321"
    out = subprocess.run([sys.executable, "-m", "genie", "config"], capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "GENIE_TIMEOUT_MS=4321  # duration ms, default 60000" in out.stdout
    for s in config.SETTINGS:
        assert re.search(rf"^{s.name}=", out.stdout, re.M), s.name
    assert re.search(r"^GENIE_PEER_TIMEOUT_MS=2000 ", out.stdout, re.M)
    # genie-node's settings, from its command line (an environment variable is its value)
    assert re.search(r"^GENIE_NODE_LISTEN=127.0.0.1:7070  # --listen, default 127.0.0.1:7070: ", out.stdout, re.M)
    node = subprocess.run([sys.executable, "-m", "genie", "config"], capture_output=True, text=True, timeout=120,
                          env=dict(env, GENIE_NODE_SESSION_MEMORY_LIMIT="64MiB"))
    assert re.search(r"^GENIE_NODE_SESSION_MEMORY_LIMIT=64MiB  # --session-memory-limit, default 0: ", node.stdout,
                     re.M), node.stdout[-3000:]
    bad = subprocess.run([sys.executable, "-m", "genie", "config"], capture_output=True, text=True, timeout=120,
                         env=dict(env, GENIE_TIMEOUT_MS="perhaps"))
    assert bad.returncode == 2 and "GENIE_TIMEOUT_MS='perhaps'" in bad.stderr
