"""Device discovery: plain CPU, a simulated slice, and the user's own JAX settings winning."""

from pathlib import Path

from conftest import run_json

from tpu_plugins import runtime

DISCOVER = "import json; from tpu_plugins import runtime; print(json.dumps(runtime.current().as_dict()))"


def test_plain_cpu_host_runs_on_one_cpu_device():
    rt = run_json(DISCOVER)
    assert (rt["kind"], rt["platform"], rt["num_devices"], rt["simulated"]) == ("cpu", "cpu", 1, False)
    assert rt["hbm_bytes_per_device"] > 2**30  # a share of host memory


def test_simulated_slice_has_the_requested_devices():
    rt = run_json(DISCOVER, TPU_PLUGINS_SIM_DEVICES="8")
    assert (rt["kind"], rt["num_devices"], rt["num_global_devices"], rt["simulated"]) == ("cpu", 8, 8, True)


def test_no_tpu_means_jax_never_asks_libtpu():
    out = run_json("import json, os; from tpu_plugins import runtime; runtime.current(); "
                   "import jax; print(json.dumps([os.environ['JAX_PLATFORMS'], jax.default_backend()]))")
    assert out == ["cpu", "cpu"]


def test_users_own_xla_flags_win_over_the_setting():
    rt = run_json(DISCOVER, TPU_PLUGINS_SIM_DEVICES="8", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    assert rt["num_devices"] == 2


def test_bad_setting_is_a_clear_error():
    from conftest import run_python

    proc = run_python(DISCOVER, TPU_PLUGINS_SIM_DEVICES="eight")
    assert proc.returncode != 0
    assert "TPU_PLUGINS_SIM_DEVICES='eight' is not an integer" in proc.stderr


def _fake_pci(root: Path, vendors: list[str], classes: list[str] | None = None) -> Path:
    for i, vendor in enumerate(vendors):
        dev = root / f"0000:00:0{i}.0"
        dev.mkdir(parents=True)
        (dev / "vendor").write_text(vendor + "\n")
        (dev / "class").write_text((classes[i] if classes else "0x120000") + "\n")
    return root


def test_tpu_attached_reads_the_google_pci_vendor(tmp_path):
    assert runtime.tpu_attached(_fake_pci(tmp_path / "a", ["0x8086", "0x1ae0"]))
    assert not runtime.tpu_attached(_fake_pci(tmp_path / "b", ["0x8086", "0x10de"]))
    assert not runtime.tpu_attached(tmp_path / "missing")


def test_google_network_and_disk_devices_are_not_tpu_chips(tmp_path):
    # A GCE VM's gVNIC (class 0x020000) and NVMe persistent disk (0x010802) carry Google's vendor id too.
    vm = _fake_pci(tmp_path / "vm", ["0x1ae0", "0x1ae0", "0x8086"], ["0x020000", "0x010802", "0x060000"])
    assert not runtime.tpu_attached(vm)
    host = _fake_pci(tmp_path / "tpu", ["0x1ae0"] * 5, ["0x020000"] + ["0x120000"] * 4)
    assert runtime.tpu_chips_attached(host) == 4
