#!/usr/bin/env bash
# The main job: installs and builds (tools/setup.sh), a short loopback genie-bench run on UCX's
# tcp and shared-memory transports, then the model demo: MiniLM, GPT-2 and ResNet-50 run on the
# local CPU and on remote_accelerator:0 in one process, checked against each other
# (python -m genie.demo; see python/genie/demo/__main__.py).
#
#   tools/demo.sh                                   # everything
#   tools/demo.sh --models gpt2 --json out.json     # arguments go to python -m genie.demo
#
# Nothing is downloaded at run time: the models come from installed packages. Exits non-zero
# when a device result differs from the local one.
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then  # the comment above, nothing run
  sed -n '2,/^set -euo pipefail/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
tools/setup.sh

BENCH=build/bin/genie-bench
PYTHON=.venv/bin/python
for tls in tcp sm; do
  port=$("$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  echo
  echo "== genie-bench on loopback, UCX_TLS=$tls"
  UCX_NET_DEVICES=lo UCX_TLS=$tls "$BENCH" --server --once --port "$port" &
  server=$!
  sleep 0.5
  UCX_NET_DEVICES=lo UCX_TLS=$tls "$BENCH" 127.0.0.1 --port "$port" \
    --tests latency,bandwidth,put,get,rate --sizes 8,1M
  wait "$server"
done

echo
echo "== python -m genie.demo"
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$PYTHON" -m genie.demo "$@"
