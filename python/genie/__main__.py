"""Genie's command line.

- ``python -m genie config``: every ``GENIE_*`` setting with its type, default, effective value
  and help: the frontend's (genie.config), the data plane's (the C++ transport's table) and
  genie-node's (its command line's options, ``genie-node --print-config``). ``--markdown``
  prints the frontend's table as docs/configuration.md holds it.
- ``python -m genie explain MODEL``: `genie.explain` of one of the main job's models
  (gpt2: `generate` of --tokens tokens; resnet50, minilm: one forward), analysed on the CPU
  (nothing runs) or, with ``--remote``, run on ``remote_accelerator:0`` step by step;
  ``--json`` and ``--dot`` write the report and the largest step's graph.
"""
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


def _explain(args: argparse.Namespace) -> int:
    import torch

    import genie
    from .demo import models
    device = "remote_accelerator:0" if args.remote else None
    if args.model == "gpt2":
        workload = models.load_gpt2(max_new_tokens=args.tokens)
        model = workload.model.to(device) if device else workload.model
        if device:
            report = genie.explain(lambda: models.gpt2_generate(model, workload.prompt, device, args.tokens))
        else:
            report = genie.explain(model, workload.prompt)
    elif args.model == "resnet50":
        workload = models.load_resnet50(num_images=2)
        model = workload.model.to(device) if device else workload.model
        with torch.no_grad():
            report = genie.explain(model, workload.images.to(device) if device else workload.images)
    else:
        workload = models.load_minilm(num_sentences=2)
        model = workload.model.to(device) if device else workload.model
        inputs = {k: (v.to(device) if device else v) for k, v in workload.encoded.items()}
        with torch.no_grad():
            report = genie.explain(model, **inputs)
    print(report)
    if args.json:
        print(f"wrote {report.write_json(args.json)}")
    if args.dot:
        print(f"wrote {report.write_dot(args.dot)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m genie", description="Genie's command line.")
    commands = parser.add_subparsers(dest="command", required=True)
    config = commands.add_parser("config", help="every GENIE_* setting: type, default, value, help")
    config.add_argument("--markdown", action="store_true", help="the frontend's table as Markdown (docs)")
    config.set_defaults(run=_config)
    explain = commands.add_parser("explain", help="patterns, phases, residency and costs of a main-job model")
    explain.add_argument("model", choices=("gpt2", "resnet50", "minilm"))
    explain.add_argument("--remote", action="store_true", help="run it on remote_accelerator:0 (default: analyse only)")
    explain.add_argument("--tokens", type=int, default=8, help="gpt2: tokens to generate (default 8)")
    explain.add_argument("--json", help="write the report as JSON here")
    explain.add_argument("--dot", help="write the largest step's graph as Graphviz DOT here (and .svg with `dot`)")
    explain.set_defaults(run=_explain)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
