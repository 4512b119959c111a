"""`tpu-plugins aot`: the engine's real programs compiled for TPU slices by libtpu on this CPU host.

References are computed here from the config files alone (parameter counts, cache sizes,
published chip figures), never from the engine's own accounting."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import clean_env

from tpu_plugins import jax_env  # noqa: F401
import jax.numpy as jnp

from tpu_plugins import aot, chips
from tpu_plugins.errors import UserError
from tpu_plugins.kernels.kv_cache_update import kv_cache_update
from tpu_plugins.kernels.ragged_attention import write_kv

CLI = [str(Path(sys.executable).with_name("tpu-plugins"))]
# Published parameter counts (billions) of the shipped configs.
PUBLISHED_PARAMS = {"Llama-3.1-8B": 8.03, "Llama-3.1-70B": 70.55, "Qwen3-8B": 8.19, "Qwen3-32B": 32.76, "Mistral-7B": 7.25,
                    "Qwen3-30B-A3B": 30.53, "Mixtral-8x7B": 46.70}


def run_aot(*args):
    return subprocess.run(CLI + ["aot", *args], capture_output=True, text=True, timeout=600, env=clean_env())


def param_count(hf: dict) -> int:
    h, i, v, L = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"], hf["num_hidden_layers"]
    d = hf.get("head_dim", h // hf["num_attention_heads"])
    attn = h * d * (2 * hf["num_attention_heads"] + 2 * hf["num_key_value_heads"])
    norms = 2 * h + (2 * d if hf["model_type"] in ("qwen3", "qwen3_moe") else 0)
    experts = hf.get("num_experts") or hf.get("num_local_experts")
    mlp = experts * (3 * h * hf.get("moe_intermediate_size", i) + h) if experts else 3 * h * i   # + router
    return v * h * (1 if hf["tie_word_embeddings"] else 2) + L * (attn + mlp + norms) + h


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_shipped_configs_are_the_published_models(name):
    hf = json.loads((aot.REFERENCE_CONFIGS / f"{name}.json").read_text())
    assert param_count(hf) / 1e9 == pytest.approx(PUBLISHED_PARAMS[name], rel=2e-3)


@pytest.fixture(scope="module")
def llama8b_v6e():
    proc = run_aot("--model", "Llama-3.1-8B", "--topology", "v6e:2x2", "--tp", "4", "--max-model-len", "2048",
                   "--max-num-seqs", "16", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_llama_8b_on_v6e_2x2_fits_with_independently_computed_memory(llama8b_v6e):
    r = llama8b_v6e
    for key in ("fits", "hbm_bytes_per_chip", "hbm_capacity_per_chip", "kv_cache_tokens", "est_decode_step_s",
                "roofline_decode_step_s", "est_decode_tokens_per_s"):
        assert key in r
    hf = json.loads((aot.REFERENCE_CONFIGS / "Llama-3.1-8B.json").read_text())
    v6e = chips.CHIPS["v6e"]
    assert r["hbm_capacity_per_chip"] == v6e.hbm_bytes and r["fits"] is True
    weights = param_count(hf) * 2
    # Norms are replicated on every chip; everything else is split four ways.
    assert r["hbm_breakdown_per_chip"]["weights"] == pytest.approx(weights / 4, rel=2e-3)
    kv_heads_per_chip = hf["num_key_value_heads"] // 4
    pages = 16 * (2048 // 16) + 1
    kv = hf["num_hidden_layers"] * pages * 16 * 2 * kv_heads_per_chip * 128 * 2
    assert r["hbm_breakdown_per_chip"]["kv_cache"] == kv
    assert weights / 4 + kv < r["hbm_bytes_per_chip"] < weights / 4 + kv + 1.5 * 2**30
    # What is left after weights and the rest, in pages of 16 tokens, covers what 16 x 2048 needs many times.
    assert 32768 < r["kv_cache_tokens"] < (0.9 * v6e.hbm_bytes - weights / 4) / (kv / pages) * 16


def test_llama_8b_decode_estimate_is_within_the_target_of_the_roofline(llama8b_v6e):
    r = llama8b_v6e
    hf = json.loads((aot.REFERENCE_CONFIGS / "Llama-3.1-8B.json").read_text())
    v6e = chips.CHIPS["v6e"]
    embed = hf["vocab_size"] * hf["hidden_size"] * 2
    kv_read = hf["num_hidden_layers"] * 16 * 2048 * 2 * 2 * 128 * 2
    roofline_bytes = (param_count(hf) * 2 - embed) / 4 + kv_read
    assert r["roofline_decode_step_s"] == pytest.approx(roofline_bytes / v6e.hbm_bytes_per_s, rel=0.02)
    assert r["roofline_decode_step_s"] <= r["est_decode_step_s"] <= 1.25 * r["roofline_decode_step_s"]
    assert r["est_decode_tokens_per_s"] == pytest.approx(16 / r["est_decode_step_s"])
    assert r["decode_accounting_per_chip"]["pallas_calls"] == 2 * hf["num_hidden_layers"]


def test_llama_70b_on_a_four_host_v6e_slice(tmp_path):
    """v6e:4x4 is 16 chips on 4 hosts: the report counts the hosts, per-chip HBM and what each
    host loads, all recomputed here from the config."""
    proc = run_aot("--model", "Llama-3.1-70B", "--topology", "v6e:4x4", "--max-model-len", "4096",
                   "--max-num-seqs", "32", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout)
    hf = json.loads((aot.REFERENCE_CONFIGS / "Llama-3.1-70B.json").read_text())
    assert (r["chips"], r["hosts"], r["tensor_parallel_size"], r["fits"]) == (16, 4, 16, True)
    # 8 KV heads over 16 chips: each KV head is stored twice (k and v projections, and the cache).
    h, d, layers = hf["hidden_size"], 128, hf["num_hidden_layers"]
    weights = param_count(hf) * 2 + layers * 2 * h * d * 8 * 2
    assert r["hbm_breakdown_per_chip"]["weights"] == pytest.approx(weights / 16, rel=2e-3)
    pages = 32 * (4096 // 16) + 1
    kv = hf["num_hidden_layers"] * pages * 16 * 2 * 1 * 128 * 2
    assert r["hbm_breakdown_per_chip"]["kv_cache"] == kv
    assert r["hbm_bytes_per_chip"] < 0.9 * chips.CHIPS["v6e"].hbm_bytes
    # Each host loads its four chips' shards: a quarter of the model (norms, replicated, are tiny).
    assert r["weight_bytes_per_host"] == pytest.approx(weights / 4, rel=2e-3)


def test_a_model_too_big_for_the_slice_does_not_fit(tmp_path):
    # One layer, but 2 x 8.4 GB of embedding and head in bf16: more than a 16 GiB v5e chip.
    config = json.loads((aot.REFERENCE_CONFIGS / "Llama-3.1-8B.json").read_text())
    config.update(hidden_size=8192, num_hidden_layers=1, vocab_size=512000, num_attention_heads=64)
    (tmp_path / "config.json").write_text(json.dumps(config))
    report = aot.analyze(aot.AotRequest(model=str(tmp_path), topology="v5e:1x1", max_model_len=1024, max_num_seqs=4))
    assert report["fits"] is False and report["kv_cache_tokens"] == 0
    assert report["hbm_bytes_per_chip"] > chips.CHIPS["v5e"].hbm_bytes


@pytest.mark.parametrize("topology", ["v5e:1x1", "v6e:1x1", "tpu7x:1x1x1"])
def test_every_pallas_kernel_the_engine_uses_compiles_for_the_chip(tmp_path, topology):
    """Mosaic compiles the engine's attention and cache-update kernels for v5e, v6e and v7."""
    config = json.loads((aot.REFERENCE_CONFIGS / "Qwen3-8B.json").read_text())
    config.update(num_hidden_layers=2, vocab_size=4096, intermediate_size=1024)
    (tmp_path / "config.json").write_text(json.dumps(config))
    report = aot.analyze(aot.AotRequest(model=str(tmp_path), topology=topology, max_model_len=1024, max_num_seqs=8,
                                        max_num_batched_tokens=256))
    assert report["decode_accounting_per_chip"]["pallas_calls"] == 2 * 2   # two kernels per layer
    assert set(report["programs"]) == {"decode", "prefill"}
    assert report["fits"] is True


