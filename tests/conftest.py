"""Shared test helpers: subprocesses with a controlled environment.

JAX settles its platform and device count once per process, so every test that needs a
particular setting (a simulated slice, a TPU request) runs its code in a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROBES = Path(__file__).resolve().parent / "probes"

# Variables that would change what the code under test decides; each test sets its own.
_CONTROLLED = ("TPU_PLUGINS_DEVICE", "TPU_PLUGINS_SIM_DEVICES", "JAX_PLATFORMS", "XLA_FLAGS",
               "SGLANG_PLATFORM", "VLLM_PLUGINS", "SGLANG_PLUGINS", "TORCH_DEVICE_BACKEND_AUTOLOAD")


def clean_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CONTROLLED}
    env.update(overrides)
    return env


def run_python(code: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env=clean_env(**env), cwd=REPO)


def run_json(code: str, **env: str):
    """Run code that prints one JSON document as its last stdout line; return it parsed."""
    proc = run_python(code, **env)
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def demo_model_path() -> Path:
    from tpu_plugins import demo_model

    return demo_model.prepare()
