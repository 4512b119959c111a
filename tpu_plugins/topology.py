"""TPU slice names as libtpu spells them, resolved to abstract devices for ahead-of-time compiling.

`resolve("v6e:2x2")` asks libtpu for the slice's compile-only devices (no TPU needed) and pairs
them with our published chip figures (chips.py). Names checked against libtpu 0.0.42.1:
v5e/v6e slices are 2-D ("v6e:2x4"), v5p and TPU7x slices 3-D ("v5p:2x2x1", "tpu7x:2x2x1"); v7
is spelled "tpu7x" and shows two devices per chip. A slice smaller than one host's chips
("v6e:1x1") needs its own host bounds, which `resolve` passes.
"""

from __future__ import annotations

from tpu_plugins import jax_env  # noqa: F401  (settles JAX's platform before jax is imported)

import math
import re
from dataclasses import dataclass

from tpu_plugins.chips import ChipSpec, chip_by_name
from tpu_plugins.errors import UserError

# libtpu's generation prefix -> example slice shapes (any shape libtpu accepts works).
EXAMPLES = {
    "v5e": ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
    "v5p": ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8"),
    "v6e": ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
    "tpu7x": ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4"),
}
ALIASES = {"v7": "tpu7x", "v7x": "tpu7x", "v5litepod": "v5e", "v6": "v6e"}
_NAME = re.compile(r"^([a-z0-9]+):(\d+(?:x\d+){1,2})$")


@dataclass(frozen=True)
class TpuSlice:
    name: str
    chip: ChipSpec
    devices: tuple          # libtpu's compile-only devices, in libtpu's order
    num_chips: int

    @property
    def devices_per_chip(self) -> int:
        return len(self.devices) // self.num_chips

    @property
    def hbm_bytes_per_device(self) -> int:
        return self.chip.hbm_bytes // self.devices_per_chip

    @property
    def hbm_bytes_per_s_per_device(self) -> float:
        return self.chip.hbm_bytes_per_s / self.devices_per_chip

    @property
    def flops_per_s_per_device(self) -> float:
        return self.chip.bf16_flops_per_s / self.devices_per_chip

    @property
    def ici_bytes_per_s_per_device(self) -> float:
        return self.chip.ici_gbps * 1e9 / self.devices_per_chip


def valid_names() -> str:
    return "; ".join(f"{gen}:{{{','.join(shapes)}}}" for gen, shapes in EXAMPLES.items())


def resolve(name: str) -> TpuSlice:
    """A slice name -> its abstract devices, or a UserError listing the valid names."""
    text = name.strip().lower()
    match = _NAME.match(text)
    prefix = match.group(1) if match else text.split(":")[0]
    if prefix in ALIASES:
        hint = f" (libtpu spells it {ALIASES[prefix]!r})"
        raise UserError(f"Unknown TPU topology {name!r}{hint}. Valid names look like: {valid_names()}.")
    if not match or prefix not in EXAMPLES:
        raise UserError(f"Unknown TPU topology {name!r}. Valid names look like: {valid_names()}.")
    dims = [int(d) for d in match.group(2).split("x")]
    if (prefix in ("v5e", "v6e")) != (len(dims) == 2):
        raise UserError(f"{name!r}: {prefix} slices have {'2' if prefix in ('v5e', 'v6e') else '3'} dimensions. "
                        f"Valid names look like: {valid_names()}.")
    devices = _compile_only_devices(text, dims)
    return TpuSlice(name=text, chip=chip_by_name(prefix), devices=tuple(devices), num_chips=math.prod(dims))


def _compile_only_devices(name: str, dims: list[int]) -> list:
    from jax.experimental import topologies

    try:
        return list(topologies.get_topology_desc(platform="tpu", topology_name=name).devices)
    except Exception as exc:  # libtpu's JaxRuntimeError; its message names the problem
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "not divisible" in message and all(d <= 2 for d in dims):
            # Smaller than one host's chips: the host is the slice itself.
            bounds = (dims + [1, 1, 1])[:3]
            try:
                return list(topologies.get_topology_desc(platform="tpu", topology_name=name,
                                                         chips_per_host_bounds=bounds).devices)
            except Exception as retry:
                message = str(retry).splitlines()[0]
        raise UserError(f"libtpu cannot build topology {name!r}: {message}. Valid names look like: "
                        f"{valid_names()}.") from None
