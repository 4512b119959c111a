#!/usr/bin/env bash
# A two-host TPU slice simulated on this machine: `vllm serve --tensor-parallel-size 4
# --distributed-executor-backend ray` over two worker processes on 127.0.0.1, each with its own
# two simulated chips (JAX CPU devices), joined by jax.distributed with gloo collectives. Sends
# one chat request and prints the completion.
#
#     examples/multihost_local.sh            # after scripts/setup.sh
#     HOSTS=4 CHIPS_PER_HOST=1 examples/multihost_local.sh
#     KEEP_SERVING=1 PORT=8000 examples/multihost_local.sh   # then serve until stopped
#
# The same layout as a real slice (README: Multi-host slices): a Ray cluster with one node per
# host, `vllm serve` on host 0. Here there is one Ray node, started with as many "TPU"
# resources as there are hosts, and each host is one Ray worker process.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export DO_NOT_TRACK=1 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0
hosts=${HOSTS:-2}
export TPU_PLUGINS_SIM_DEVICES=${CHIPS_PER_HOST:-2}
tp=$((hosts * TPU_PLUGINS_SIM_DEVICES))
py=.venv/bin/python
model=$(.venv/bin/tpu-plugins demo-model | tail -n 1)
free_port() { "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ray_port=$(free_port)
port=${PORT:-$(free_port)}
work=$(mktemp -d -t multihost.XXXXXX)
log=${VLLM_LOG:-$work/vllm.log}

# Each runs in its own session, so that exit takes down every process it started.
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
    sleep 2
    for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

echo "starting: a Ray head on 127.0.0.1:$ray_port offering $hosts TPU host(s)"
setsid .venv/bin/ray start --head --block --node-ip-address 127.0.0.1 --port "$ray_port" --num-cpus "$hosts" \
    --resources "{\"TPU\": $hosts}" --include-dashboard=false --object-store-memory 100000000 \
    --temp-dir "$work/ray" --disable-usage-stats >"$work/ray.log" 2>&1 &
pids+=($!)
export RAY_ADDRESS=127.0.0.1:$ray_port
for _ in $(seq 1 60); do
    if .venv/bin/ray status >/dev/null 2>&1; then break; fi
    sleep 1
done

echo "starting: vllm serve $model --device tpu --tensor-parallel-size $tp --distributed-executor-backend ray" \
     "($hosts hosts x $TPU_PLUGINS_SIM_DEVICES chips; log: $log)"
# A small KV pool: every simulated host sizes its cache from this one machine's memory.
setsid .venv/bin/vllm serve "$model" --device tpu --tensor-parallel-size "$tp" --distributed-executor-backend ray \
    --dtype float32 --max-model-len 1024 --max-num-seqs 8 --max-num-batched-tokens 128 \
    --num-gpu-blocks-override 512 --host 127.0.0.1 --port "$port" >"$log" 2>&1 &
server=$!
pids+=($server)
for _ in $(seq 1 900); do
    if curl -sf "http://127.0.0.1:$port/health" >/dev/null; then break; fi
    if ! kill -0 "$server" 2>/dev/null; then echo "vllm serve exited; its log:" >&2; tail -n 40 "$log" >&2; exit 1; fi
    sleep 1
done
grep -a "tpu-plugins" "$log" | grep -a -E "joined the slice|engine:" | sed -e 's/^.*tpu-plugins/tpu-plugins/' | sort -u
"$py" examples/query_server.py --base-url "http://127.0.0.1:$port/v1"
if [ -n "${KEEP_SERVING:-}" ]; then
    echo "serving on http://127.0.0.1:$port/v1 until stopped"
    wait "$server" || true
fi
