"""The framework entry points: registered, quiet when not asked, never raising."""

from importlib import metadata

import pytest
from conftest import PROBES, run_json

GROUPS = {
    "vllm.platform_plugins": "vllm_tpu:platform_plugin",
    "sglang.srt.platforms": "sglang_tpu:platform_plugin",
    "sglang.srt.plugins": "sglang_tpu:general_plugin",
    "torch.backends": "hf_tpu:torch_backend_entry",
}


@pytest.mark.parametrize("group,target", GROUPS.items())
def test_entry_point_is_registered(group, target):
    ours = [ep for ep in metadata.entry_points(group=group) if ep.dist and ep.dist.name == "tpu-plugins"]
    assert [ep.value for ep in ours] == [target]


CALL_ALL = """
import json
from importlib import metadata
out = {}
for group in %r:
    for ep in metadata.entry_points(group=group):
        if ep.dist and ep.dist.name == "tpu-plugins":
            out[group] = ep.load()()
print(json.dumps(out))
""" % (list(GROUPS),)


def test_entry_points_return_none_when_no_tpu_is_asked_for():
    assert run_json(CALL_ALL) == {group: None for group in GROUPS}


def test_entry_points_never_raise_when_a_tpu_is_asked_for():
    out = run_json(CALL_ALL, TPU_PLUGINS_DEVICE="tpu")
    for group in ("vllm.platform_plugins", "sglang.srt.platforms"):
        # Either not active yet in this build (None), or a class path that imports.
        assert out[group] is None or ":" not in out[group]
    assert out["torch.backends"] is None and out["sglang.srt.plugins"] is None


def test_frameworks_behave_exactly_as_without_the_package():
    probe = (PROBES / "framework_fingerprint.py").read_text()
    with_us = run_json(probe)
    # The frameworks' own switches that keep every third-party plugin out: the same
    # process as if tpu-plugins were not installed.
    without_us = run_json(probe, VLLM_PLUGINS="none", SGLANG_PLUGINS="none", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert with_us == without_us
    assert with_us["trainer_device"] == "cpu" and with_us["torch_has_tpu_module"] is False
