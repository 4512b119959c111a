"""`python -m sglang.launch_server --device tpu` with the real SGLang, checked against plain
transformers on CPU. One server for the whole module; SGLang's own test kits run against it too."""

import json
import re
import unittest

import numpy as np
import openai
import pytest
import requests
import torch
from conftest import PROMPTS, chat_prompt_ids, hf_greedy, hf_last_logits
from servers import sglang_serve
from transformers import AutoModelForCausalLM, AutoTokenizer

COMPLETION_PROMPTS = ["The capital of France is", "def fibonacci(n):", "Three colours of the rainbow are",
                      "Once upon a time, in a small village by the sea,"]


@pytest.fixture(scope="module")
def server(demo_model_path, tmp_path_factory):
    srv = sglang_serve(demo_model_path, tmp_path_factory.mktemp("sglang") / "server.log", "--dtype", "float32",
                       "--context-length", "2048", "--max-total-tokens", "8192", "--max-running-requests", "8",
                       "--chunked-prefill-size", "128").wait_ready()
    yield srv
    log = srv.log()
    srv.stop()
    assert "Traceback" not in log, log[-5000:]


@pytest.fixture(scope="module")
def hf(demo_model_path):
    return (AutoModelForCausalLM.from_pretrained(demo_model_path, dtype=torch.float32).eval(),
            AutoTokenizer.from_pretrained(demo_model_path))


def generate(server, **body):
    response = requests.post(server.base_url + "/generate", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def test_server_info_keeps_the_users_device(server):
    info = requests.get(server.base_url + "/server_info", timeout=30).json()
    assert info["device"] == "tpu"
    assert info["disable_overlap_schedule"] is True


def test_greedy_generate_equals_transformers(server, hf):
    model, tok = hf
    for prompt in COMPLETION_PROMPTS:
        ids = tok(prompt)["input_ids"]
        out = generate(server, input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 24,
                                                               "ignore_eos": True})
        assert out["output_ids"] == hf_greedy(model, ids, 24, stop_at_eos=False), prompt


def test_concurrent_chat_completions_equal_transformers(server, hf):
    import concurrent.futures

    model, tok = hf
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", timeout=300)

    def ask(text):
        return client.chat.completions.create(model="default", messages=[{"role": "user", "content": text}],
                                              temperature=0, max_tokens=40)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(ask, PROMPTS))
    for text, answer in zip(PROMPTS, answers):
        expected = tok.decode(hf_greedy(model, chat_prompt_ids(tok, text), 40), skip_special_tokens=True)
        assert answer.choices[0].message.content == expected.strip(), text


def test_streaming_equals_non_streaming(server):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", timeout=300)
    kwargs = dict(model="default", prompt=COMPLETION_PROMPTS[1], temperature=0, max_tokens=24)
    whole = client.completions.create(**kwargs).choices[0].text
    pieces = [c.choices[0].text for c in client.completions.create(stream=True, **kwargs) if c.choices]
    assert "".join(pieces) == whole and whole


def test_repeated_prefix_is_served_from_the_radix_cache(server, hf):
    model, tok = hf
    prefix = "Here is a long shared instruction that every request repeats word for word. " * 6
    ids = tok(prefix + "Question: name a colour.")["input_ids"]
    body = dict(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 12, "ignore_eos": True})
    first, second = generate(server, **body), generate(server, **body)
    assert second["meta_info"]["cached_tokens"] >= len(ids) - 16
    assert first["output_ids"] == second["output_ids"] == hf_greedy(model, ids, 12, stop_at_eos=False)


