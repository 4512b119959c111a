"""The torch "tpu" device (hf_tpu): ops, dtypes, modules, autograd, threads and torch.compile
against torch on the CPU. One probe process per module (JAX settles its devices once)."""

import pytest

from conftest import run_probe

TOL = 1e-5


@pytest.fixture(scope="module")
def probe():
    return run_probe("hf_torch_device", TPU_PLUGINS_DEVICE="tpu")


def test_device_is_registered_as_tpu(probe):
    assert probe["privateuse1_name"] == "tpu"
    assert probe["is_available"] and probe["device_count"] == 1
    assert probe["to_device"] == {"device": "tpu:0", "dtype": "torch.float32", "roundtrip": 0.0}


def test_ops_match_cpu(probe):
    bad = {name: d for name, d in probe["ops"].items() if d > TOL}
    assert not bad, bad


def test_dtypes_follow_torch(probe):
    # int64 stays int64 to the user (its data is int32 on the device); bf16 round-trips exactly.
    assert probe["argmax_dtype"] == "torch.int64"
    assert probe["int64"] == {"dtype": "torch.int64", "values": list(range(0, 30, 3)), "cpu_dtype": "torch.int64"}
    assert probe["bfloat16"] == {"dtype": "torch.bfloat16", "roundtrip": 0.0}


def test_factories_setitem_inplace_item(probe):
    f = probe["factories"]
    assert f["zeros"] == [[0.0] * 3] * 2 and f["full"] == [7.0, 7.0] and f["tensor"] == [1, 2, 3]
    assert f["linspace"] == 0.0
    assert probe["setitem"] == 0.0 and probe["inplace"] == 0.0 and probe["item"]
    assert probe["out_variant"] == {"same_tensor": True, "diff": 0.0}


def test_random_numbers_follow_torch_seed(probe):
    assert probe["random_same_as_cpu"] == 0.0


def test_module_to_autograd_and_optimizer(probe):
    assert probe["module_to"] == {"same_parameter": True, "device": "tpu:0", "is_parameter": True}
    assert probe["autograd"]["loss"] < TOL and probe["autograd"]["grad"] < TOL
    assert probe["autograd"]["grad_device"] == "tpu:0"
    assert probe["optimizer_step"] < TOL


def test_worker_threads_pickle_deepcopy(probe):
    assert probe["threads"] == [[2.0 * i] * 3 for i in range(4)]
    assert probe["pickle"] == 0.0 and probe["deepcopy_device"] == "tpu:0"


def test_bad_device_and_dtype_errors(probe):
    assert probe["errors"]["missing_index"].startswith("RuntimeError: tpu:7 does not exist: this host has 1 tpu device")
    assert "float64 is not supported on the tpu device" in probe["errors"]["float64"]
    assert "tpu tensors cannot be resized" in probe["errors"]["out_resize"]


def test_failed_lowering_falls_back_to_host_even_in_backward(probe):
    assert probe["lowering_failure_in_backward"] < TOL


def test_torch_compile_backend_tpu(probe):
    c = probe["compile"]
    assert c["host_graph"] < TOL and c["host_device"] == "cpu"
    assert c["mutation_result"] == 0.0 and c["mutation_input"] == 0.0
    assert c["tpu_inputs"] < TOL and c["tpu_device"] == "tpu:0"


def test_trainer_and_accelerator_use_tpu_when_asked(probe):
    # (Without a TPU or an opt-in nothing changes: tests/test_entry_points.py, framework fingerprint.)
    assert probe["trainer_device"] == "tpu" and probe["accelerator_device"] == "tpu"
