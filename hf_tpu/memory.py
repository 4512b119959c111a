"""Device memory of "tpu" devices for Accelerate's and transformers' `device_map="auto"`.

Accelerate's `get_max_memory` probes CUDA, XPU, NPU and the like, but not "tpu": without this
a model would be planned for the host only. With no `max_memory` given, the wrapped function
returns each tpu device's free HBM (on a host without a TPU, each simulated device's share of
host memory) plus the host's memory, as Accelerate does for GPUs.
"""

from __future__ import annotations

import functools


def free_bytes(index: int) -> int:
    from hf_tpu.tensor import jax_device
    from tpu_plugins import runtime

    device = jax_device(index)
    try:
        stats = device.memory_stats() or {}
    except Exception:   # CPU devices have no memory stats
        stats = {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    return int(runtime.current().hbm_bytes_per_device or 0)


def tpu_max_memory() -> dict:
    import psutil
    import torch

    memory: dict = {i: free_bytes(i) for i in range(torch.tpu.device_count())}
    memory["cpu"] = psutil.virtual_memory().available
    return memory


def _wrap(original):
    @functools.wraps(original)
    def get_max_memory(max_memory=None):
        import torch

        if max_memory is None and torch._C._get_privateuse1_backend_name() == "tpu":
            return tpu_max_memory()
        return original(max_memory)

    get_max_memory._tpu_plugins = True
    return get_max_memory


def install() -> None:
    import importlib
    import sys

    targets = ["accelerate.utils.modeling", "accelerate.utils"]
    if "transformers.integrations.accelerate" in sys.modules:
        targets.append("transformers.integrations.accelerate")
    for name in targets:
        module = importlib.import_module(name)
        attribute = "accelerate_max_memory" if name.startswith("transformers") else "get_max_memory"
        current = getattr(module, attribute, None)
        if current is not None and not getattr(current, "_tpu_plugins", False):
            setattr(module, attribute, _wrap(current))
