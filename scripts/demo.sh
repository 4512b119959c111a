#!/usr/bin/env bash
# Sets up the environment, then runs the main job: what was found, and the demo model.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
.venv/bin/tpu-plugins info
model=$(.venv/bin/tpu-plugins demo-model | tail -n 1)
echo "demo model: $model"
