"""What we run on: a real TPU, a simulated TPU slice on CPU devices, a GPU, or plain CPU.

Discovery happens once per process (`current()`), and everyone else reads its answer.
Two facts must be settled before JAX initialises its backends, so `prepare_jax()` does that:
  * with no TPU attached, JAX is pointed at the CPU (or a GPU plugin) so that libtpu is never
    asked to find chips that are not there;
  * a simulated slice of N devices needs `--xla_force_host_platform_device_count=N` in
    XLA_FLAGS before the CPU backend starts.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from tpu_plugins import settings
from tpu_plugins.chips import ChipSpec, chip_for_device_kind
from tpu_plugins.errors import UserError

logger = logging.getLogger(__name__)

GOOGLE_PCI_VENDOR = "0x1ae0"
_SIM_FLAG = "--xla_force_host_platform_device_count"
_JAX_GPU_PLUGINS = ("jax_cuda13_plugin", "jax_cuda12_plugin", "jax_rocm7_plugin", "jax_rocm60_plugin")


# Google's other PCI devices on GCE VMs: gVNIC network cards and NVMe persistent disks (class 0x01).
_NOT_TPU_CLASSES = ("0x01", "0x02")


def tpu_chips_attached(pci_root: Path = Path("/sys/bus/pci/devices")) -> int:
    """How many Google TPU chips are on this host's PCI bus (Google's vendor id, not a network or
    storage device). Cheap: reads sysfs, starts nothing."""
    count = 0
    try:
        for device in pci_root.iterdir():
            try:
                if (device / "vendor").read_text().strip().lower() != GOOGLE_PCI_VENDOR:
                    continue
                count += not (device / "class").read_text().strip().lower().startswith(_NOT_TPU_CLASSES)
            except OSError:
                continue
    except OSError:
        return 0
    return count


def tpu_attached(pci_root: Path = Path("/sys/bus/pci/devices")) -> bool:
    """True when a Google TPU is on this host's PCI bus."""
    return tpu_chips_attached(pci_root) > 0


def _jax_initialised() -> bool:
    import sys

    xla_bridge = sys.modules.get("jax._src.xla_bridge")
    return bool(xla_bridge is not None and getattr(xla_bridge, "_backends", None))


def _current_sim_flag(flags: str) -> int | None:
    match = re.search(rf"{_SIM_FLAG}=(\d+)", flags)
    return int(match.group(1)) if match else None


@functools.cache
def prepare_jax() -> None:
    """Settle JAX's platform and simulated device count. Idempotent; call before importing jax.

    The user's own JAX_PLATFORMS and XLA_FLAGS always win over what we would choose.
    """
    conf = settings.load()
    if not settings.jax_platforms() and not tpu_attached():
        gpu = any(importlib.util.find_spec(name) for name in _JAX_GPU_PLUGINS)
        settings.set_jax_platforms("cuda,cpu" if gpu else "cpu")
    if not tpu_attached():
        # libtpu's one-process lock guards chips; with none attached it only serves compile-only
        # topologies (AOT), which any number of processes may use at once.
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    if conf.simulated_devices:
        flags = settings.xla_flags()
        existing = _current_sim_flag(flags)
        if existing is None:
            if _jax_initialised():
                raise UserError(
                    "TPU_PLUGINS_SIM_DEVICES was set after JAX had already started its backends, "
                    "so the simulated slice cannot be created. Set it before the program imports jax."
                )
            settings.set_xla_flags(f"{flags} {_SIM_FLAG}={conf.simulated_devices}".strip())
        elif existing != conf.simulated_devices:
            logger.warning(
                "XLA_FLAGS already sets %s=%d; ignoring TPU_PLUGINS_SIM_DEVICES=%d.",
                _SIM_FLAG, existing, conf.simulated_devices,
            )


def local_chips_before_jax() -> int:
    """Chips this host drives, known without starting JAX: the TPU chips on its PCI bus, or
    the simulated slice's size (1 without one)."""
    return tpu_chips_attached() or device_count_before_jax() or 1


