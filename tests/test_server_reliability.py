"""Reliability of both servers (vLLM and SGLang, the real frameworks). One server per framework.

Bad input: every case in tests/bad_requests.py gets a 4xx whose message names the problem, never
a 5xx, and after each one the server still answers a greedy request with transformers' tokens.
Determinism: a seeded sampled request gives the same tokens alone, again, and inside a batch of
other concurrent requests.
Fuzzing: 200 hypothesis-made requests per server (valid and invalid parameters, prompts,
messages, streamed or not), the same 200 on every run: none gets a 5xx, and the server is alive
and correct afterwards.
"""

import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from bad_requests import CASES, CHAT, COMPLETIONS, MODEL
from conftest import hf_greedy
from servers import sglang_serve, start_for_module, vllm_serve
from transformers import AutoModelForCausalLM, AutoTokenizer

PROBE_PROMPT = "The capital of France is"


def _start(framework: str, model, log):
    if framework == "vllm":
        return vllm_serve(model, log, "--served-model-name", MODEL, "--dtype", "float32", "--max-model-len", "512",
                          "--max-num-seqs", "8", "--max-num-batched-tokens", "128", "--max-logprobs", "20")
    return sglang_serve(model, log, "--served-model-name", MODEL, "--dtype", "float32", "--context-length", "512",
                        "--max-total-tokens", "4096", "--max-running-requests", "8", "--chunked-prefill-size", "128")


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def server(request, demo_model_path, tmp_path_factory):
    srv = start_for_module(request.param, _start, demo_model_path, tmp_path_factory)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def expected_probe(demo_model_path):
    model = AutoModelForCausalLM.from_pretrained(demo_model_path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(demo_model_path)
    return tokenizer.decode(hf_greedy(model, tokenizer(PROBE_PROMPT)["input_ids"], 6, stop_at_eos=False))


def assert_alive_and_correct(server, expected_probe: str) -> None:
    """/health answers, and a greedy completion still gives transformers' tokens."""
    assert requests.get(server.base_url + "/health", timeout=30).status_code == 200
    probe = requests.post(server.base_url + "/v1/completions", timeout=120, json={
        "model": MODEL, "prompt": PROBE_PROMPT, "max_tokens": 6, "temperature": 0})
    assert probe.status_code == 200 and probe.json()["choices"][0]["text"] == expected_probe


def send(server, endpoint: str, body):
    url = server.base_url + endpoint
    if body is None:
        return requests.post(url, timeout=120)
    if isinstance(body, bytes):
        return requests.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=120)
    return requests.post(url, json=body, timeout=120)


def error_message(response) -> str:
    try:
        payload = response.json()
    except ValueError:
        return response.text
    if isinstance(payload, dict):
        error = payload.get("error", payload)
        if isinstance(error, dict):
            return str(error.get("message", error))
        return str(payload.get("message") or payload.get("detail") or error)
    return str(payload)


@pytest.mark.parametrize("name,endpoint,body,mentions,accepted_by", CASES, ids=[c[0] for c in CASES])
def test_bad_request_is_refused_and_server_keeps_serving(server, expected_probe, name, endpoint, body, mentions,
                                                         accepted_by):
    response = send(server, endpoint, body)
    message = error_message(response)
    if server.framework in accepted_by:
        assert response.status_code == 200, f"{server.framework} {name}: {response.status_code} {message[:500]}"
    else:
        assert 400 <= response.status_code < 500, f"{server.framework} {name}: {response.status_code} {message[:500]}"
        assert re.search(mentions, message, re.IGNORECASE), f"{server.framework} {name}: message {message[:500]!r}"
    assert_alive_and_correct(server, expected_probe)


def test_seeded_sampling_is_the_same_alone_and_in_any_batch(server):
    def sample(prompt, seed):
        response = requests.post(server.base_url + "/v1/completions", timeout=300, json={
            "model": MODEL, "prompt": prompt, "max_tokens": 16, "temperature": 1.0, "top_p": 0.95, "seed": seed})
        assert response.status_code == 200, response.text[:500]
        return response.json()["choices"][0]["text"]

    alone = sample(PROBE_PROMPT, 1234)
    assert sample(PROBE_PROMPT, 1234) == alone
    others = [f"Story number {i}: once upon a time" for i in range(7)]
    with ThreadPoolExecutor(8) as pool:
        in_batch = pool.submit(sample, PROBE_PROMPT, 1234)
        noise = [pool.submit(sample, p, i) for i, p in enumerate(others)]
        assert in_batch.result() == alone
        [f.result() for f in noise]
    assert sample(PROBE_PROMPT, 4321) != alone or sample(PROBE_PROMPT, 99) != alone


# -- fuzzing: hypothesis-made requests, valid and not; none may get a 5xx or hurt the server ------
# Half the requests draw every field from its valid range (so generation is exercised), half from
# anything (wrong types, out-of-range values, odd text). max_tokens is always given and small or
# absurd: a missing one means "up to the context", which is slow, not interesting.
_text = st.text(max_size=40)
_wild_number = st.one_of(st.floats(-2, 3, allow_nan=False), st.integers(-3, 3), st.none(), st.text(max_size=3))
# Objects only: SGLang 0.5.23's chat request validator calls .get() on response_format, so a
# string there is a 500 from SGLang itself, before any plugin code (reported in issue 8's note).
_formats = st.sampled_from([{"type": "json_object"}, {"type": "text"}, {"type": "bogus"}, {}])


