"""TPU generations and their published per-chip figures, used for placement and rooflines.

Figures are Google Cloud's published peak numbers per chip. `devices_per_chip` is how many
JAX devices one chip shows: v4 and v5p fuse their two TensorCores ("megacore") into one
device, TPU7x exposes its two TensorCores as two devices.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_plugins.errors import UserError

GB = 10**9
GiB = 2**30


@dataclass(frozen=True)
class ChipSpec:
    generation: str           # our short name: v4, v5e, v5p, v6e, v7
    jax_device_kinds: tuple[str, ...]  # what jax.Device.device_kind reports
    topology_prefix: str      # how libtpu spells the generation in topology names
    tensorcores_per_chip: int
    devices_per_chip: int
    bf16_tflops: float
    int8_tops: float          # for v7 the published 8-bit figure is FP8
    hbm_bytes: int
    hbm_gbps: float           # GB/s
    ici_gbps: float           # GB/s per chip, as published (Gbit/s figures divided by 8)

    @property
    def hbm_bytes_per_device(self) -> int:
        return self.hbm_bytes // self.devices_per_chip

    @property
    def bf16_flops_per_s(self) -> float:
        return self.bf16_tflops * 1e12

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_gbps * GB


CHIPS: dict[str, ChipSpec] = {
    spec.generation: spec
    for spec in (
        ChipSpec("v4", ("TPU v4",), "v4", 2, 1, 275.0, 275.0, 32 * GiB, 1200.0, 300.0),
        ChipSpec("v5e", ("TPU v5 lite", "TPU v5e"), "v5e", 1, 1, 197.0, 394.0, 16 * GiB, 819.0, 200.0),
        ChipSpec("v5p", ("TPU v5", "TPU v5p"), "v5p", 2, 1, 459.0, 918.0, 95 * GiB, 2765.0, 600.0),
        ChipSpec("v6e", ("TPU v6 lite", "TPU v6e"), "v6e", 1, 1, 918.0, 1836.0, 32 * GiB, 1640.0, 448.0),
        ChipSpec("v7", ("TPU7x", "TPU v7", "TPU v7x"), "tpu7x", 2, 2, 2307.0, 4614.0, 192 * GiB, 7380.0, 1200.0),
    )
}


def chip_for_device_kind(device_kind: str) -> ChipSpec | None:
    """The chip behind a JAX device kind string, or None for an unknown kind."""
    wanted = device_kind.strip().lower()
    for spec in CHIPS.values():
        if any(kind.lower() == wanted for kind in spec.jax_device_kinds):
            return spec
    return None


def chip_by_name(name: str) -> ChipSpec:
    """Look a generation up by our short name or its topology prefix ("v6e", "tpu7x")."""
    wanted = name.strip().lower()
    for spec in CHIPS.values():
        if wanted in (spec.generation, spec.topology_prefix):
            return spec
    raise UserError(f"Unknown TPU generation {name!r}; known generations: {', '.join(CHIPS)}.")
