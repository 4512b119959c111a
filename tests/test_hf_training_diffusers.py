"""Accelerate and diffusers on "tpu" (hf_tpu) against the CPU. One probe process for the module."""

import pytest

from conftest import run_probe


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    return run_probe("hf_training_diffusers", str(tmp_path_factory.mktemp("hf_diffusers")), TPU_PLUGINS_DEVICE="tpu")


def test_accelerate_training_loss_curve_matches_cpu(probe):
    cpu, tpu = probe["training"]["cpu"], probe["training"]["tpu"]
    assert cpu["device"] == "cpu" and tpu["device"] == "tpu" and tpu["param_device"] == "tpu:0"
    assert len(tpu["losses"]) == len(cpu["losses"]) == 8
    assert cpu["losses"][-1] < cpu["losses"][0]          # the loop does learn
    for step, (a, b) in enumerate(zip(cpu["losses"], tpu["losses"])):
        assert abs(a - b) < 2e-3, (step, cpu["losses"], tpu["losses"])


def test_diffusers_pipeline_matches_cpu(probe):
    d = probe["diffusers"]
    assert d["moved_device"] == "tpu:0" and d["mapped_device"] == "tpu:0"
    assert d["shape"] == [1, 16, 16, 3]
    assert d["moved_max_diff"] < 1e-4 and d["mapped_max_diff"] < 1e-4
