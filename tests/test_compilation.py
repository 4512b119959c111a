"""Buckets, warm-up, the recompile counter and the persistent compilation cache."""

import math

import numpy as np
import pytest
from conftest import save_random_model

from tpu_plugins.engine import Engine, EngineConfig, token_buckets
from tpu_plugins.offline import GenerationParams, OfflineGenerator
from tpu_plugins.sampling import SamplingParams


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    save_random_model(folder, "llama", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    return folder


def test_token_buckets():
    assert token_buckets(512) == [16, 32, 64, 128, 256, 512]
    assert token_buckets(100) == [16, 32, 64, 100]
    assert token_buckets(8) == [8]


def test_warmup_is_bounded_and_serving_never_recompiles(tiny_model, tmp_path):
    engine = Engine(EngineConfig(model=tiny_model, dtype="float32", max_model_len=1024, max_num_seqs=64,
                                 max_num_batched_tokens=512, page_size=16, progress=False,
                                 compile_cache_dir=tmp_path / "cache"))
    engine.warmup()
    assert engine.counters.warmup_compiles <= 2 * math.log2(512) + 4
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 256, size=n).tolist() for n in rng.integers(1, 400, size=40)]
    params = [GenerationParams(SamplingParams(temperature=t, top_p=0.9, seed=i), max_tokens=int(m), ignore_eos=True)
              for i, (t, m) in enumerate(zip(rng.choice([0.0, 0.8], 40), rng.integers(1, 24, 40)))]
    OfflineGenerator(engine).generate(prompts, params)
    assert engine.counters.recompiles == 0


def test_every_sampling_feature_runs_on_the_warmed_up_programs(tiny_model, tmp_path):
    engine = Engine(EngineConfig(model=tiny_model, dtype="float32", max_model_len=256, max_num_seqs=4,
                                 max_num_batched_tokens=32, progress=False, compile_cache_dir=tmp_path / "cache"))
    engine.warmup()
    features = [SamplingParams(temperature=0, repetition_penalty=1.2), SamplingParams(temperature=0.7, top_k=5, seed=1),
                SamplingParams(temperature=1.0, top_p=0.5, min_p=0.1, presence_penalty=0.3, logprobs=5),
                SamplingParams(temperature=0, frequency_penalty=0.5, logprobs=0)]
    OfflineGenerator(engine).generate([[1, 2, 3]] * 4, [GenerationParams(p, max_tokens=3, ignore_eos=True)
                                                          for p in features])
    assert engine.counters.recompiles == 0


def test_a_new_program_after_warmup_is_counted(tiny_model, tmp_path):
    engine = Engine(EngineConfig(model=tiny_model, dtype="float32", max_model_len=256, max_num_seqs=4,
                                 max_num_batched_tokens=32, progress=False, compile_cache_dir=tmp_path / "cache"))
    engine.warmup()
    # The all-token-logits step (prompt log-probabilities) is warmed up only when configured.
    OfflineGenerator(engine).generate([[1, 2, 3]], GenerationParams(max_tokens=2, prompt_logprobs=1))
    assert engine.counters.recompiles >= 1


WARM_START = """
import json, sys, time
from tpu_plugins import compile_stats
from tpu_plugins.engine import Engine, EngineConfig
engine = Engine(EngineConfig(model=sys.argv[1], dtype="float32", max_model_len=256, max_num_seqs=8,
                             max_num_batched_tokens=128, progress=False, compile_cache_dir=sys.argv[2]))
before = compile_stats.snapshot()
start = time.perf_counter()
engine.warmup()
after = compile_stats.snapshot()
print(json.dumps({"seconds": time.perf_counter() - start,
                  "backend_compiles": after["backend_compiles"] - before["backend_compiles"],
                  "programs": after["programs_built"] - before["programs_built"]}))
"""


def test_second_start_loads_every_program_from_the_disk_cache(tiny_model, tmp_path):
    import subprocess
    import sys
    import json
    from conftest import REPO, clean_env

    def start():
        proc = subprocess.run([sys.executable, "-c", WARM_START, str(tiny_model), str(tmp_path / "cache")],
                              capture_output=True, text=True, timeout=600, env=clean_env(), cwd=REPO)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    first, second = start(), start()
    assert first["backend_compiles"] >= len(token_buckets(128))
    assert second["backend_compiles"] == 0 and second["programs"] == first["programs"]
