"""Small random-weight models shared by the MoE and int8 tests of the core and the three
adapters, and the transformers references they are checked against."""

from __future__ import annotations

import copy

import numpy as np

COMMON = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
MODELS = {
    "llama": dict(model_type="llama"),
    # layer 1 of 3 is a dense MLP (mlp_only_layers); top-k weights not renormalised (transformers' default)
    "qwen3_moe": dict(model_type="qwen3_moe", num_hidden_layers=3, moe_intermediate_size=32, num_experts=8,
                      num_experts_per_tok=2, head_dim=16, norm_topk_prob=False, mlp_only_layers=[1]),
    "mixtral": dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2),
}


def save(folder, name: str):
    """Save model `name` (a MODELS key) to `folder`; returns the fp32 transformers model."""
    from conftest import save_random_model

    spec = dict(COMMON, **MODELS[name])
    return save_random_model(folder, spec.pop("model_type"), **spec)


def engine_config(folder, **overrides):
    from tpu_plugins.engine import EngineConfig

    return EngineConfig(**{**dict(model=folder, dtype="float32", max_model_len=128, max_num_seqs=4,
                                  max_num_batched_tokens=32, page_size=8, progress=False), **overrides})


def token_prompts(vocab: int = 512) -> list[list[int]]:
    rng = np.random.default_rng(1)
    return [rng.integers(3, vocab, size=n).tolist() for n in (21, 5, 40)]


def int8_rounded(model, experts: bool = True):
    """A copy of a transformers model whose linear weights (not embeddings, LM head or MoE
    router) are rounded as --quantization int8 rounds them: per output channel, 127 steps.
    `experts=False` leaves the MoE experts as they are (the HF path's Int8Config)."""
    import torch

    from tpu_plugins import quantization

    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in rounded.named_parameters():
            skip = ("embed_tokens", "lm_head", "mlp.gate.weight") + (() if experts else (".experts.",))
            if p.dim() >= 2 and not any(s in name for s in skip):
                w = np.swapaxes(p.numpy(), -1, -2)                      # [.., in, out]
                p.copy_(torch.tensor(np.swapaxes(quantization.dequantize(quantization.quantize(w)), -1, -2)))
    return rounded


def assert_engine_matches_transformers(engine, reference, max_tokens: int) -> None:
    """The engine's greedy tokens and prompt log-probabilities on token_prompts() equal the
    transformers model's (fp32: tokens identical, log-probabilities within 2e-3)."""
    import torch
    from conftest import hf_greedy, hf_last_logits

    from tpu_plugins.offline import GenerationParams, OfflineGenerator

    prompts = token_prompts()
    outs = OfflineGenerator(engine).generate(prompts, GenerationParams(max_tokens=max_tokens, ignore_eos=True,
                                                                       prompt_logprobs=0))
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(reference, prompt, max_tokens, stop_at_eos=False)
        ref = torch.log_softmax(torch.tensor(hf_last_logits(reference, prompt)), -1).numpy()
        want = ref[np.arange(len(prompt) - 1), prompt[1:]]
        assert np.abs(np.array(out.prompt_logprobs[1:]) - want).max() < 2e-3
