#!/usr/bin/env bash
# Sets up the project environment and links it at ./.venv.
#
# The environment is built once per requirements/lock.txt and kept in a cache
# (TPU_PLUGINS_ENV_CACHE, default ~/.cache/tpu-plugins/envs/<hash>), so repeated runs and CI
# reuse it; only this checkout's editable install is refreshed each time (seconds).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || { echo "setup: needs Python 3.11 ($python not found); set PYTHON=/path/to/python3.11" >&2; exit 1; }
"$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { echo "setup: $python is not Python 3.11" >&2; exit 1; }

# Bump when the way the environment is built changes (not when versions change: the lock does that).
env_format=1
key=$( { echo "format=$env_format"; "$python" -VV; uname -m; cat requirements/lock.txt; } | sha256sum | cut -c1-16)
cache=${TPU_PLUGINS_ENV_CACHE:-$HOME/.cache/tpu-plugins/envs}
env="$cache/$key"
mkdir -p "$cache"

(
  # One builder at a time; a second set-up waits and then finds the environment ready.
  flock 9
  if [ ! -f "$env/.complete" ]; then
    echo "setup: building the environment in $env (first time for this lock: about 10 minutes)" >&2
    rm -rf "$env"
    "$python" -m venv "$env"
    # --no-deps: the lock lists every package; nothing is resolved (and no CUDA torch pulled in).
    "$env/bin/pip" install --no-deps --progress-bar off -r requirements/lock.txt
    touch "$env/.complete"
  fi
  touch "$env/.last-used"
  # Keep the three most recently used environments; older locks' environments go.
  for old in $(ls -1dt "$cache"/*/.last-used 2>/dev/null | tail -n +4); do rm -rf "$(dirname "$old")"; done
) 9>"$cache/.lock"

# This checkout's code, editable, with the entry points the frameworks discover.
"$env/bin/pip" install --quiet --no-deps --no-build-isolation -e "$root"
ln -sfn "$env" "$root/.venv"
echo "setup: ready ($root/.venv -> $env)" >&2
