"""Reliability of both servers (vLLM and SGLang, the real frameworks). One server per framework.

Bad input: every case in tests/bad_requests.py gets a 4xx whose message names the problem, never
a 5xx, and after each one the server still answers a greedy request with transformers' tokens.
Determinism: a seeded sampled request gives the same tokens alone, again, and inside a batch of
other concurrent requests.
"""

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch
from bad_requests import CASES, MODEL
from conftest import hf_greedy
from servers import sglang_serve, vllm_serve
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
    srv = _start(request.param, demo_model_path, tmp_path_factory.mktemp(request.param) / "server.log").wait_ready()
    srv.framework = request.param
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def expected_probe(demo_model_path):
    model = AutoModelForCausalLM.from_pretrained(demo_model_path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(demo_model_path)
    return tokenizer.decode(hf_greedy(model, tokenizer(PROBE_PROMPT)["input_ids"], 6, stop_at_eos=False))


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
    assert requests.get(server.base_url + "/health", timeout=30).status_code == 200
    probe = requests.post(server.base_url + "/v1/completions", timeout=120, json={
        "model": MODEL, "prompt": PROBE_PROMPT, "max_tokens": 6, "temperature": 0})
    assert probe.status_code == 200 and probe.json()["choices"][0]["text"] == expected_probe


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
