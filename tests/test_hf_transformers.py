"""transformers on "tpu" (hf_tpu): from_pretrained placements, generate() on the core engine
and op by op, static cache, other architectures, bad input; against plain transformers on CPU.
One probe process for the module."""

import pytest

from conftest import run_probe, run_python


@pytest.fixture(scope="module")
def probe(demo_model_path, tmp_path_factory):
    scratch = tmp_path_factory.mktemp("hf_models")
    return run_probe("hf_transformers", str(demo_model_path), str(scratch), TPU_PLUGINS_DEVICE="tpu")


def test_device_map_tpu_generates_cpu_tokens(probe):
    s = probe["smollm2"]
    assert s["model_device"] == "tpu" and s["param_devices"] == ["tpu:0"]
    assert s["fast"] == s["reference"]          # 3 chat prompts, left-padded batch, 24 greedy tokens
    assert s["fast_dtype"] == "torch.int64" and s["fast_device"] == "tpu:0"
    assert s["text"][0].startswith("The capital of France is Paris")


def test_fast_path_compiles_nothing_per_token(probe):
    assert probe["repeat_equal"] and probe["programs_built_on_repeat"] == 0


def test_op_by_op_generate_matches_cpu(probe):
    s = probe["smollm2"]
    assert s["op_by_op"] == s["reference_one"]


def test_static_cache_generate(probe):
    s = probe["smollm2"]
    assert s["static_fast"] == s["reference_one"]
    n = len(s["static_op_by_op"][0])
    assert s["static_op_by_op"][0] == s["reference_one"][0][:n]


def test_sampling_follows_torch_seed(probe):
    first, again, other = probe["sampling"]
    assert first == again and first != other


@pytest.mark.parametrize("placement", ["dict", "auto", "module_to"])
def test_placements(probe, placement):
    p = probe["placements"][placement]
    assert p["device"] == "tpu:0" and p["logits_max_diff"] < 2e-3


@pytest.mark.parametrize("family", ["qwen3", "mistral"])
def test_random_families_match_cpu(probe, family):
    f = probe["families"][family]
    assert f["engine_built"]
    assert f["fast"] == f["reference"]
    n = len(f["op_by_op"][0])
    assert f["op_by_op"][0] == f["reference"][0][:n]


def test_bad_device_and_dtype_fail_before_loading(probe):
    assert probe["errors"]["missing_device"].startswith("ValueError: device_map names tpu:7, but this host has 1 tpu")
    assert "float64 is not supported on tpu" in probe["errors"]["float64"]


def test_model_too_big_for_device(demo_model_path):
    # 64 simulated devices: each gets 1/64 of host memory, less than the fp32 demo model.
    code = ("import torch; from transformers import AutoModelForCausalLM\n"
            "try:\n"
            f"    AutoModelForCausalLM.from_pretrained({str(demo_model_path)!r}, device_map='tpu')\n"
            "    print('loaded')\n"
            "except ValueError as e:\n"
            "    print('ERROR', e)\n")
    proc = run_python(code, TPU_PLUGINS_DEVICE="tpu", TPU_PLUGINS_SIM_DEVICES="64")
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("ERROR The model needs ") and "GiB on tpu:0, which has" in line, line
    assert "Loading weights" not in proc.stderr
