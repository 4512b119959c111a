"""Checks of a transformers device map that names "tpu", before any weight is read.

`from_pretrained(..., device_map="tpu" | {"": "tpu:1"} | "auto")` plans placement on a meta
model first; this runs right after that plan, so a device that does not exist, a dtype the TPU
cannot hold, or a model larger than the device's free memory stops the load with a message
that says what to change, instead of failing part-way through the weights.
"""

from __future__ import annotations

import torch

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_GIB = 1024**3


def _tpu_index(device) -> int | None:
    if isinstance(device, int):
        device = torch.device(device)
    if isinstance(device, str):
        if device in ("cpu", "disk", "meta"):
            return None
        device = torch.device(device)
    if isinstance(device, torch.device) and device.type == "tpu":
        return device.index or 0
    return None


def _placement(name: str, device_map: dict):
    """The device_map entry for a parameter name (the longest matching module prefix)."""
    best, best_len = device_map.get(""), -1
    for prefix, device in device_map.items():
        if prefix and (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best_len:
            best, best_len = device, len(prefix)
    return best


def check_device_map(model, device_map) -> None:
    if not isinstance(device_map, dict):
        return
    tpu_devices = {i for i in (_tpu_index(d) for d in device_map.values()) if i is not None}
    if not tpu_devices:
        return
    from hf_tpu.memory import free_bytes
    from hf_tpu.torch_device import device_count

    count = device_count()
    for index in sorted(tpu_devices):
        if index >= count:
            raise ValueError(f"device_map names tpu:{index}, but this host has {count} tpu device(s) "
                             f"(tpu:0..tpu:{count - 1}). Use one of those, or device_map=\"auto\".")
    if model.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise ValueError(f"dtype {model.dtype} is not supported on tpu (TPUs have no 64-bit floats); "
                         f"pass dtype= one of {names} to from_pretrained.")
    need = dict.fromkeys(tpu_devices, 0)
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        index = _tpu_index(_placement(name, device_map))
        if index is not None:
            need[index] += tensor.numel() * tensor.element_size()
    for index, size in need.items():
        free = free_bytes(index)
        if size > free:
            raise ValueError(
                f"The model needs {size / _GIB:.2f} GiB on tpu:{index}, which has {free / _GIB:.2f} GiB free. "
                "Use device_map=\"auto\" (spreads it over the tpu devices and offloads the rest to the host), "
                "a smaller dtype (dtype=torch.bfloat16), or a device with more memory.")


def install() -> None:
    import transformers.modeling_utils as modeling_utils

    original = modeling_utils._get_device_map
    if getattr(original, "_tpu_plugins", False):
        return

    def get_device_map(model, device_map, max_memory, hf_quantizer):
        device_map = original(model, device_map, max_memory, hf_quantizer)
        check_device_map(model, device_map)
        return device_map

    get_device_map._tpu_plugins = True
    modeling_utils._get_device_map = get_device_map
