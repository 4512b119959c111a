"""Sampling on device, one row per sequence: penalties, temperature, top-k, top-p, min-p,
per-request seeds, and log-probabilities.

Each row draws from its own key, `fold_in(key(seed), step)`, where `step` counts the
tokens that request has generated: the same seed gives the same tokens whatever else is in
the batch. Returned log-probabilities are those of the raw model output (before penalties
and temperature), as vLLM and SGLang report them by default.
"""

from __future__ import annotations

from tpu_plugins import jax_env  # noqa: F401  (settles JAX's platform before jax is imported)

import random
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from tpu_plugins.errors import UserError

MAX_LOGPROBS = 20   # top-n log-probabilities a request may ask for


def fresh_seed() -> int:
    """A seed for a request that named none. Every host of a multi-host slice feeds the same
    inputs to the sampler, so there host 0's draw is sent to all: a collective, which every
    host reaches for the same request at the same step (they run the same scheduler output)."""
    seed = random.getrandbits(63)
    if jax.process_count() == 1:
        return seed
    from jax.experimental import multihost_utils

    return int(multihost_utils.broadcast_one_to_all(np.int64(seed)))


@dataclass(frozen=True)
class SamplingParams:
    """The sampling knobs of one request. Stopping rules belong to the scheduler."""

    temperature: float = 1.0          # 0 = greedy
    top_k: int = 0                    # 0 or -1 = off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0   # on prompt and output tokens (HF/vLLM semantics)
    presence_penalty: float = 0.0     # on output tokens
    frequency_penalty: float = 0.0    # on output tokens
    seed: int | None = None
    logprobs: int | None = None       # top-n log-probabilities of each sampled position (0 = sampled token only)

    def __post_init__(self):
        problems = []
        if not self.temperature >= 0:
            problems.append(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < -1:
            problems.append(f"top_k must be -1 (off), 0 (off) or positive, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            problems.append(f"min_p must be in [0, 1], got {self.min_p}")
        if not self.repetition_penalty > 0:
            problems.append(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if not -2 <= self.presence_penalty <= 2 or not -2 <= self.frequency_penalty <= 2:
            problems.append("presence_penalty and frequency_penalty must be in [-2, 2]")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            problems.append(f"logprobs must be between 0 and {MAX_LOGPROBS}, got {self.logprobs}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            problems.append(f"seed must be a non-negative integer below 2**63, got {self.seed}")
        if problems:
            raise UserError("Invalid sampling parameters: " + "; ".join(problems) + ".")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def uses_penalties(self) -> bool:
        return self.repetition_penalty != 1 or self.presence_penalty != 0 or self.frequency_penalty != 0


@dataclass
class SamplerOutput:
    token_ids: np.ndarray        # [S] int32
    logprobs: np.ndarray         # [S] float32, of the sampled token
    ranks: np.ndarray            # [S] int32, 1 = most likely
    top_ids: np.ndarray | None   # [S, MAX_LOGPROBS] when any row asked for top-n
    top_logprobs: np.ndarray | None


def filter_logits(logits, top_k, top_p, min_p):
    """Mask to -inf every token outside the row's top-k / top-p nucleus / min-p floor."""
    vocab = logits.shape[-1]
    ordered = jnp.sort(logits, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(ordered, axis=-1)
    rank = jnp.arange(vocab)[None, :]
    keep = (jnp.cumsum(probs, axis=-1) - probs) < top_p[:, None]
    keep &= (rank < top_k[:, None]) | (top_k[:, None] <= 0)
    keep &= probs >= min_p[:, None] * probs[:, :1]
    keep |= rank == 0
    threshold = jnp.min(jnp.where(keep, ordered, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits >= threshold, logits, -jnp.inf)


def apply_penalties(logits, prompt_ids, output_ids, repetition, presence, frequency):
    """vLLM semantics: repetition on tokens seen in prompt or output; presence/frequency on output."""
    rows = jnp.arange(logits.shape[0])[:, None]
    vocab = logits.shape[-1]
    counts = jnp.zeros(logits.shape, jnp.int32).at[rows, jnp.where(output_ids < 0, vocab, output_ids)].add(1, mode="drop")
    seen = jnp.zeros(logits.shape, bool).at[rows, jnp.where(prompt_ids < 0, vocab, prompt_ids)].set(True, mode="drop")
    seen |= counts > 0
    rep = repetition[:, None]
    logits = jnp.where(seen, jnp.where(logits > 0, logits / rep, logits * rep), logits)
    return logits - frequency[:, None] * counts - presence[:, None] * (counts > 0)


@jax.jit
def sample(logits, temperature, top_k, top_p, min_p, seeds, steps, repetition, presence, frequency,
           prompt_ids, output_ids, allowed_mask, use_penalties, use_mask, want_top):
    """logits f32 [S, V] -> (tokens, sampled logprob, rank, top ids, top logprobs).

    One program per row count: every optional stage (penalties, the token mask, sampling,
    top-n log-probabilities) sits behind a runtime `lax.cond`, so a request that switches one
    on never compiles anything new, and a batch that needs none of them skips their cost.
    `prompt_ids`/`output_ids` are -1-padded histories, `allowed_mask` [S, V] bool; the three
    flags (bool scalars) say which stages this batch needs.
    """
    vocab = logits.shape[-1]
    raw_logprobs = jax.nn.log_softmax(logits, axis=-1)
    x = jax.lax.cond(use_penalties,
                     lambda x: apply_penalties(x, prompt_ids, output_ids, repetition, presence, frequency),
                     lambda x: x, logits)
    x = jax.lax.cond(use_mask, lambda x: jnp.where(allowed_mask, x, -jnp.inf), lambda x: x, x)
    greedy_tokens = jnp.argmax(x, axis=-1)

    def gumbel(seed, step):
        key = jax.random.fold_in(jax.random.key(seed), step)
        return jax.random.gumbel(key, (vocab,), jnp.float32)

    def draw(x):
        scaled = filter_logits(x / jnp.maximum(temperature, 1e-6)[:, None], top_k, top_p, min_p)
        return jnp.argmax(scaled + jax.vmap(gumbel)(seeds, steps), axis=-1)

    # An all-greedy batch (the common serving case) skips the vocabulary sort entirely.
    sampled = jax.lax.cond(jnp.all(temperature == 0), lambda x: greedy_tokens, draw, x)
    tokens = jnp.where(temperature == 0, greedy_tokens, sampled).astype(jnp.int32)
    token_lp = jnp.take_along_axis(raw_logprobs, tokens[:, None], axis=-1)[:, 0]
    ranks = (raw_logprobs > token_lp[:, None]).sum(axis=-1).astype(jnp.int32) + 1
    n = min(MAX_LOGPROBS, vocab)
    top_lp, top_ids = jax.lax.cond(
        want_top, lambda lp: tuple(jax.lax.top_k(lp, n)),
        lambda lp: (jnp.zeros((lp.shape[0], n), lp.dtype), jnp.zeros((lp.shape[0], n), jnp.int32)), raw_logprobs)
    return tokens, token_lp, ranks, top_ids, top_lp


@dataclass
class PromptLogprobs:
    logprobs: np.ndarray      # [P] float32: each prompt token given its prefix
    ranks: np.ndarray         # [P] int32, 1 = most likely
    top_ids: np.ndarray       # [P, n] int32
    top_logprobs: np.ndarray  # [P, n] float32


def prompt_logprobs(logits: np.ndarray, next_ids: np.ndarray, n: int) -> PromptLogprobs:
    """From the logits rows of the tokens before each prompt token: logits [P, V], next_ids [P]."""
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    lp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    chosen = lp[np.arange(len(next_ids)), next_ids]
    top = np.argsort(-lp, axis=-1, kind="stable")[:, :n]
    return PromptLogprobs(chosen.astype(np.float32), ((lp > chosen[:, None]).sum(-1) + 1).astype(np.int32),
                          top.astype(np.int32), np.take_along_axis(lp, top, axis=-1).astype(np.float32))


def chunk_prompt_logprobs(chunk_logits: np.ndarray, prompt: list[int], start: int, n: int) -> PromptLogprobs | None:
    """For a step that ran prompt positions [start, start + len(chunk_logits)) with these logits
    rows: the log-probabilities of the prompt tokens they predict (row p predicts token p + 1).
    None when the chunk predicts no prompt token (it starts at the prompt's last token)."""
    positions = np.arange(start, min(start + len(chunk_logits), len(prompt) - 1))
    if not len(positions):
        return None
    return prompt_logprobs(chunk_logits[positions - start], np.asarray(prompt)[positions + 1], n)


def unpack_token_bitmask(bitmask: np.ndarray, vocab_size: int) -> np.ndarray:
    """xgrammar's packed int32 bitmask [rows, ceil(V/32)] -> bool [rows, vocab_size]: token t is
    allowed iff bit (t & 31) of word (t >> 5) is set. Tokens beyond the mask's width are not allowed."""
    words = np.ascontiguousarray(bitmask, dtype=np.int32).view(np.uint32)
    bits = np.unpackbits(words.view(np.uint8).reshape(*words.shape, 4), axis=-1, bitorder="little")
    allowed = bits.reshape(words.shape[0], -1).astype(bool)
    out = np.zeros((words.shape[0], vocab_size), bool)
    width = min(vocab_size, allowed.shape[1])
    out[:, :width] = allowed[:, :width]
    return out
