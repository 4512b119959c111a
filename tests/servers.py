"""Starting and stopping a real framework server for a test module, on 127.0.0.1 only."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests
from conftest import clean_env

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process in its own session, its output in a log file, stopped with SIGTERM."""

    def __init__(self, argv: list[str], port: int, log: Path, env: dict | None = None, ready_path: str = "/health"):
        self.port, self.log_path = port, log
        self.base_url = f"http://127.0.0.1:{port}"
        self._log = log.open("w")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=clean_env(**(env or {})),
                                     start_new_session=True)
        self._ready_path = ready_path

    def wait_ready(self, timeout: float = 600) -> "Server":
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()[-5000:]}")
            try:
                if requests.get(self.base_url + self._ready_path, timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(1)
        self.stop()
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.log()[-5000:]}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def vllm_serve(model: Path, log: Path, *args: str, env: dict | None = None) -> Server:
    port = free_port()
    argv = [str(BIN / "vllm"), "serve", str(model), "--device", "tpu", "--host", "127.0.0.1", "--port", str(port),
            *args]
    return Server(argv, port, log, env)


def sglang_serve(model: Path, log: Path, *args: str, env: dict | None = None) -> Server:
    port = free_port()
    argv = [str(BIN / "python"), "-m", "sglang.launch_server", "--model-path", str(model), "--device", "tpu",
            "--host", "127.0.0.1", "--port", str(port), *args]
    return Server(argv, port, log, env)


def start_for_module(framework: str, start, model: Path, tmp_path_factory) -> Server:
    """`start(framework, model, log)` -> a ready Server that knows its framework (for modules
    parametrized over both frameworks)."""
    srv = start(framework, model, tmp_path_factory.mktemp(framework) / "server.log").wait_ready()
    srv.framework = framework
    return srv
