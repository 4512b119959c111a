"""TpuTensor: a torch tensor on device "tpu:N" whose data is a jax.Array on JAX device N.

A wrapper subclass: torch sees the shape, dtype and device; every aten op on it arrives at
`__torch_dispatch__` and is lowered to JAX (`hf_tpu/dispatch.py`). No torch mode is involved,
so tensors work the same in any thread (transformers loads weights in a thread pool).

JAX runs with 32-bit integers (the core engine relies on it), so an int64 tensor keeps int32
data on the device and is int64 again when it comes back to the host; values beyond 2**31
are not representable on the device.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

# torch dtype -> the dtype its data has on the device.
_DEVICE_DTYPES = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.int64: "int32", torch.int32: "int32", torch.int16: "int16",
    torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool", torch.complex64: "complex64",
}


def device_dtype(dtype: torch.dtype):
    import jax.numpy as jnp

    try:
        return jnp.dtype(_DEVICE_DTYPES[dtype])
    except KeyError:
        supported = ", ".join(str(d).removeprefix("torch.") for d in _DEVICE_DTYPES)
        raise TypeError(f"dtype {dtype} is not supported on the tpu device (TPUs have no 64-bit floats); "
                        f"use one of: {supported}") from None


@functools.cache
def jax_devices():
    from tpu_plugins import runtime

    runtime.prepare_jax()
    import jax

    return jax.local_devices()


def jax_device(index: int | None):
    devices = jax_devices()
    index = 0 if index is None else index
    if not 0 <= index < len(devices):
        raise RuntimeError(
            f"tpu:{index} does not exist: this host has {len(devices)} tpu device(s) (tpu:0..tpu:{len(devices) - 1})"
        )
    return devices[index]


class TpuTensor(torch.Tensor):
    """A torch.Tensor on "tpu:N" holding a jax.Array (`.jax()`)."""

    _elem: object  # jax.Array

    @staticmethod
    def __new__(cls, elem, dtype: torch.dtype, index: int = 0, requires_grad: bool = False):
        return torch.Tensor._make_wrapper_subclass(
            cls, tuple(elem.shape), dtype=dtype, device=torch.device("tpu", index), requires_grad=requires_grad
        )

    def __init__(self, elem, dtype: torch.dtype, index: int = 0, requires_grad: bool = False):
        super().__init__()
        self._elem = elem

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})

    def jax(self):
        return self._elem

    def __setitem__(self, key, value):
        # torch writes through a view of self; our views are copies, so write the slice directly.
        _set_item(self, key, value)

    def __repr__(self, *, tensor_contents=None):
        return f"{to_host(self)!r}".replace("tensor(", "tpu_tensor(", 1)[:-1] + f", device='{self.device}')"

    def __reduce_ex__(self, protocol):
        # pickling (torch.save, deepcopy) goes through the host copy and comes back on the device.
        return (_rebuild, (to_host(self), self.device.index, self.requires_grad))


def _dispatch(func, args, kwargs):
    from hf_tpu import dispatch

    return dispatch.run(func, args, kwargs)


def _set_item(tensor, key, value):
    from hf_tpu import dispatch

    dispatch.set_item(tensor, key, value)


# TorchDynamo must treat ops on TpuTensors as opaque calls (see dynamo_backend.py).
_dispatch = torch._dynamo.disable(_dispatch, recursive=True)
_set_item = torch._dynamo.disable(_set_item, recursive=True)


def _rebuild(host: torch.Tensor, index: int, requires_grad: bool):
    return from_host(host, index).requires_grad_(requires_grad)


def to_host(t: TpuTensor) -> torch.Tensor:
    """A CPU copy with the tensor's torch dtype."""
    data = np.asarray(t._elem)
    if t.dtype == torch.bfloat16:
        host = torch.from_numpy(data.view(np.uint16).copy()).view(torch.bfloat16)
    else:
        host = torch.from_numpy(np.array(data, copy=True))
    return host.to(t.dtype)


def from_host(t: torch.Tensor, index: int | None) -> TpuTensor:
    import jax

    t = t.detach()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        data = t.contiguous().view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    else:
        data = t.contiguous().numpy()
    target = device_dtype(t.dtype)
    data = data.astype(target, copy=False)
    index = 0 if index is None else index
    return TpuTensor(jax.device_put(data, jax_device(index)), t.dtype, index)


def wrap(elem, dtype: torch.dtype, index: int) -> TpuTensor:
    """Wrap a JAX result as a tensor of `dtype` (data converted to its device dtype if needed)."""
    target = device_dtype(dtype)
    if elem.dtype != target:
        elem = elem.astype(target)
    return TpuTensor(elem, dtype, index)