def device_count_before_jax() -> int | None:
    """How many devices JAX will show, where that is known without starting JAX: on a host
    with no TPU, the simulated slice's size (or 1). None with a TPU attached."""
    if tpu_attached():
        return None
    return _current_sim_flag(settings.xla_flags()) or settings.load().simulated_devices or 1


@dataclass(frozen=True)
class Runtime:
    """The execution target, as discovered. `kind` is what we run on, not what we emulate."""

    kind: str                    # "tpu", "gpu" or "cpu"
    simulated: bool              # CPU devices standing in for a TPU slice
    platform: str                # JAX's platform name for the devices
    device_kind: str             # jax.Device.device_kind of device 0
    num_devices: int             # devices visible to this process
    num_global_devices: int      # devices across all hosts of the slice
    num_hosts: int
    chip: ChipSpec | None        # set only for a real TPU
    num_chips: int
    cores_per_chip: int
    hbm_bytes_per_device: int | None  # device memory; on CPU an equal share of host RAM
    topology: str | None         # e.g. "2x2x1" on a real TPU

    @property
    def generation(self) -> str | None:
        return self.chip.generation if self.chip else None

    def describe(self) -> str:
        if self.kind == "tpu":
            return f"TPU {self.generation or self.device_kind}: {self.num_chips} chip(s), topology {self.topology or '?'}"
        if self.simulated:
            return f"simulated TPU slice: {self.num_devices} JAX CPU devices (no TPU attached)"
        return f"{self.kind.upper()}: {self.num_devices} JAX device(s) of kind {self.device_kind!r}"

    def as_dict(self) -> dict:
        out = asdict(self)
        out["chip"] = asdict(self.chip) if self.chip else None
        out["generation"] = self.generation
        return out


def _memory_limit(device) -> int | None:
    try:
        stats = device.memory_stats()
    except Exception:  # backends without memory stats (CPU) raise or return None
        return None
    if not stats:
        return None
    return stats.get("bytes_limit")


def _tpu_topology(devices) -> str | None:
    coords = [getattr(d, "coords", None) for d in devices]
    if not coords or any(c is None for c in coords):
        return None
    dims = [max(c[i] for c in coords) - min(c[i] for c in coords) + 1 for i in range(len(coords[0]))]
    return "x".join(str(d) for d in dims)


@functools.cache
def current() -> Runtime:
    """Discover the execution target once; every later call returns the same answer."""
    prepare_jax()
    from tpu_plugins import distributed

    distributed.join_from_settings()   # a multi-host slice's processes join before JAX starts
    import jax

    devices = jax.local_devices()
    first = devices[0]
    platform = first.platform
    sim_count = settings.load().simulated_devices
    if platform == "tpu":
        chip = chip_for_device_kind(first.device_kind)
        per_chip = chip.devices_per_chip if chip else 1
        cores = chip.tensorcores_per_chip if chip else getattr(first, "num_cores", 1)
        hbm = _memory_limit(first) or (chip.hbm_bytes_per_device if chip else None)
        return Runtime(
            kind="tpu", simulated=False, platform=platform, device_kind=first.device_kind,
            num_devices=len(devices), num_global_devices=jax.device_count(), num_hosts=jax.process_count(),
            chip=chip, num_chips=max(1, len(devices) // per_chip), cores_per_chip=cores,
            hbm_bytes_per_device=hbm, topology=_tpu_topology(jax.devices()),
        )
    kind = "gpu" if platform in ("gpu", "cuda", "rocm") else "cpu"
    memory = _memory_limit(first)
    if memory is None and kind == "cpu":
        # CPU devices share host memory; each simulated chip gets an equal share of it.
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // len(devices)
    return Runtime(
        kind=kind, simulated=kind == "cpu" and (sim_count > 0 or len(devices) > 1), platform=platform, device_kind=first.device_kind,
        num_devices=len(devices), num_global_devices=jax.device_count(), num_hosts=jax.process_count(),
        chip=None, num_chips=0, cores_per_chip=0, hbm_bytes_per_device=memory, topology=None,
    )