def test_logprobs_match_transformers(server, hf):
    model, tok = hf
    ids = tok(COMPLETION_PROMPTS[2])["input_ids"]
    out = generate(server, input_ids=ids, return_logprob=True, top_logprobs_num=3, logprob_start_len=0,
                   sampling_params={"temperature": 0, "max_new_tokens": 4, "ignore_eos": True})
    meta = out["meta_info"]
    full = ids + out["output_ids"]
    logits = torch.log_softmax(torch.tensor(hf_last_logits(model, full)), -1).numpy()
    for k, (value, token, _) in enumerate(meta["output_token_logprobs"]):
        row = logits[len(ids) - 1 + k]
        assert token == out["output_ids"][k]
        assert value == pytest.approx(row[token], abs=1e-3)
        top = meta["output_top_logprobs"][k]
        assert [t for _, t, _ in top] == list(np.argsort(-row)[:3])
    prompt_lps = meta["input_token_logprobs"]
    assert len(prompt_lps) == len(ids) and prompt_lps[0][0] is None
    for j, (value, token, _) in enumerate(prompt_lps[1:], start=1):
        assert token == ids[j] and value == pytest.approx(logits[j - 1][ids[j]], abs=1e-3)


def test_seeded_sampling_is_reproducible(server):
    body = dict(text=COMPLETION_PROMPTS[3], sampling_params={"temperature": 1.0, "top_p": 0.9, "top_k": 50,
                                                             "max_new_tokens": 16, "sampling_seed": 1234,
                                                             "ignore_eos": True})
    assert generate(server, **body)["output_ids"] == generate(server, **body)["output_ids"]


def test_regex_and_json_schema_constrained_outputs(server):
    out = generate(server, text="My phone number is ", sampling_params={
        "temperature": 0, "max_new_tokens": 20, "regex": r"\(\d{3}\) \d{3}-\d{4}"})
    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", out["text"])
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    out = generate(server, text="A person as JSON: ", sampling_params={
        "temperature": 0, "max_new_tokens": 48, "json_schema": json.dumps(schema)})
    value = json.loads(out["text"])
    assert set(value) == {"name", "age"} and isinstance(value["age"], int)


def test_min_new_tokens_holds_back_the_end_of_sequence(server, hf):
    model, tok = hf
    ids = chat_prompt_ids(tok, PROMPTS[0])
    natural = hf_greedy(model, ids, 40)
    assert len(natural) < 20   # the model answers and stops early on its own
    out = generate(server, input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 30,
                                                           "min_new_tokens": 20})
    assert len(out["output_ids"]) >= 20
    assert tok.eos_token_id not in out["output_ids"][:19]


def test_bad_requests_get_errors_and_the_server_keeps_serving(server, hf):
    too_long = requests.post(server.base_url + "/generate", json={
        "input_ids": [1] * 2100, "sampling_params": {"max_new_tokens": 4}}, timeout=60)
    assert too_long.status_code == 400 and "context length" in too_long.text.lower()
    bad_temperature = requests.post(server.base_url + "/generate", json={
        "text": "hi", "sampling_params": {"temperature": -1}}, timeout=60)
    assert bad_temperature.status_code == 400
    bias = requests.post(server.base_url + "/generate", json={
        "text": "hi", "sampling_params": {"max_new_tokens": 4, "logit_bias": {"5": 3.0}}}, timeout=60)
    assert bias.status_code == 400 and "logit_bias" in bias.text
    test_greedy_generate_equals_transformers(server, hf)


# -- SGLang's own test kits, shipped in the wheel, against this server ----------------------------
# The kits that pass whole, every run, with the 135M demo model. Others fail only on what the
# model writes: regex_constrained passes 7 of 8 (in the 8th the model repeats letters inside an
# unbounded [a-z]+ field until the kit's token limit, or not, depending on the batch it shares),
# json_constrained 2 of 4 (strings cut by the token limit), matched_stop 3 of 4 (a 1000-token
# story that never reaches EOS).
from sglang.test.kits.basic_api_contract_kit import BasicAPIContractMixin  # noqa: E402

KITS = {"basic_api_contract": BasicAPIContractMixin}


@pytest.mark.parametrize("kit", sorted(KITS))
def test_sglang_test_kit_passes(server, kit):
    case = type(f"Kit_{kit}", (KITS[kit], unittest.TestCase),
                {"base_url": server.base_url, "model": "default", "process": None})
    result = unittest.TextTestRunner(verbosity=0).run(unittest.defaultTestLoader.loadTestsFromTestCase(case))
    assert result.wasSuccessful(), [str(f[1])[-1500:] for f in result.failures + result.errors]
