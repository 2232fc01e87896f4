"""Every ``GENIE_*`` environment setting of the Python frontend, in one table.

Each `Setting` has its variable's name, a type (with its unit), the default and a help text;
`get(name)` reads and parses the variable (or returns the default), and the same table prints
``python -m genie config`` and the frontend's table in docs/configuration.md (`markdown()`;
a test checks that the page holds it). The data plane's settings (``GENIE_UCX_TLS``,
``GENIE_PEER_TIMEOUT_MS``, ...) are the C++ transport's own table
(``transport/src/config.cc``), which ``python -m genie config`` prints beside this one; the
node's are ``genie-node --help``.

Errors: `get` raises ValueError naming the variable when its text is not a value of its type.
This module imports nothing of torch or of ``genie._C``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

# ---- types ---------------------------------------------------------------------------------


def _int(text: str) -> int:
    value = int(text.strip().replace("_", ""))
    if value < 0:
        raise ValueError("negative")
    return value


def _flag(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("", "0", "false", "no", "off"):
        return False
    raise ValueError("not a flag")


def _text(text: str) -> str:
    return text


_PARSERS: dict[str, tuple[Callable[[str], object], str]] = {
    # type: (parser, what a valid text is)
    "flag": (_flag, "1/true/yes/on or 0/false/no/off"),
    "count": (_int, "a non-negative integer"),
    "duration ms": (_int, "a non-negative integer of milliseconds"),
    "string": (_text, "any text"),
}


@dataclass(frozen=True)
class Setting:
    """One environment variable: `name` (``GENIE_...``), `type` (a key of the parsers: flag,
    count, duration ms, string), `default` (the text used when the variable is unset; None:
    no value, `get` returns None), `help` (what it does; where else it can be set)."""

    name: str
    type: str
    default: str | None
    help: str

    def parse(self, text: str) -> object:
        """The value of `text` for this setting. Raises ValueError naming the variable."""
        parser, valid = _PARSERS[self.type]
        try:
            return parser(text)
        except ValueError:
            raise ValueError(f"{self.name}={text!r} is not valid: {valid} ({self.type})") from None


SETTINGS: tuple[Setting, ...] = (
    Setting("GENIE_SERVER", "string", None,
            "nodes as HOST:PORT[,HOST:PORT...]; remote_accelerator:i is the i-th. Unset or empty: an embedded "
            "genie-node on loopback. Also genie.init(server=...)"),
    Setting("GENIE_ETCD", "string", None,
            "etcd client URL (http://HOST:PORT): the nodes are those registered there (genie-node --etcd) when the "
            "program starts its session, sorted by address; GenieConnectionError naming the URL when etcd cannot be "
            "reached or lists none. Not with GENIE_SERVER. Also genie.init(etcd=...)"),
    Setting("GENIE_ETCD_PREFIX", "string", "/genie/nodes/",
            "the etcd key prefix under which nodes register (genie-node --etcd-prefix)"),
    Setting("GENIE_AUTH_TOKEN", "string", "",
            "token presented to named nodes (the embedded node gets a random one); also genie.init(auth_token=...)"),
    Setting("GENIE_TIMEOUT_MS", "duration ms", "60000",
            "how long a reply may take: a reply not there after this long is waited for again while the node "
            "answers a Ping (its progress thread answers during a long run), so a run may take longer; "
            "GenieConnectionError ('did not answer') when it answers neither. A stopped node or a cut link fails "
            "sooner, within GENIE_PEER_TIMEOUT_MS (heartbeats). Also genie.init(timeout_ms=...)"),
    Setting("GENIE_KEEP_HOST_COPY", "flag", "0",
            "keep the host tensors uploaded and the lineage of the nodes' state, so that a lost node is rebuilt and "
            "the program goes on (docs/security.md 'Losing a node'); costs host memory, no bytes on the wire. "
            "Also genie.init(keep_host_copy=True)"),
    Setting("GENIE_NODE_BIN", "string", None,
            "the executable of the embedded node; unset: the installed genie/bin/genie-node, else "
            "build/bin/genie-node"),
    Setting("GENIE_EMBEDDED_DEVICE", "string", "cpu", "the embedded node's --device (cpu, cuda, cuda:1)"),
    Setting("GENIE_LOG_LEVEL", "string", "warn",
            "log level of genie._C (the client, on standard error) and of the embedded node: trace, debug, info, "
            "warn, error (an unknown name: warn)"),
    Setting("GENIE_ASYNC_CHUNK", "count", None,
            "recorded nodes per asynchronous run (docs/frontend.md 'Asynchronous runs'); 0 turns them off. Unset: "
            "0 for a CPU node on loopback (it computes on the cores the program records on), else 256"),
    Setting("GENIE_HOST_EVAL", "flag", "1",
            "answer a read of a small integer/bool value computed only from small integer uploads on the host "
            "(docs/frontend.md 'Host evaluation') and check index values known on the host at the op "
            "('Index values known on the host'); 0 sends every read and every index check to the node"),
    Setting("GENIE_PROGRESS", "flag", "1",
            "progress bars (tqdm, on standard error when it is a terminal) for transfers that take over a second: "
            "module.to(device) / module.cpu() and reads of one tensor of 64 MiB or more, which then go in 16 MiB "
            "slices (genie.progress); 0 turns them off"),
    Setting("GENIE_GC_FREEZE", "flag", "1",
            "at the first use of a remote device, gc.collect() then gc.freeze(): full collections then skip the "
            "400,000+ objects of torch, transformers and the model, which cost 260 ms every ~8 GPT-2 decode steps "
            "(docs/perf/models.md)"),
    Setting("GENIE_GC_THRESHOLD", "count", "50000",
            "objects: at the first use of a remote device the GC's youngest-generation threshold is raised to this "
            "(never lowered; 0 leaves it), so that young collections do not traverse the pending graph while "
            "recording"),
)

_BY_NAME = {setting.name: setting for setting in SETTINGS}


def setting(name: str) -> Setting:
    """The row of `name`. Raises KeyError for a name not in the table."""
    return _BY_NAME[name]


def get(name: str) -> object:
    """The value of setting `name`: its environment variable parsed, else its default parsed
    (None when it has none). Raises KeyError for an unknown name, ValueError (naming the
    variable) for a text that is not a value of its type."""
    row = _BY_NAME[name]
    text = os.environ.get(name)
    if text is None:
        text = row.default
    return None if text is None else row.parse(text)


def rows() -> list[dict[str, str]]:
    """The table with the effective values: name, type, default, value (the environment's text,
    else the default's, else "(unset)"), help."""
    def shown(text):
        return "(unset)" if text is None else (text or "(empty)")
    return [{"name": s.name, "type": s.type, "default": shown(s.default), "value": shown(os.environ.get(s.name, s.default)),
             "help": s.help} for s in SETTINGS]


def markdown() -> str:
    """The frontend's table as Markdown, as docs/configuration.md holds it."""
    lines = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    for s in SETTINGS:
        default = "unset" if s.default is None else ("empty" if s.default == "" else f"`{s.default}`")
        lines.append(f"| `{s.name}` | {s.type} | {default} | {s.help} |")
    return "\n".join(lines) + "\n"
