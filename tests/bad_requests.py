"""The bad-input table for the OpenAI-compatible servers (vLLM and SGLang).

Each case is (name, endpoint, body, what the error must mention, frameworks that accept it).
`body` is a dict sent as JSON, or bytes sent as they are (invalid JSON, invalid UTF-8), or None
(no body at all). `mentions` is a regular expression the error message must match
(case-insensitive): it names the problem. Every case gets a 4xx, never a 5xx, and leaves the
server serving, except where a framework by design accepts the request (SGLang serves its one
model whatever `model` says, and ignores `top_logprobs` without `logprobs`): there it must
succeed.
"""

from __future__ import annotations

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
MODEL = "smollm2"
LONG_PROMPT = "hello " * 3000


def completion(**fields) -> dict:
    return {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 4, **fields}


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **fields}


BAD_SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": 7}}}

CASES = [
    ("empty_prompt", COMPLETIONS, completion(prompt=""), r"prompt|empty|input"),
    ("empty_token_list", COMPLETIONS, completion(prompt=[]), r"prompt|empty|input"),
    ("prompt_over_context", COMPLETIONS, completion(prompt=LONG_PROMPT), r"context|length|long|tokens"),
    ("chat_over_context", CHAT, chat(messages=[{"role": "user", "content": LONG_PROMPT}]), r"context|length|long|tokens"),
    ("max_tokens_zero", COMPLETIONS, completion(max_tokens=0), r"max_tokens|max_new_tokens|at least"),
    ("max_tokens_negative", COMPLETIONS, completion(max_tokens=-1), r"max_tokens|max_new_tokens|at least|greater"),
    ("max_tokens_over_context", COMPLETIONS, completion(max_tokens=10**6), r"max_tokens|context|length|tokens"),
    ("temperature_negative", COMPLETIONS, completion(temperature=-1), r"temperature"),
    ("temperature_string", COMPLETIONS, completion(temperature="hot"), r"temperature|float|number"),
    ("top_p_zero", COMPLETIONS, completion(top_p=0), r"top_p"),
    ("top_p_above_one", COMPLETIONS, completion(top_p=1.5), r"top_p"),
    ("top_k_below_minus_one", COMPLETIONS, completion(top_k=-2), r"top_k"),
    ("n_zero", COMPLETIONS, completion(n=0), r"\bn\b"),
    ("logprobs_negative", COMPLETIONS, completion(logprobs=-1), r"logprobs"),
    ("logprobs_above_limit", COMPLETIONS, completion(logprobs=100), r"logprobs"),
    ("chat_top_logprobs_above_limit", CHAT, chat(logprobs=True, top_logprobs=100), r"logprobs"),
    ("chat_top_logprobs_without_logprobs", CHAT, chat(top_logprobs=3), r"logprobs", ("sglang",)),
    ("presence_penalty_out_of_range", COMPLETIONS, completion(presence_penalty=5), r"presence_penalty"),
    ("frequency_penalty_out_of_range", COMPLETIONS, completion(frequency_penalty=-5), r"frequency_penalty"),
    ("invalid_utf8", COMPLETIONS, b'{"model": "smollm2", "prompt": "\xff\xfe bad", "max_tokens": 4}',
     r"utf|decode|json|invalid|pars"),
    ("lone_surrogate", COMPLETIONS,
     b'{"model": "smollm2", "prompt": "a \\ud800 b", "max_tokens": 4}', r"surrogate|utf|encode|invalid|prompt"),
    ("thousand_stop_strings", COMPLETIONS, completion(stop=[f"stop{i}" for i in range(1000)]), r"stop"),
    ("invalid_json_schema", CHAT, chat(response_format=BAD_SCHEMA), r"schema|json|grammar|invalid"),
    ("unknown_response_format", CHAT, chat(response_format={"type": "yaml"}), r"response_format|type|yaml|input"),
    ("unknown_model", COMPLETIONS, completion(model="no-such-model"), r"model", ("sglang",)),
    ("max_tokens_string", COMPLETIONS, completion(max_tokens="ten"), r"max_tokens|integer|int"),
    ("messages_not_a_list", CHAT, chat(messages="Hi"), r"messages|list|input"),
    ("chat_empty_messages", CHAT, chat(messages=[]), r"messages|empty|input|at least"),
    ("prompt_missing", COMPLETIONS, {"model": MODEL, "max_tokens": 4}, r"prompt|field required|missing|input"),
    ("token_id_out_of_vocab", COMPLETIONS, completion(prompt=[10**9]), r"token|vocab|range|id"),
    ("token_id_negative", COMPLETIONS, completion(prompt=[-5, 3]), r"token|vocab|range|id|negative"),
    ("stop_wrong_type", COMPLETIONS, completion(stop=5), r"stop|string|list|input"),
    ("seed_string", COMPLETIONS, completion(seed="abc"), r"seed|integer|int"),
    ("logit_bias", COMPLETIONS, completion(logit_bias={"42": 5}), r"logit_bias"),
    ("body_not_json", COMPLETIONS, b"hello, not json", r"json|decode|expect|invalid|pars"),
    ("body_missing", COMPLETIONS, None, r"json|body|field required|missing|input|expect"),
    ("body_is_list", COMPLETIONS, b"[1, 2, 3]", r"object|dict|input|valid|json"),
]

CASES = [case if len(case) == 5 else (*case, ()) for case in CASES]
