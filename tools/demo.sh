#!/usr/bin/env bash
# The main job, for now: a loopback genie-bench run on UCX's tcp and shared-memory transports
# (latency, streaming bandwidth, tensor put/get, request rate). Installs and builds first.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
tools/setup.sh

BENCH=build/bin/genie-bench
export UCX_NET_DEVICES=lo   # loopback only
for tls in tcp sm; do
  port=$(.venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  echo
  echo "== genie-bench on loopback, UCX_TLS=$tls"
  UCX_TLS=$tls "$BENCH" --server --once --port "$port" &
  server=$!
  sleep 0.5
  UCX_TLS=$tls "$BENCH" 127.0.0.1 --port "$port" \
    --tests latency,bandwidth,put,get,rate --sizes 8,64K,1M,64M "$@"
  wait "$server"
done
