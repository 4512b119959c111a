"""Shared benchmark inputs (prompts of spread lengths) and the `tpu-plugins aot` runner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

BIN = Path(sys.executable).parent

TEXT = (
    "The tensor processing unit is an application-specific integrated circuit developed for neural network "
    "machine learning. Its matrix units multiply large blocks of numbers every cycle, its high-bandwidth memory "
    "feeds them, and its inter-chip interconnect joins many chips into one slice. Serving a language model on it "
    "means keeping those units busy: batching many requests, paging the attention cache, and compiling each "
    "step once for a fixed set of shapes. "
)


def prompt_token_ids(tokenizer, count: int, shortest: int, longest: int, seed: int = 0) -> list[list[int]]:
    """`count` prompts whose lengths are spread evenly over [shortest, longest], in shuffled order."""
    corpus = tokenizer(TEXT * (longest // 40 + 2))["input_ids"]
    lengths = np.linspace(shortest, longest, count).round().astype(int)
    np.random.default_rng(seed).shuffle(lengths)
    return [corpus[i % 7: i % 7 + n] for i, n in enumerate(lengths)]


def aot_report(model: str, topology: str, *options: str, max_model_len: int = 2048, max_num_seqs: int = 16) -> dict:
    """`tpu-plugins aot ... --json` in its own process (each compile starts clean), parsed."""
    proc = subprocess.run([str(BIN / "tpu-plugins"), "aot", "--model", model, "--topology", topology,
                           "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs), *options,
                           "--json"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"aot failed for {model} on {topology} {' '.join(options)}:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)
