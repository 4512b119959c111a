"""Sampling on device against independent references (NumPy and transformers' logits processors)."""

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from tpu_plugins import jax_env  # noqa: F401
import jax.numpy as jnp

from tpu_plugins import sampling
from tpu_plugins.errors import UserError

V = 8
LOGITS = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0], np.float32)


def draw(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seeds=None, steps=None, mask=None, top=False):
    rows = logits.shape[0]
    f = lambda v, d=np.float32: np.full(rows, v, d)  # noqa: E731
    seeds = np.arange(rows, dtype=np.uint32) if seeds is None else np.asarray(seeds, np.uint32)
    steps = np.zeros(rows, np.int32) if steps is None else np.asarray(steps, np.int32)
    out = sampling.sample(
        jnp.asarray(logits), f(temperature), f(top_k, np.int32), f(top_p), f(min_p), seeds, steps,
        f(1.0), f(0.0), f(0.0), np.full((rows, 1), -1, np.int32), np.full((rows, 1), -1, np.int32),
        np.ones((rows, V), bool) if mask is None else mask, np.bool_(False), np.bool_(mask is not None), np.bool_(top))
    return [None if x is None else np.asarray(x) for x in out]


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def frequencies(tokens):
    return np.bincount(tokens, minlength=V) / len(tokens)


N = 6000


def test_greedy_is_argmax():
    logits = np.random.default_rng(0).normal(size=(16, V)).astype(np.float32)
    tokens, *_ = draw(logits, temperature=0.0)
    assert (tokens == logits.argmax(-1)).all()


def test_temperature_samples_follow_the_softmax():
    tokens, *_ = draw(np.tile(LOGITS, (N, 1)), temperature=0.7)
    assert np.abs(frequencies(tokens) - softmax(LOGITS / 0.7)).max() < 0.025


def test_top_k_keeps_the_k_best_renormalised():
    tokens, *_ = draw(np.tile(LOGITS, (N, 1)), top_k=3)
    want = np.zeros(V)
    want[:3] = softmax(LOGITS[:3])
    assert set(np.unique(tokens)) <= {0, 1, 2}
    assert np.abs(frequencies(tokens) - want).max() < 0.025


def test_top_p_keeps_the_nucleus():
    probs = softmax(LOGITS)
    nucleus = int(np.searchsorted(np.cumsum(probs), 0.8) + 1)   # smallest prefix with mass >= 0.8
    tokens, *_ = draw(np.tile(LOGITS, (N, 1)), top_p=0.8)
    assert set(np.unique(tokens)) == set(range(nucleus))


def test_min_p_drops_unlikely_tokens():
    probs = softmax(LOGITS)
    tokens, *_ = draw(np.tile(LOGITS, (N, 1)), min_p=0.3)
    assert set(np.unique(tokens)) == set(np.flatnonzero(probs >= 0.3 * probs.max()))


def test_same_seed_and_step_same_token_whatever_the_batch():
    logits = np.tile(LOGITS, (64, 1))
    rng = np.random.default_rng(3)
    seeds, steps = rng.integers(0, 2**32, 64), rng.integers(0, 100, 64)
    together, *_ = draw(logits, seeds=seeds, steps=steps)
    order = rng.permutation(64)
    shuffled, *_ = draw(logits[order], seeds=seeds[order], steps=steps[order])
    alone = [draw(logits[i:i + 1], seeds=seeds[i:i + 1], steps=steps[i:i + 1])[0][0] for i in range(8)]
    assert (shuffled == together[order]).all()
    assert list(together[:8]) == alone
    assert len(set(together.tolist())) > 2   # different seeds do differ


def test_logprobs_ranks_and_top_n_are_those_of_the_raw_logits():
    logits = np.random.default_rng(1).normal(size=(4, V)).astype(np.float32) * 3
    tokens, lps, ranks, top_ids, top_lps = draw(logits, temperature=1.5, top=True)
    ref = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    for i in range(4):
        assert abs(lps[i] - ref[i, tokens[i]]) < 1e-5
        assert ranks[i] == 1 + (ref[i] > ref[i, tokens[i]]).sum()
        assert list(top_ids[i, :V]) == list(np.argsort(-ref[i]))
        np.testing.assert_allclose(top_lps[i, :V], np.sort(ref[i])[::-1], atol=1e-5)


def test_allowed_mask_restricts_both_greedy_and_sampled_tokens():
    mask = np.zeros((N, V), bool)
    mask[:, [3, 6]] = True
    sampled, *_ = draw(np.tile(LOGITS, (N, 1)), mask=mask)
    greedy, *_ = draw(np.tile(LOGITS, (N, 1)), temperature=0.0, mask=mask)
    assert set(np.unique(sampled)) == {3, 6} and (greedy == 3).all()


def test_repetition_penalty_matches_transformers():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(3, 50)).astype(np.float32) * 4
    prompt = np.array([[1, 2, 3, -1], [7, 7, -1, -1], [40, 41, 42, 43]], np.int32)
    output = np.array([[5, -1], [8, 9], [-1, -1]], np.int32)
    ours = np.asarray(sampling.apply_penalties(jnp.asarray(logits), prompt, output, jnp.full(3, 1.3),
                                               jnp.zeros(3), jnp.zeros(3)))
    for i in range(3):
        seen = [t for t in np.concatenate([prompt[i], output[i]]) if t >= 0]
        ref = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([seen]), torch.tensor(logits[i:i + 1]))
        np.testing.assert_allclose(ours[i], ref[0].numpy(), rtol=1e-6)


def test_presence_and_frequency_penalties_follow_the_openai_formula():
    logits = np.zeros((1, 10), np.float32)
    output = np.array([[4, 4, 4, 7, -1]], np.int32)
    ours = np.asarray(sampling.apply_penalties(jnp.asarray(logits), np.full((1, 1), -1, np.int32), output,
                                               jnp.ones(1), jnp.full(1, 0.5), jnp.full(1, 0.25)))[0]
    want = np.zeros(10)
    want[4] = -(3 * 0.25 + 0.5)
    want[7] = -(1 * 0.25 + 0.5)
    np.testing.assert_allclose(ours, want, atol=1e-6)


@pytest.mark.parametrize("kwargs,message", [
    (dict(temperature=-0.1), "temperature must be >= 0"),
    (dict(top_p=0.0), "top_p must be in (0, 1]"),
    (dict(top_p=1.5), "top_p must be in (0, 1]"),
    (dict(top_k=-2), "top_k must be -1"),
    (dict(min_p=2.0), "min_p must be in [0, 1]"),
    (dict(logprobs=21), "logprobs must be between 0 and 20"),
    (dict(repetition_penalty=0.0), "repetition_penalty must be > 0"),
    (dict(seed=-1), "seed must be a non-negative integer"),
])
def test_invalid_parameters_are_named(kwargs, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        sampling.SamplingParams(**kwargs)