def test_int8_llama_8b_on_v6e_halves_the_linear_weights_per_chip(llama8b_v6e):
    """--dtype int8: linear weights 1 byte plus a float32 scale per output channel; embedding,
    LM head and norms stay bf16. Computed from the config, not from the engine."""
    proc = run_aot("--model", "Llama-3.1-8B", "--topology", "v6e:2x2", "--tp", "4", "--max-model-len", "2048",
                   "--max-num-seqs", "16", "--dtype", "int8", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout)
    hf = json.loads((aot.REFERENCE_CONFIGS / "Llama-3.1-8B.json").read_text())
    h, L, v = hf["hidden_size"], hf["num_hidden_layers"], hf["vocab_size"]
    q, kv = hf["num_attention_heads"] * 128, hf["num_key_value_heads"] * 128
    outputs = q + 2 * kv + h + 2 * hf["intermediate_size"] + h          # output channels of the 7 linears
    linear = param_count(hf) - 2 * v * h - L * 2 * h - h
    int8_bytes = linear + 4 * L * outputs + 2 * (2 * v * h + L * 2 * h + h)
    # q/k/v/gate/up scales split with their columns, o/down scales are on every chip
    replicated_scales = 4 * L * 2 * h * 3 / 4
    assert r["hbm_breakdown_per_chip"]["weights"] == pytest.approx(int8_bytes / 4 + replicated_scales, rel=2e-3)
    bf16 = llama8b_v6e
    assert r["hbm_breakdown_per_chip"]["weights"] < 0.6 * bf16["hbm_breakdown_per_chip"]["weights"]
    assert r["kv_cache_tokens"] > bf16["kv_cache_tokens"]
    assert r["est_decode_step_s"] < bf16["est_decode_step_s"] and r["fits"] is True


