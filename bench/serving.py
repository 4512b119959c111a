"""Shared by the serving benchmarks: start a server, run a load generator, read its JSON result."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

from tpu_plugins import settings

BIN = Path(sys.executable).parent
QUIET = settings.QUIET_FRAMEWORKS
os.environ.update(QUIET)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(argv: list[str], log: Path, health: str, env: dict | None = None, timeout: float = 900) -> subprocess.Popen:
    proc = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **QUIET, **(env or {})})
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early; see {log}")
        try:
            if requests.get(health, timeout=2).status_code == 200:
                return proc
        except requests.RequestException:
            pass
        time.sleep(1)
    stop(proc)
    raise TimeoutError(f"server not ready; see {log}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def recompiles_in_log(log: Path) -> int:
    """The engine logs 'programs compiled after warm-up: N in total' whenever N grows."""
    counts = [int(m) for m in re.findall(r"programs compiled after warm-up: (\d+) in total", log.read_text(errors="replace"))]
    return max(counts, default=0)
