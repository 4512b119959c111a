"""The engine on the demo model (SmolLM2-135M, Llama) against plain transformers on CPU."""

import numpy as np
import pytest
import torch
from conftest import PROMPTS, chat_prompt_ids, hf_greedy, hf_last_logits
from transformers import AutoModelForCausalLM, AutoTokenizer

from tpu_plugins.engine import Engine, EngineConfig, RaggedBatch
from tpu_plugins.offline import GenerationParams, OfflineGenerator
from tpu_plugins.sampling import SamplingParams

LOGIT_ATOL = 2e-3   # fp32, our XLA CPU kernels against torch's


@pytest.fixture(scope="module")
def hf_model(demo_model_path):
    return AutoModelForCausalLM.from_pretrained(demo_model_path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer(demo_model_path):
    return AutoTokenizer.from_pretrained(demo_model_path)


@pytest.fixture(scope="module")
def engine(demo_model_path):
    # A small token budget forces chunked prefill and mixed prefill/decode steps.
    eng = Engine(EngineConfig(model=demo_model_path, dtype="float32", max_model_len=512, max_num_seqs=8,
                              max_num_batched_tokens=64, progress=False, prompt_logprobs=True))
    eng.warmup()
    return eng


def test_prefill_logits_match_transformers(engine, hf_model, tokenizer):
    ids = chat_prompt_ids(tokenizer, PROMPTS[3])
    T = len(ids)
    pages = list(range(1, 1 + -(-T // 16)))
    slots = np.array([pages[p // 16] * 16 + p % 16 for p in range(T)])
    batch = RaggedBatch(np.array(ids), np.arange(T), slots, np.array([T]), np.array([T]), [pages])
    _, token_logits = engine.execute_with_token_logits(batch)
    ref = hf_last_logits(hf_model, ids)
    assert np.abs(token_logits - ref).max() < LOGIT_ATOL


def test_greedy_32_tokens_identical_to_transformers(engine, hf_model, tokenizer):
    prompts = [chat_prompt_ids(tokenizer, p) for p in PROMPTS]
    outs = OfflineGenerator(engine).generate(prompts, GenerationParams(max_tokens=32, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(hf_model, prompt, 32, stop_at_eos=False)
        assert len(out.token_ids) == 32 and out.finish_reason == "length"
    assert engine.counters.recompiles == 0


def test_stops_at_eos_like_transformers(engine, hf_model, tokenizer):
    prompt = chat_prompt_ids(tokenizer, PROMPTS[0])
    out = OfflineGenerator(engine).generate([prompt], GenerationParams(max_tokens=64))[0]
    ref = hf_greedy(hf_model, prompt, 64)
    assert out.finish_reason == "stop"
    assert out.token_ids == ref[: len(out.token_ids)] and out.token_ids[-1] in engine.model_config.eos_token_ids
    assert "Paris" in tokenizer.decode(out.token_ids)


def test_logprobs_match_transformers(engine, hf_model, tokenizer):
    prompt = chat_prompt_ids(tokenizer, PROMPTS[2])
    params = GenerationParams(SamplingParams(temperature=0, logprobs=5), max_tokens=4, ignore_eos=True,
                              prompt_logprobs=3)
    out = OfflineGenerator(engine).generate([prompt], params)[0]
    full = prompt + out.token_ids
    ref = torch.log_softmax(torch.tensor(hf_last_logits(hf_model, full)), dim=-1).numpy()
    for i, token in enumerate(out.token_ids):
        row = ref[len(prompt) - 1 + i]
        assert abs(out.logprobs[i] - row[token]) < 1e-3
        best = np.argsort(-row)[:5]
        assert list(out.top_logprobs[i]) == best.tolist()
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for p in range(1, len(prompt)):
        assert abs(out.prompt_logprobs[p] - ref[p - 1][prompt[p]]) < 1e-3
        assert list(out.prompt_top_logprobs[p]) == np.argsort(-ref[p - 1])[:3].tolist()


def test_batching_does_not_change_results(engine, tokenizer):
    prompts = [chat_prompt_ids(tokenizer, p) for p in PROMPTS]
    gen = OfflineGenerator(engine)
    together = gen.generate(prompts, GenerationParams(max_tokens=12, ignore_eos=True))
    alone = [gen.generate([p], GenerationParams(max_tokens=12, ignore_eos=True))[0] for p in prompts]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]


def test_preemption_recomputes_and_keeps_results(demo_model_path, tokenizer, engine):
    # 12 pages of 16 tokens cannot hold four ~40-token prompts growing by 48 tokens each.
    small = Engine(EngineConfig(model=demo_model_path, dtype="float32", max_model_len=512, max_num_seqs=8,
                                max_num_batched_tokens=64, num_pages=12, progress=False))
    prompts = [chat_prompt_ids(tokenizer, p) for p in PROMPTS]
    params = GenerationParams(max_tokens=48, ignore_eos=True)
    gen = OfflineGenerator(small)
    outs = gen.generate(prompts, params)
    assert gen.preemptions > 0
    assert gen.pages.num_free == small.kv_spec.num_pages - 1
    reference = OfflineGenerator(engine).generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in reference]
