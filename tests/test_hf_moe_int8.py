"""The Hugging Face path with mixture-of-experts models (Qwen3-MoE, Mixtral) and int8 weights
(`quantization_config=Int8Config()`, compressed-tensors checkpoints), against plain
transformers on the CPU (fp32)."""

import pytest
from conftest import run_probe


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    return run_probe("hf_moe_int8", str(tmp_path_factory.mktemp("hf_moe_int8")), TPU_PLUGINS_DEVICE="tpu")


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_moe_models_on_tpu_generate_cpu_tokens_on_the_engine(probe, name):
    r = probe[name]
    assert r["tokens_equal"]
    assert "experts reference" in r["engine"] and "+ int8" not in r["engine"]
    assert r["forward_max_error"] < 1e-4     # transformers' own MoE forward, op by op on the device


@pytest.mark.parametrize("name", ["llama", "mixtral"])
def test_int8_config_keeps_int8_weights_on_tpu_and_matches_rounded_transformers(probe, name):
    r = probe[f"{name}_int8"]
    assert r["q_proj"] == ["Int8Linear", "torch.int8", "tpu:0"]
    assert r["lm_head"] == "Linear"
    assert r["int8_linears"] == (2 * 7 if name == "llama" else 2 * 4)   # attention + MLP; Mixtral: attention only
    assert "+ int8" in r["engine"]                      # generate() ran on the engine with the int8 weights
    assert r["tokens_equal"]
    assert r["forward_max_error"] < 1e-4


def test_compressed_tensors_checkpoint_loads_onto_tpu_and_generates_on_the_engine_in_int8(probe):
    r = probe["llama_compressed_tensors"]
    assert "weight_packed:torch.int32:tpu:0" in r["q_proj_tensors"]
    assert "+ int8" in r["engine"]
    assert r["tokens_equal"]
    assert r["forward_max_error"] < 1e-4