@pytest.mark.parametrize("topology", ["v5e:1x1", "v6e:1x1"])
def test_megablox_experts_compile_for_the_chip(tmp_path, topology):
    """Mosaic compiles the engine's MoE step (megablox gmm: gate, up, down per layer) for the chip."""
    config = json.loads((aot.REFERENCE_CONFIGS / "Qwen3-30B-A3B.json").read_text())
    config.update(num_hidden_layers=2, vocab_size=4096, num_experts=16)
    (tmp_path / "config.json").write_text(json.dumps(config))
    report = aot.analyze(aot.AotRequest(model=str(tmp_path), topology=topology, max_model_len=1024, max_num_seqs=8,
                                        max_num_batched_tokens=256))
    assert report["decode_accounting_per_chip"]["pallas_calls"] == 2 * (2 + 3)   # attention kernels + 3 gmm
    assert set(report["programs"]) == {"decode", "prefill"} and report["fits"] is True
    touched = 1 - (1 - 1 / 16) ** (8 * 8)
    assert report["decode_accounting_per_chip"]["expert_share_read"] == pytest.approx(touched)


def test_bad_topology_names_the_valid_ones():
    proc = run_aot("--model", "Llama-3.1-8B", "--topology", "v7:2x2x1", "--max-model-len", "1024", "--max-num-seqs", "4")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "libtpu spells it 'tpu7x'" in proc.stderr and "v6e:{1x1,2x2" in proc.stderr
    proc = run_aot("--model", "Llama-3.1-8B", "--topology", "v6e:3x3", "--max-model-len", "1024", "--max-num-seqs", "4")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "Valid names look like" in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--model", "no-such-model"], "one of the shipped configs: Llama-3.1-70B, Llama-3.1-8B"),
    (["--model", "Llama-3.1-8B", "--dtype", "int4"], "--dtype 'int4' is not one of: bfloat16, float32, int8"),
    (["--model", "Qwen3-30B-A3B", "--ep", "3"], "--ep 3 must divide the tensor-parallel size 4"),
    (["--model", "Llama-3.1-8B", "--tp", "8"], "--tp 8 needs 8 devices; v6e:2x2 has 4"),
    (["--model", "Llama-3.1-8B", "--max-model-len", "999999"], "exceeds the model's max_position_embeddings"),
])
def test_bad_requests_get_one_line_errors(args, message):
    argv = ["--topology", "v6e:2x2", "--max-model-len", "1024", "--max-num-seqs", "4"] + args
    proc = run_aot(*argv)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert message in proc.stderr


def test_cache_update_kernel_in_interpret_mode_matches_the_scatter():
    from jax.experimental.pallas import tpu as pltpu

    rng = np.random.default_rng(3)
    for dtype in (jnp.float32, jnp.bfloat16):
        cache = jnp.asarray(rng.normal(size=(6, 4, 4, 128)), dtype)
        k, v = (jnp.asarray(rng.normal(size=(5, 2, 128)), dtype) for _ in range(2))
        slots = jnp.array([3, 17, -1, 23, 24], jnp.int32)    # -1 and 24 (past the cache) are skipped
        expected = np.asarray(write_kv(cache, k, v, slots), np.float32)
        with pltpu.force_tpu_interpret_mode():
            got = np.asarray(kv_cache_update(jnp.array(cache), k, v, slots), np.float32)
        np.testing.assert_array_equal(got, expected)
        untouched = np.asarray(cache, np.float32).reshape(24, 4, 128)[[0, 1, 2, 4, 22]]
        np.testing.assert_array_equal(got.reshape(24, 4, 128)[[0, 1, 2, 4, 22]], untouched)


def test_unknown_model_in_the_python_api_is_a_user_error():
    with pytest.raises(UserError, match="shipped configs"):
        aot.resolve_model("nope")
