"""Device meshes with named axes: data, expert and model (tensor) parallelism.

Sharding rules map logical tensor axes onto these names; they live with the models that use
them. Here we only build the mesh and check that the request fits the devices.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_plugins import runtime
from tpu_plugins.errors import UserError

DATA, EXPERT, MODEL = "data", "expert", "model"
AXIS_NAMES = (DATA, EXPERT, MODEL)


@dataclass(frozen=True)
class MeshShape:
    data: int = 1
    expert: int = 1
    model: int = 1

    @property
    def size(self) -> int:
        return self.data * self.expert * self.model

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.data, self.expert, self.model)


def make_mesh(shape: MeshShape = MeshShape(), devices=None):
    """A `jax.sharding.Mesh` over the first `shape.size` devices, axes named AXIS_NAMES.

    On a real TPU the device order follows the physical ICI topology (mesh_utils), so the
    model axis lands on neighbouring chips.
    """
    for name, size in zip(AXIS_NAMES, shape.as_tuple()):
        if size < 1:
            raise UserError(f"Mesh axis {name!r} has size {size}; every axis needs size >= 1.")
    runtime.prepare_jax()
    import jax
    import numpy as np
    from jax.experimental import mesh_utils

    available = list(devices) if devices is not None else jax.devices()
    if shape.size > len(available):
        raise UserError(
            f"A mesh of data={shape.data} x expert={shape.expert} x model={shape.model} needs {shape.size} devices, "
            f"but only {len(available)} are visible. Lower the parallel sizes, or on a CPU host simulate a larger "
            f"slice with TPU_PLUGINS_SIM_DEVICES={shape.size} (set before the program starts)."
        )
    chosen = available[: shape.size]
    try:
        grid = mesh_utils.create_device_mesh(shape.as_tuple(), devices=chosen)
    except (ValueError, NotImplementedError, AssertionError):
        # Sub-slices that mesh_utils cannot lay out physically: fall back to plain order.
        grid = np.array(chosen).reshape(shape.as_tuple())
    return jax.sharding.Mesh(grid, AXIS_NAMES)
