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


def load_args(doc: str):
    """The options every serving benchmark takes."""
    import argparse

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--prompts-per-concurrency", type=int, default=2, help="prompts = this x concurrency (min 8)")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    return parser.parse_args()


def num_prompts(args, concurrency: int) -> int:
    return max(8, args.prompts_per_concurrency * concurrency)


def print_row(concurrency: int, r: dict) -> None:
    """One line per concurrency from a load generator's result (vLLM's and SGLang's share these keys)."""
    print(f"concurrency {concurrency:>3}: {r['output_throughput']:7.1f} out tok/s  TTFT median "
          f"{r['median_ttft_ms']:8.1f} ms p99 {r['p99_ttft_ms']:8.1f} ms  TPOT median {r['median_tpot_ms']:7.1f} ms "
          f"p99 {r['p99_tpot_ms']:7.1f} ms  ({r['completed']} requests)", flush=True)
