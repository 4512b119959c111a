#!/usr/bin/env bash
# Sets up the environment, then runs the main job: what was found, then a short generation
# from the demo model through the core engine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
.venv/bin/tpu-plugins info
model=$(.venv/bin/tpu-plugins demo-model | tail -n 1)
echo "demo model: $model"
.venv/bin/python examples/generate.py --model "$model"
