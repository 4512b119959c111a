import json
import subprocess
import sys
from pathlib import Path

from conftest import clean_env

CLI = [str(Path(sys.executable).with_name("tpu-plugins"))]


def run_cli(*args, **env):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=300, env=clean_env(**env))


def test_info_human_readable_names_backend_versions_and_adapters():
    proc = run_cli("info")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("backend: cpu")
    for name in ("jax: 0.10.2", "libtpu:", "vllm: installed, idle", "sglang: installed, idle", "hf: installed, idle"):
        assert name in proc.stdout


def test_info_json_on_a_simulated_slice_with_a_tpu_request():
    proc = run_cli("info", "--json", TPU_PLUGINS_SIM_DEVICES="4", TPU_PLUGINS_DEVICE="tpu")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["runtime"]["simulated"] and report["runtime"]["num_devices"] == 4
    assert report["tpu_requested"] is True
    for adapter in ("vllm", "sglang", "hf"):
        assert report["adapters"][adapter]["entry_points_registered"]
        assert report["adapters"][adapter]["would_activate"]


def test_bad_environment_gives_one_line_error_not_a_traceback():
    proc = run_cli("info", TPU_PLUGINS_SIM_DEVICES="-3")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        "tpu-plugins info: error: TPU_PLUGINS_SIM_DEVICES='-3' is negative; set it to 0 (off) or a positive device count."
    )
