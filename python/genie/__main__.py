"""``python -m genie config``: every ``GENIE_*`` setting with its type, default, effective value
and help: the frontend's (genie.config), the data plane's (the C++ transport's table) and
genie-node's (its command line's options, ``genie-node --print-config``).
``--markdown`` prints the frontend's table as docs/configuration.md holds it."""
from __future__ import annotations

import argparse
import subprocess
import sys


def _config(args: argparse.Namespace) -> int:
    from . import config
    if args.markdown:
        sys.stdout.write(config.markdown())
        return 0
    from . import _C
    try:
        tables = (("Python frontend (python/genie/config.py)", config.rows()),
                  ("data plane (transport/src/config.cc)", _C.transport_config()))
        for name in config.SETTINGS:
            config.get(name.name)  # an invalid value is an error here too
    except ValueError as e:
        print(f"python -m genie config: {e}", file=sys.stderr)
        return 2
    for title, rows in tables:
        print(f"# {title}")
        for row in rows:
            print(f"{row['name']}={row['value']}  # {row['type']}, default {row['default']}: {row['help']}")
    # The node's settings are its command line's: the embedded node's executable prints them.
    binary = config.get("GENIE_NODE_BIN") or _C.node_binary()
    print(f"# genie-node ({binary} --print-config)")
    try:
        node = subprocess.run([binary, "--print-config"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"python -m genie config: {binary} --print-config: {e}", file=sys.stderr)
        return 2
    if node.returncode != 0:
        print(f"python -m genie config: {binary} --print-config: {node.stderr.strip()}", file=sys.stderr)
        return 2
    sys.stdout.write(node.stdout)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m genie", description="Genie's command line.")
    commands = parser.add_subparsers(dest="command", required=True)
    config = commands.add_parser("config", help="every GENIE_* setting: type, default, value, help")
    config.add_argument("--markdown", action="store_true", help="the frontend's table as Markdown (docs)")
    config.set_defaults(run=_config)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
