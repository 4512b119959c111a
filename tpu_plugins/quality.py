"""How closely one engine configuration follows another on the same model: the accuracy cost
of int8 weights (or any other change) against the float baseline.

    report = compare(model_folder, prompts, baseline={"dtype": "bfloat16"},
                     candidate={"dtype": "bfloat16", "quantization": "int8"}, max_tokens=32)

The baseline generates greedily; then both configurations read the same text (prompt plus
the baseline's continuation) in one prefill, teacher-forced, so every position is compared
on identical inputs: top-1 agreement of the next token and the logit error over the
generated positions. Each configuration also generates on its own, for the length of the
greedy prefix both share. The engines are built one after the other, so only one model is
in memory at a time.
"""

from __future__ import annotations

from tpu_plugins import jax_env  # noqa: F401  (settles JAX's platform before jax is imported)

import gc
import math

import numpy as np

from tpu_plugins.batching import SeqChunk, ragged_batch
from tpu_plugins.engine import Engine, EngineConfig
from tpu_plugins.offline import GenerationParams, OfflineGenerator


def _run(model, prompts: list[list[int]], options: dict, max_tokens: int, forced: list[list[int]] | None):
    longest = max(len(p) for p in prompts) + max_tokens
    config = EngineConfig(model=model, **{**dict(max_model_len=longest, max_num_seqs=len(prompts),
                                                 max_num_batched_tokens=max(256, longest), progress=False), **options})
    engine = Engine(config)
    outs = OfflineGenerator(engine).generate(prompts, GenerationParams(max_tokens=max_tokens, ignore_eos=True))
    generated = [o.token_ids for o in outs]
    forced = forced or [p + g for p, g in zip(prompts, generated)]
    logits = []
    vocab = engine.model_config.vocab_size
    for seq in forced:
        pages = list(range(1, math.ceil(len(seq) / config.page_size) + 1))
        _, token_logits = engine.execute_with_token_logits(ragged_batch([SeqChunk(seq, 0, pages)], config.page_size))
        logits.append(np.asarray(token_logits[:, :vocab], np.float32))
    weight_bytes = engine.weight_bytes()
    del engine
    gc.collect()
    return generated, forced, logits, weight_bytes


def compare(model, prompts: list[list[int]], baseline: dict, candidate: dict, max_tokens: int = 32) -> dict:
    base_tokens, forced, base_logits, base_bytes = _run(model, prompts, baseline, max_tokens, None)
    cand_tokens, _, cand_logits, cand_bytes = _run(model, prompts, candidate, max_tokens, forced)
    agree, abs_err, rel_err, prefixes = [], [], [], []
    for prompt, b, c, bt, ct in zip(prompts, base_logits, cand_logits, base_tokens, cand_tokens):
        rows = slice(len(prompt) - 1, len(prompt) - 1 + max_tokens)     # the positions that predicted the continuation
        b, c = b[rows], c[rows]
        agree.extend(np.argmax(b, -1) == np.argmax(c, -1))
        abs_err.append(np.abs(b - c).max())
        rel_err.append(float(np.mean(np.abs(b - c)) / np.mean(np.std(b, -1))))
        prefixes.append(next((i for i, (x, y) in enumerate(zip(bt, ct)) if x != y), len(bt)))
    return {
        "prompts": len(prompts), "positions": len(agree), "max_tokens": max_tokens,
        "top1_agreement": float(np.mean(agree)),
        "max_abs_logit_error": float(max(abs_err)),
        "mean_abs_logit_error_over_logit_std": float(np.mean(rel_err)),
        "greedy_identical_sequences": sum(p == max_tokens for p in prefixes) / len(prompts),
        "greedy_prefix_mean": float(np.mean(prefixes)),
        "weight_bytes": {"baseline": base_bytes, "candidate": cand_bytes},
        "weight_bytes_ratio": cand_bytes / base_bytes,
    }
