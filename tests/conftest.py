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

from tpu_plugins import settings

REPO = Path(__file__).resolve().parents[1]
PROBES = Path(__file__).resolve().parent / "probes"

# Variables that would change what the code under test decides; each test sets its own.
_CONTROLLED = ("TPU_PLUGINS_DEVICE", "TPU_PLUGINS_SIM_DEVICES", "JAX_PLATFORMS", "XLA_FLAGS",
               "SGLANG_PLATFORM", "VLLM_PLUGINS", "SGLANG_PLUGINS", "TORCH_DEVICE_BACKEND_AUTOLOAD",
               "TPU_PLUGINS_COORDINATOR", "TPU_PLUGINS_NUM_HOSTS", "TPU_PLUGINS_HOST_ID", "RAY_ADDRESS")


QUIET = settings.QUIET_FRAMEWORKS
os.environ.update(QUIET)


def clean_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CONTROLLED}
    env.update(QUIET)
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


def run_probe(name: str, *argv: str, timeout: float = 900, **env: str):
    """Run tests/probes/<name>.py with argv in a fresh interpreter; return its JSON (last stdout line)."""
    code = (f"import sys; sys.argv = ['probe', *{list(argv)!r}]; "
            f"import runpy; runpy.run_path({str(PROBES / (name + '.py'))!r})")
    proc = run_python(code, timeout=timeout, **env)
    assert proc.returncode == 0, f"probe {name} failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def demo_model_path() -> Path:
    from tpu_plugins import demo_model

    return demo_model.prepare()


PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about tensor processing units and the sea.",
    "List three prime numbers.",
    "Explain in two sentences why the sky is blue, and mention Rayleigh scattering by name, please.",
]


def chat_prompt_ids(tokenizer, text: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int, stop_at_eos: bool = True) -> list[int]:
    """Plain transformers on CPU: the independent reference for greedy generation."""
    import copy

    import torch

    config = copy.deepcopy(model.generation_config)
    config.update(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0, temperature=None, top_p=None, top_k=None)
    if not stop_at_eos:
        config.eos_token_id = []   # None falls back to the model config; an empty list never stops
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                             generation_config=config)
    return out[0, len(prompt_ids):].tolist()


def hf_last_logits(model, ids: list[int]):
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def save_random_model(folder, model_type: str, **config):
    """A random-weight transformers model of `model_type`, saved to `folder`, returned in fp32.
    Weight matrices are scaled up from the init default so greedy paths are not trivial."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = AutoConfig.for_model(model_type, **config)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4.0)
    model.save_pretrained(folder)
    return model
