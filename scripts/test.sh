#!/usr/bin/env bash
# Sets up the environment, then runs the full test suite: the slow (load) group, then the
# main group, whose summary is the run's closing line. Extra arguments go to both pytest runs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# No telemetry and no model-hub traffic from the frameworks: this machine talks to loopback only.
export DO_NOT_TRACK=1 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1
bash scripts/setup.sh

slow=0
.venv/bin/python -m pytest -m slow "$@" || slow=$?
# pytest exits 5 when a group selects no test; an empty slow group is not a failure.
[ "$slow" -eq 5 ] && slow=0
status=0
.venv/bin/python -m pytest -m "not slow" "$@" || status=$?
[ "$status" -ne 0 ] && exit "$status"
exit "$slow"
