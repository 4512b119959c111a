"""Every environment variable the project reads, read here and nowhere else."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from tpu_plugins.errors import UserError


@dataclass(frozen=True)
class Settings:
    # "tpu" asks the adapters to activate even where no TPU is present (JAX's CPU backend
    # then stands in); "" leaves the choice to hardware discovery.
    device: str
    # Number of CPU devices that simulate a TPU slice when no TPU is present (0: JAX default).
    simulated_devices: int
    # Where prepared models and compilation caches live.
    cache_dir: Path


def _int_env(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise UserError(f"{name}={raw!r} is not an integer; set it to a whole number such as 8, or unset it.") from None
    if value < 0:
        raise UserError(f"{name}={raw!r} is negative; set it to 0 (off) or a positive device count.")
    return value


def load() -> Settings:
    """Read the environment now (not at import), so tests and launchers can change it first."""
    cache = os.environ.get("TPU_PLUGINS_CACHE", "").strip()
    return Settings(
        device=os.environ.get("TPU_PLUGINS_DEVICE", "").strip().lower(),
        simulated_devices=_int_env("TPU_PLUGINS_SIM_DEVICES", 0),
        cache_dir=Path(cache).expanduser() if cache else Path.home() / ".cache" / "tpu-plugins",
    )


# A multi-host slice's processes (tpu_plugins/distributed.py): host 0's coordinator address
# (host:port), how many hosts, and which one this is. Unset: one host.
COORDINATOR = "TPU_PLUGINS_COORDINATOR"
NUM_HOSTS = "TPU_PLUGINS_NUM_HOSTS"
HOST_ID = "TPU_PLUGINS_HOST_ID"


@dataclass(frozen=True)
class MultiHost:
    coordinator: str | None
    num_hosts: int | None
    host_id: int | None


def multihost() -> MultiHost:
    def optional_int(name):
        return _int_env(name, 0) if os.environ.get(name, "").strip() else None

    return MultiHost(os.environ.get(COORDINATOR, "").strip() or None, optional_int(NUM_HOSTS), optional_int(HOST_ID))


# For processes we start (tests, benchmarks, demos): no framework telemetry and no model-hub
# lookups, since our machines reach loopback only.
QUIET_FRAMEWORKS = {"DO_NOT_TRACK": "1", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}


def jax_platforms() -> str:
    """The JAX_PLATFORMS the user set, if any (empty when unset)."""
    return os.environ.get("JAX_PLATFORMS", "").strip()


def set_jax_platforms(value: str) -> None:
    os.environ["JAX_PLATFORMS"] = value


def xla_flags() -> str:
    return os.environ.get("XLA_FLAGS", "")


def set_xla_flags(value: str) -> None:
    os.environ["XLA_FLAGS"] = value


# SGLang's --tp-size and --ep-size, moved onto the core's mesh: SGLang itself runs one worker
# process, which reads the sizes from here (the platform sets them in SGLang's launcher; its
# children inherit them).
SGLANG_MESH_TP = "TPU_PLUGINS_SGLANG_TP_SIZE"
SGLANG_MESH_EP = "TPU_PLUGINS_SGLANG_EP_SIZE"


def sglang_mesh_tp() -> int:
    return _int_env(SGLANG_MESH_TP, 1) or 1


def set_sglang_mesh_tp(value: int) -> None:
    os.environ[SGLANG_MESH_TP] = str(value)


def sglang_mesh_ep() -> int:
    return _int_env(SGLANG_MESH_EP, 1) or 1


def set_sglang_mesh_ep(value: int) -> None:
    os.environ[SGLANG_MESH_EP] = str(value)


ACCELERATE_DEVICE = "ACCELERATE_TORCH_DEVICE"   # Accelerate's own device switch


def default_accelerate_device(value: str) -> None:
    """Accelerate (and so transformers' Trainer) uses `value` unless the user chose a device."""
    os.environ.setdefault(ACCELERATE_DEVICE, value)


# Fault injection for the reliability tests, off unless set: a prompt containing this token id
# fails while its request is being prepared (tpu_plugins/request_faults.py).
FAULT_TOKEN = "TPU_PLUGINS_FAULT_TOKEN"


@functools.cache
def fault_token() -> int | None:
    raw = os.environ.get(FAULT_TOKEN, "").strip()
    return _int_env(FAULT_TOKEN, 0) if raw else None
