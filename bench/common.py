"""Shared benchmark inputs: the demo model and a fixed set of prompts of spread lengths."""

from __future__ import annotations

import numpy as np

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
