"""Run JAX 0.10's Pallas ragged paged attention kernel in TPU interpret mode on a CPU.

The kernel reshapes a whole VMEM buffer ref (`async_copy.wait().reshape(rows, head_dim)`) and
then reads strided rows from it. JAX 0.10.2's TPU interpreter computes every read as a slice
of the stored buffer and has no rule for a reshape transform, so the read fails with
`AttributeError: 'ReshapeTransform' object has no attribute 'indices'`.

A second defect follows once reads work: a masked store into part of a multi-dimensional
VMEM buffer is reported out of bounds, because the interpreter's in-bounds mask clears rows of
the first axis for every axis it checks.

`tpu_interpret_with_ref_reshapes()` works around both, for the duration of a `with` block:
  * a read that carries a reshape reads the region before the reshape, then applies the
    reshape and the indexers that follow in NumPy;
  * a masked store whose region is fully in bounds is turned into a plain store of the merged
    values (new where the mask is set, old elsewhere).
Everything else goes through untouched. This changes only the CPU simulation, never what is
compiled for a TPU; it is a test-time shim, named and contained here, until the interpreter is
fixed upstream. Only 32-bit data is supported (the kernel's bf16 path also bitcasts refs,
which needs TPU packing semantics).
"""

from __future__ import annotations

from tpu_plugins import jax_env  # noqa: F401  (settles JAX's platform before jax is imported)

import contextlib

import numpy as np
from jax._src.pallas.mosaic.interpret import interpret_pallas_call as _interpreter
from jax._src.pallas.mosaic.interpret import shared_memory as _shared_memory
from jax._src.state import types as _state_types
from jax.experimental.pallas import tpu as pltpu


def _index(value: np.ndarray, indexer) -> np.ndarray:
    key = []
    for idx in indexer.indices:
        if hasattr(idx, "start") and hasattr(idx, "size"):
            start, size, stride = int(idx.start), int(idx.size), int(getattr(idx, "stride", 1))
            key.append(slice(start, start + size * stride, stride))
        else:
            key.append(int(idx))
    return value[tuple(key)]


def _reading_through_reshapes(original_get):
    def get(token, device_id, local_core_id, memory_space, buffer_id, transforms, *args, **kwargs):
        transforms = tuple(transforms)
        first = next((i for i, t in enumerate(transforms) if isinstance(t, _state_types.ReshapeTransform)), None)
        if first is None:
            return original_get(token, device_id, local_core_id, memory_space, buffer_id, transforms, *args, **kwargs)
        token, value = original_get(token, device_id, local_core_id, memory_space, buffer_id, transforms[:first],
                                    *args, **kwargs)
        for transform in transforms[first:]:
            if isinstance(transform, _state_types.ReshapeTransform):
                value = value.reshape(transform.shape)
            else:
                value = _index(value, transform)
        return token, np.ascontiguousarray(value)

    # The interpreter's DMA emulation calls the undecorated read directly; DMAs carry no reshapes.
    get.__wrapped__ = original_get.__wrapped__
    return get


def _masked_stores_as_merges(original_swap):
    def swap_buffer_content(self, key, rnge, value, mask, *args, **kwargs):
        if mask is not None:
            try:
                current = np.array(self.mem[key][rnge])
            except (IndexError, TypeError):
                current = None
            if current is not None and current.shape == value.shape:
                return original_swap(self, key, rnge, np.where(mask, value, current), None, *args, **kwargs)
        return original_swap(self, key, rnge, value, mask, *args, **kwargs)

    return swap_buffer_content


@contextlib.contextmanager
def tpu_interpret_with_ref_reshapes():
    """TPU interpret mode (`pltpu.force_tpu_interpret_mode`) with the two work-arounds above."""
    original_get = _interpreter.get
    original_swap = _shared_memory.SharedMemory.swap_buffer_content
    _interpreter.get = _reading_through_reshapes(original_get)
    _shared_memory.SharedMemory.swap_buffer_content = _masked_stores_as_merges(original_swap)
    try:
        with pltpu.force_tpu_interpret_mode():
            yield
    finally:
        _interpreter.get = original_get
        _shared_memory.SharedMemory.swap_buffer_content = original_swap
