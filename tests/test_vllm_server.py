"""`vllm serve MODEL --device tpu` with the real vLLM, queried with the real openai client, checked
against plain transformers on CPU. One server for the whole module."""

import json
import re

import numpy as np
import openai
import pytest
import requests
import torch
from conftest import PROMPTS, hf_greedy, hf_last_logits
from servers import vllm_serve
from transformers import AutoModelForCausalLM, AutoTokenizer

MODEL = "smollm2"
COMPLETION_PROMPTS = ["The capital of France is", "def fibonacci(n):", "Three colours of the rainbow are",
                      "Once upon a time, in a small village by the sea,"]


@pytest.fixture(scope="module")
def server(demo_model_path, tmp_path_factory):
    srv = vllm_serve(demo_model_path, tmp_path_factory.mktemp("vllm") / "server.log",
                     "--served-model-name", MODEL, "--dtype", "float32", "--max-model-len", "512",
                     "--max-num-seqs", "8", "--max-num-batched-tokens", "128", "--max-logprobs", "20",
                     "--enable-prompt-tokens-details").wait_ready()
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", timeout=300)


@pytest.fixture(scope="module")
def hf(demo_model_path):
    return (AutoModelForCausalLM.from_pretrained(demo_model_path, dtype=torch.float32).eval(),
            AutoTokenizer.from_pretrained(demo_model_path))


def test_greedy_completions_equal_transformers(client, hf):
    model, tok = hf
    for prompt in COMPLETION_PROMPTS:
        out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
        ids = tok(prompt)["input_ids"]
        assert out.choices[0].text == tok.decode(hf_greedy(model, ids, 24, stop_at_eos=False))


def test_greedy_chat_equals_transformers(client, hf):
    model, tok = hf
    for text in PROMPTS:
        out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}],
                                             max_tokens=40, temperature=0)
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      return_dict=True)["input_ids"]
        assert out.choices[0].message.content == tok.decode(hf_greedy(model, ids, 40), skip_special_tokens=True)


def test_streaming_equals_non_streaming(client):
    for prompt in COMPLETION_PROMPTS[:2]:
        whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0).choices[0].text
        pieces = client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0, stream=True)
        assert "".join(c.choices[0].text for c in pieces) == whole
    messages = [{"role": "user", "content": PROMPTS[1]}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=30, temperature=0)
    pieces = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=30, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in pieces if c.choices) == whole.choices[0].message.content


def test_logprobs_equal_transformers(client, hf):
    model, tok = hf
    prompt = COMPLETION_PROMPTS[0]
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logprobs=3)
    lp = out.choices[0].logprobs
    ids = tok(prompt)["input_ids"]
    new = hf_greedy(model, ids, 6, stop_at_eos=False)
    ref = torch.log_softmax(torch.tensor(hf_last_logits(model, ids + new)), -1).numpy()
    for i, token in enumerate(new):
        row = ref[len(ids) - 1 + i]
        assert abs(lp.token_logprobs[i] - row[token]) < 1e-3
        top = {tok.decode([t]): row[t] for t in np.argsort(-row)[:3]}
        assert set(lp.top_logprobs[i]) == set(top)
    zero = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0, logprobs=0)
    assert len(zero.choices[0].logprobs.token_logprobs) == 3
    assert all(len(t) <= 1 for t in zero.choices[0].logprobs.top_logprobs)


def test_prompt_logprobs_equal_transformers(client, hf):
    model, tok = hf
    prompt = COMPLETION_PROMPTS[3]
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0,
                                    extra_body={"prompt_logprobs": 2})
    got = out.choices[0].prompt_logprobs
    ids = tok(prompt)["input_ids"]
    ref = torch.log_softmax(torch.tensor(hf_last_logits(model, ids)), -1).numpy()
    assert got[0] is None and len(got) == len(ids)
    for p in range(1, len(ids)):
        assert abs(got[p][str(ids[p])]["logprob"] - ref[p - 1][ids[p]]) < 1e-3


def test_one_token_prompt_with_prompt_logprobs_and_echo(client, server):
    # No prompt token is predicted, so the prompt logprobs have no rows; a zero-size tensor with
    # numpy's stride 0 once killed the engine's output thread and every later request hung.
    out = client.completions.create(model=MODEL, prompt=[504], max_tokens=2, temperature=0,
                                    extra_body={"prompt_logprobs": 1})
    assert out.choices[0].prompt_logprobs == [None] and out.usage.completion_tokens == 2
    echo = client.completions.create(model=MODEL, prompt=[504], max_tokens=2, temperature=0, echo=True, logprobs=1)
    assert echo.choices[0].logprobs.token_logprobs[0] is None and len(echo.choices[0].logprobs.tokens) == 3
    out = client.completions.create(model=MODEL, prompt=COMPLETION_PROMPTS[0], max_tokens=3, temperature=0)
    assert out.choices[0].text.startswith(" Paris")


