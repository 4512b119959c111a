"""vLLM SamplingParams -> the core's SamplingParams, and what the core cannot honour.

Stop strings, max_tokens, EOS and `n` are vLLM's (scheduler, detokenizer, front end); the
rest is sampling, which the core does on device.
"""

from __future__ import annotations

from tpu_plugins.sampling import MAX_LOGPROBS, SamplingParams

GREEDY_BELOW = 1e-5   # vLLM treats temperatures under this as greedy


def unsupported_options(params) -> list[str]:
    problems = []
    if params.logit_bias:
        problems.append("logit_bias")
    if params.bad_words:
        problems.append("bad_words")
    if getattr(params, "logits_processors", None):
        problems.append("custom logits processors")
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(params, name)
        if value is not None and not 0 <= value <= MAX_LOGPROBS:
            problems.append(f"{name}={value} (use 0 to {MAX_LOGPROBS})")
    return problems


def to_core(params) -> SamplingParams:
    greedy = params.temperature < GREEDY_BELOW
    return SamplingParams(
        temperature=0.0 if greedy else params.temperature,
        top_k=0 if greedy or params.top_k in (-1, 0) else params.top_k,
        top_p=1.0 if greedy else params.top_p,
        min_p=0.0 if greedy else params.min_p,
        repetition_penalty=params.repetition_penalty,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        seed=params.seed,
        logprobs=params.logprobs,
    )
