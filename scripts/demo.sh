#!/usr/bin/env bash
# Sets up the environment, then runs the main job: what was found, then `vllm serve` of the
# demo model on the TPU platform (JAX's CPU backend standing in where there is no TPU),
# queried with the openai client.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# No telemetry and no model-hub traffic from the frameworks: this machine talks to loopback only.
export DO_NOT_TRACK=1 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1
bash scripts/setup.sh
.venv/bin/tpu-plugins info
model=$(.venv/bin/tpu-plugins demo-model | tail -n 1)
echo "demo model: $model"

port=${PORT:-8000}
log=$(mktemp -t vllm-serve.XXXXXX.log)
echo "starting: vllm serve $model --device tpu (log: $log)"
.venv/bin/vllm serve "$model" --device tpu --dtype float32 --max-model-len 2048 --max-num-seqs 16 \
    --max-num-batched-tokens 256 --host 127.0.0.1 --port "$port" >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
    if curl -sf "http://127.0.0.1:$port/health" >/dev/null; then break; fi
    if ! kill -0 $server 2>/dev/null; then echo "vllm serve exited; its log:" >&2; tail -n 40 "$log" >&2; exit 1; fi
    sleep 1
done
.venv/bin/python examples/query_server.py --base-url "http://127.0.0.1:$port/v1"
