"""Tensor parallelism on a simulated 4-chip slice: same greedy tokens at TP=1, 2 and 4."""

import pytest
from conftest import PROMPTS, run_json

from tpu_plugins.models.config import ModelConfig
from tpu_plugins.sharding import head_layout

TP_RUN = """
import json, sys
sys.path.insert(0, "tests")
from conftest import PROMPTS, chat_prompt_ids
from transformers import AutoTokenizer
from tpu_plugins import demo_model
from tpu_plugins.engine import Engine, EngineConfig
from tpu_plugins.offline import GenerationParams, OfflineGenerator
path = demo_model.prepare()
tok = AutoTokenizer.from_pretrained(path)
prompts = [chat_prompt_ids(tok, p) for p in PROMPTS[:3]]
result = {}
for tp in (1, 2, 4):
    engine = Engine(EngineConfig(model=path, dtype="float32", max_model_len=256, max_num_seqs=4,
                                 max_num_batched_tokens=32, tensor_parallel_size=tp, progress=False))
    shard = engine.kv_caches[0].addressable_shards[0].data.shape
    outs = OfflineGenerator(engine).generate(prompts, GenerationParams(max_tokens=24, ignore_eos=True))
    result[tp] = {"tokens": [o.token_ids for o in outs], "kv_shard": list(shard),
                  "heads": engine.layout.num_heads, "kv_heads": engine.layout.num_kv_heads}
print(json.dumps(result))
"""


def test_greedy_tokens_identical_at_tp_1_2_4():
    result = run_json(TP_RUN, TPU_PLUGINS_SIM_DEVICES="4")
    assert result["2"]["tokens"] == result["1"]["tokens"]
    assert result["4"]["tokens"] == result["1"]["tokens"]
    # SmolLM2: 9 query heads in 3 GQA groups. TP=2 and TP=4 pad to 4 groups (12 query heads),
    # and each chip's cache slice holds its own groups' K and V.
    assert (result["1"]["heads"], result["1"]["kv_heads"]) == (9, 3)
    assert (result["2"]["heads"], result["2"]["kv_heads"]) == (12, 4)
    assert (result["4"]["heads"], result["4"]["kv_heads"]) == (12, 4)
    assert result["4"]["kv_shard"][2] == 2 and result["2"]["kv_shard"][2] == 4   # 2 * kv heads per chip


REPLICATED_KV_RUN = """
import json, sys, tempfile, numpy as np
sys.path.insert(0, "tests")
from conftest import save_random_model
from tpu_plugins.engine import Engine, EngineConfig
from tpu_plugins.offline import GenerationParams, OfflineGenerator
# Qwen2 (q/k/v biases), 6 query heads over 2 KV heads: at TP=4 each KV head is stored twice and
# each group's 3 query heads are padded to 4, 2 per chip.
folder = tempfile.mkdtemp()
save_random_model(folder, "qwen2", vocab_size=256, hidden_size=96, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128)
prompts = [np.random.default_rng(i).integers(0, 256, size=n).tolist() for i, n in enumerate((9, 17))]
result = {}
for tp in (1, 4):
    engine = Engine(EngineConfig(model=folder, dtype="float32", max_model_len=64, max_num_seqs=2,
                                 max_num_batched_tokens=32, page_size=8, tensor_parallel_size=tp, progress=False))
    outs = OfflineGenerator(engine).generate(prompts, GenerationParams(max_tokens=16, ignore_eos=True))
    result[tp] = {"tokens": [o.token_ids for o in outs], "replicas": engine.layout.kv_replicas,
                  "heads": engine.layout.num_heads}
print(json.dumps(result))
"""


def test_replicated_kv_heads_give_the_same_tokens():
    result = run_json(REPLICATED_KV_RUN, TPU_PLUGINS_SIM_DEVICES="4")
    assert (result["4"]["replicas"], result["4"]["heads"]) == (2, 8)
    assert result["4"]["tokens"] == result["1"]["tokens"]


def _cfg(heads, kv_heads):
    return ModelConfig.from_hf({"architectures": ["LlamaForCausalLM"], "vocab_size": 1000, "hidden_size": 64 * heads,
                                "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": heads,
                                "num_key_value_heads": kv_heads})


@pytest.mark.parametrize("heads,kv_heads,tp,expected", [
    (32, 8, 4, (32, 8, 1)),     # divides: split as is
    (32, 8, 16, (32, 16, 2)),   # more chips than KV heads: replicate each KV head twice
    (9, 3, 2, (12, 4, 1)),      # SmolLM2 at TP=2: pad to whole groups
    (9, 3, 4, (12, 4, 1)),
    (28, 4, 8, (32, 8, 2)),     # replicate KV heads twice; 7 query heads per group padded to 8
    (4, 2, 8, (8, 8, 4)),       # tiny: 2 heads per group padded to 4 over 4 copies
])
def test_head_layout_rules(heads, kv_heads, tp, expected):
    layout = head_layout(_cfg(heads, kv_heads), tp)
    assert (layout.num_heads, layout.num_kv_heads, layout.kv_replicas) == expected
    assert layout.num_heads % tp == 0 and layout.num_kv_heads % tp == 0
    assert layout.vocab_size % tp == 0 and layout.vocab_size >= 1000