def test_seeded_sampling_is_reproducible_and_n_gives_choices(client):
    kwargs = dict(model=MODEL, prompt=COMPLETION_PROMPTS[2], max_tokens=16, temperature=0.9, top_p=0.95,
                  extra_body={"top_k": 40})
    a = client.completions.create(seed=1234, **kwargs).choices[0].text
    b = client.completions.create(seed=1234, **kwargs).choices[0].text
    assert a == b
    many = client.completions.create(n=3, seed=7, **kwargs)
    assert len(many.choices) == 3 and len({c.text for c in many.choices}) > 1


def test_stop_strings_and_max_tokens(client):
    out = client.completions.create(model=MODEL, prompt="Count: one, two, three,", max_tokens=40, temperature=0,
                                    stop=[" five"])
    assert out.choices[0].finish_reason == "stop" and " five" not in out.choices[0].text
    out = client.completions.create(model=MODEL, prompt="Hello", max_tokens=5, temperature=0)
    assert out.usage.completion_tokens == 5 and out.choices[0].finish_reason == "length"


def test_penalties_and_min_p_are_accepted(client):
    out = client.completions.create(model=MODEL, prompt=COMPLETION_PROMPTS[1], max_tokens=12, temperature=0,
                                    frequency_penalty=1.0, presence_penalty=0.5,
                                    extra_body={"repetition_penalty": 1.3, "min_p": 0.05})
    assert out.usage.completion_tokens == 12


def test_json_schema_output(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "is_capital": {"type": "boolean"}},
              "required": ["city", "is_capital"], "additionalProperties": False}
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name the capital of France, as JSON."}],
        max_tokens=60, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}})
    data = json.loads(out.choices[0].message.content)
    assert set(data) == {"city", "is_capital"} and isinstance(data["is_capital"], bool)


def test_regex_and_choice_output(client):
    out = client.completions.create(model=MODEL, prompt="The year the first moon landing happened:", max_tokens=10,
                                    temperature=0, extra_body={"structured_outputs": {"regex": r"19[0-9]{2}"}})
    assert re.fullmatch(r"19[0-9]{2}", out.choices[0].text)
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Is water wet?"}],
                                         max_tokens=5, temperature=0,
                                         extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert out.choices[0].message.content in ("yes", "no")


def test_prefix_cache_hits_give_correct_output(client, hf):
    model, tok = hf
    prefix = "You are a careful assistant. " * 12
    first = client.completions.create(model=MODEL, prompt=prefix + "Name a fruit:", max_tokens=10, temperature=0)
    second = client.completions.create(model=MODEL, prompt=prefix + "Name a colour:", max_tokens=10, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens >= 64
    for out, prompt in ((first, prefix + "Name a fruit:"), (second, prefix + "Name a colour:")):
        ids = tok(prompt)["input_ids"]
        assert out.choices[0].text == tok.decode(hf_greedy(model, ids, 10, stop_at_eos=False))


def test_bad_requests_get_400_and_the_server_keeps_serving(client, server):
    with pytest.raises(openai.BadRequestError, match="maximum context length|max_model_len|too long"):
        client.completions.create(model=MODEL, prompt="hello " * 600, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        client.completions.create(model=MODEL, prompt="hello", max_tokens=4, logit_bias={"42": 5})
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="hello", max_tokens=4, temperature=-1)
    assert requests.get(server.base_url + "/health", timeout=10).status_code == 200
    out = client.completions.create(model=MODEL, prompt=COMPLETION_PROMPTS[0], max_tokens=3, temperature=0)
    assert out.choices[0].text.startswith(" Paris")


def test_metrics_endpoint(server):
    text = requests.get(server.base_url + "/metrics", timeout=10).text
    assert "vllm:num_requests_running" in text and "vllm:generation_tokens_total" in text


def test_no_program_was_compiled_after_warmup(server, client):
    client.completions.create(model=MODEL, prompt="warm", max_tokens=2)
    assert "Compiling step buckets: 100%" in server.log()
    assert "compiled after warm-up" not in server.log() and "after warm-up" not in server.log()
