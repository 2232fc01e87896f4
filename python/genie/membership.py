"""The cluster's members: the genie-nodes registered in etcd (docs/configuration.md, "Cluster
membership (etcd)").

A node started with ``genie-node --etcd URL`` puts the key ``<prefix><HOST:PORT>`` under an
etcd lease it keeps alive (src/node/membership.h); its value is a JSON record::

    {"address": "10.0.0.7:7070", "device": "cuda:0", "memory_limit": 0,
     "memory_total": 85899345920, "version": "0.1.0", "protocol_version": 1, "pid": 4242}

(`memory_limit`: bytes the node lets sessions use, 0 for none; `memory_total`: bytes of its
device, or its limit when it has one; 0 when not known). The key goes when the node stops
(its lease is revoked) or dies (its lease expires after its TTL). Membership is etcd's: Genie
has no protocol of its own.

`nodes_from_etcd` reads the records once; `genie.init(etcd=URL)` or ``GENIE_ETCD`` makes the
program's devices the nodes registered at that moment, sorted by address, so a node that joins
or leaves later changes only later sessions and placements.

etcd is read through its v3 JSON gateway (``POST /v3/kv/range``, keys and values in base64;
etcd 3.4) with urllib from the standard library. No torch here.
"""
from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
import warnings

from .errors import GenieConnectionError

DEFAULT_URL = "http://127.0.0.1:2379"
DEFAULT_PREFIX = "/genie/nodes/"


def _prefix_end(prefix: bytes) -> bytes:
    """etcd's range_end for every key starting with `prefix`: its last byte below 0xff plus one,
    what follows dropped; b"\\0" (every key) when there is none."""
    end = bytearray(prefix)
    while end:
        if end[-1] != 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _address_key(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return (host, int(port)) if port.isdigit() else (address, -1)


def nodes_from_etcd(url: str = DEFAULT_URL, prefix: str = DEFAULT_PREFIX, timeout_s: float = 2.0) -> list[dict]:
    """The nodes registered in the etcd at `url` under `prefix`, sorted by address (host, then
    port as a number).

    Each is the node's record (``address`` "HOST:PORT", ``device``, ``memory_limit`` and
    ``memory_total`` in bytes, ``version``, ``protocol_version``, ``pid``) plus ``key``, the etcd
    key. A value that is not such a record is left out with a warning naming its key. No node
    registered: an empty list.

    `timeout_s`: seconds the request may take. Raises GenieConnectionError naming `url` when
    etcd cannot be reached, does not answer in time or answers an error; ValueError when `url`
    is not http:// or https://."""
    base = url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise ValueError(f"genie: etcd URL {url!r} is not http://HOST:PORT")
    key = prefix.encode()
    body = json.dumps({"key": _b64(key), "range_end": _b64(_prefix_end(key))}).encode()
    request = urllib.request.Request(f"{base}/v3/kv/range", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as e:
        raise GenieConnectionError(f"etcd at {base} answered HTTP {e.code} to a range read of {prefix!r}: "
                                   f"{e.read()[:200].decode(errors='replace')}") from None
    except (urllib.error.URLError, OSError) as e:  # refused, unknown host, timeout
        reason = getattr(e, "reason", e)
        raise GenieConnectionError(f"etcd at {base} cannot be reached: {reason}") from None
    except ValueError as e:  # not JSON
        raise GenieConnectionError(f"etcd at {base} answered something that is not JSON: {e}") from None
    nodes = []
    for kv in answer.get("kvs", []):  # absent when no key matches
        name = base64.b64decode(kv.get("key", "")).decode(errors="replace")
        try:
            record = json.loads(base64.b64decode(kv.get("value", "")))
            if not isinstance(record, dict) or not isinstance(record.get("address"), str):
                raise ValueError("no address")
        except ValueError as e:
            warnings.warn(f"genie: etcd key {name!r} at {base} is not a node record ({e}); left out", stacklevel=2)
            continue
        nodes.append({**record, "key": name})
    nodes.sort(key=lambda node: _address_key(node["address"]))
    return nodes


def addresses_from_etcd(url: str = DEFAULT_URL, prefix: str = DEFAULT_PREFIX, timeout_s: float = 2.0) -> list[str]:
    """The "HOST:PORT" of each node registered at `url` under `prefix`, sorted as
    `nodes_from_etcd`: `remote_accelerator:i` is the i-th. Raises GenieConnectionError naming
    `url` when etcd cannot be reached or no node is registered."""
    nodes = nodes_from_etcd(url, prefix, timeout_s)
    if not nodes:
        raise GenieConnectionError(f"no genie-node is registered in etcd at {url.rstrip('/')} under {prefix!r} "
                                   "(start nodes with genie-node --etcd URL, and the same --etcd-prefix)")
    return [node["address"] for node in nodes]
