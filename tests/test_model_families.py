"""Every supported family, from small random-weight configs, against plain transformers (fp32)."""

import numpy as np
import pytest
import torch
from conftest import hf_greedy, hf_last_logits, save_random_model

from tpu_plugins.engine import Engine, EngineConfig
from tpu_plugins.errors import UserError
from tpu_plugins.models.config import FAMILIES, ModelConfig
from tpu_plugins.offline import GenerationParams, OfflineGenerator

COMMON = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
CONFIGS = {
    "llama3-rope-scaling": dict(model_type="llama", rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "llama-tied-gqa1-headdim": dict(model_type="llama", tie_word_embeddings=True, num_key_value_heads=1, head_dim=32),
    "mistral-sliding-window": dict(model_type="mistral", sliding_window=8),
    "qwen2-qkv-bias": dict(model_type="qwen2"),
    "qwen3-qk-norm": dict(model_type="qwen3", head_dim=24),
}


def build(tmp_path_factory, name):
    spec = dict(COMMON, **CONFIGS[name])
    folder = tmp_path_factory.mktemp(name)
    model = save_random_model(folder, spec.pop("model_type"), **spec)
    if name == "mistral-sliding-window":
        model.config._attn_implementation = "eager"   # the reference applies the window in eager attention
    return folder, model


@pytest.mark.parametrize("name", CONFIGS)
def test_family_matches_transformers(name, tmp_path_factory):
    folder, model = build(tmp_path_factory, name)
    engine = Engine(EngineConfig(model=folder, dtype="float32", max_model_len=128, max_num_seqs=4,
                                 max_num_batched_tokens=32, page_size=8, progress=False))
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, 512, size=n).tolist() for n in (21, 5, 40)]
    outs = OfflineGenerator(engine).generate(prompts, GenerationParams(max_tokens=32, ignore_eos=True,
                                                                         prompt_logprobs=0))
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(model, prompt, 32, stop_at_eos=False)
        ref = torch.log_softmax(torch.tensor(hf_last_logits(model, prompt)), -1).numpy()
        ours = np.array(out.prompt_logprobs[1:])
        want = ref[np.arange(len(prompt) - 1), prompt[1:]]
        assert np.abs(ours - want).max() < 2e-3


def test_unsupported_architecture_lists_the_supported_ones():
    with pytest.raises(UserError) as err:
        ModelConfig.from_hf({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    assert "GPT2LMHeadModel" in str(err.value)
    for arch in FAMILIES:
        assert arch in str(err.value)
