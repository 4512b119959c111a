import pytest

from tpu_plugins import activation


@pytest.mark.parametrize("argv,expected", [
    (["vllm", "serve", "m", "--device", "tpu"], "tpu"),
    (["vllm", "serve", "m", "--device=TPU"], "tpu"),
    (["x", "--device", "cuda"], "cuda"),
    (["x", "--device"], None),
    (["x", "--devices", "tpu"], None),
    (["x"], None),
])
def test_device_flag(argv, expected):
    assert activation.device_flag(argv) == expected


def test_tpu_requested_by_flag_env_or_framework_switch(monkeypatch):
    monkeypatch.delenv("TPU_PLUGINS_DEVICE", raising=False)
    monkeypatch.setattr(activation.runtime, "tpu_attached", lambda: False)
    assert not activation.tpu_requested(["prog"])
    assert activation.tpu_requested(["prog", "--device", "tpu"])
    assert activation.tpu_requested(["prog"], extra_env_request=True)
    monkeypatch.setenv("TPU_PLUGINS_DEVICE", "tpu")
    assert activation.tpu_requested(["prog"])


def test_attached_tpu_activates(monkeypatch):
    monkeypatch.delenv("TPU_PLUGINS_DEVICE", raising=False)
    monkeypatch.setattr(activation.runtime, "tpu_attached", lambda: True)
    assert activation.tpu_requested(["prog"])


def test_never_raises(monkeypatch):
    def broken():
        raise OSError("sysfs exploded")

    monkeypatch.delenv("TPU_PLUGINS_DEVICE", raising=False)
    monkeypatch.setattr(activation.runtime, "tpu_attached", broken)
    assert activation.tpu_requested(["prog"]) is False