def _request_strategy(valid: bool):
    if valid:
        fields = {
            "temperature": st.floats(0, 2), "top_p": st.floats(0.05, 1), "min_p": st.floats(0, 0.5),
            "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2),
            "repetition_penalty": st.floats(0.5, 2), "top_k": st.sampled_from([-1, 1, 5, 40]),
            "n": st.integers(1, 3), "min_tokens": st.integers(0, 2), "ignore_eos": st.booleans(),
            "seed": st.integers(0, 2**63 - 1), "stop": st.lists(st.text(min_size=1, max_size=5), max_size=3),
            "stream": st.booleans(), "response_format": st.sampled_from([{"type": "json_object"}, {"type": "text"}])}
        max_tokens = st.integers(1, 8)
        prompt = st.one_of(st.text(min_size=1, max_size=40), st.lists(st.integers(0, 49151), min_size=1, max_size=12))
        messages = st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": st.text(min_size=1, max_size=40)}),
                            min_size=1, max_size=2)
        completion_extra = {"logprobs": st.integers(0, 5), "echo": st.booleans()}
        chat_extra = {"logprobs": st.just(True), "top_logprobs": st.integers(0, 5)}
    else:
        fields = {
            "temperature": _wild_number, "top_p": _wild_number, "min_p": _wild_number, "presence_penalty": _wild_number,
            "frequency_penalty": _wild_number, "repetition_penalty": _wild_number,
            "top_k": st.one_of(st.integers(-3, 60), st.text(max_size=2)),
            "n": st.integers(-1, 3), "min_tokens": st.integers(-2, 6), "ignore_eos": st.booleans(),
            "seed": st.one_of(st.integers(-2**63, 2**64), st.text(max_size=3)),
            "stop": st.one_of(_text, st.lists(_text, max_size=4), st.integers()),
            "stream": st.booleans(), "response_format": _formats}
        max_tokens = st.one_of(st.integers(-3, 8), st.just(10**6), st.text(max_size=3), st.none())
        prompt = st.one_of(_text, st.lists(st.integers(-5, 60000), max_size=12), st.integers())
        messages = st.lists(st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system", "assistant", "bogus"]),
             "content": st.one_of(_text, st.none(), st.integers())}), max_size=3)
        completion_extra = {"logprobs": st.one_of(st.integers(-2, 30), st.booleans()), "echo": st.booleans()}
        chat_extra = {"logprobs": st.booleans(), "top_logprobs": st.integers(-2, 30)}
    completion = st.fixed_dictionaries({"prompt": prompt, "max_tokens": max_tokens},
                                       optional={**fields, **completion_extra})
    chat = st.fixed_dictionaries({"messages": messages, "max_tokens": max_tokens}, optional={**fields, **chat_extra})
    return st.one_of(st.tuples(st.just(COMPLETIONS), completion), st.tuples(st.just(CHAT), chat))


def _hits_vllm_echo_merge_bug(request) -> bool:
    """vLLM 0.33: streamed `n` > 1 with `echo` and `logprobs` answers 500 (KeyError on the first prompt
    token) when the children start in different engine steps: RequestOutput.add, merging them,
    keeps the first output's prompt_logprobs (None after its first chunk) and drops the next
    child's. A framework bug on any platform (reported in issue 8's note); left out here."""
    endpoint, body = request
    n = body.get("n")
    return bool(body.get("echo") and body.get("stream") and body.get("logprobs") is not None
                and isinstance(n, int) and n > 1)


_requests = st.one_of(_request_strategy(valid=True), _request_strategy(valid=False)).filter(
    lambda r: not _hits_vllm_echo_merge_bug(r))


@settings(max_examples=200, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(request=_requests)
def _fuzz(server, outcomes, request):
    endpoint, body = request
    body = {"model": MODEL, **{k: v for k, v in body.items() if v is not None or k == "max_tokens"}}
    try:   # at most 8 tokens x 3 choices: a minute is a hang, not a slow answer
        response = requests.post(server.base_url + endpoint, json=body, timeout=60, stream=bool(body.get("stream")))
        text = response.text
    except requests.RequestException as exc:
        raise AssertionError(f"{endpoint} {body!r}: no answer ({exc})") from None
    outcomes[response.status_code] += 1
    assert response.status_code < 500, f"{endpoint} {body!r} -> {response.status_code} {text[:500]}"
    assert "InternalServerError" not in text and '"code":500' not in text.replace(" ", ""), (body, text[-500:])
    if response.status_code == 200 and not body.get("stream"):
        choices = response.json()["choices"]
        assert len(choices) == body.get("n", 1), (body, text[:500])


def test_fuzzed_requests_get_no_5xx_and_the_server_keeps_serving(server, expected_probe):
    outcomes = Counter()
    _fuzz(server, outcomes)
    print(f"\n{server.framework} fuzzing: {sum(outcomes.values())} requests, HTTP status counts {dict(outcomes)}")
    assert outcomes[200] >= 50, f"too few valid requests to exercise generation: {dict(outcomes)}"
    assert_alive_and_correct(server, expected_probe)
