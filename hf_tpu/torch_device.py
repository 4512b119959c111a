"""The torch "tpu" device: torch.device("tpu"), tensor.to("tpu"), Module.to("tpu"), torch.tpu.

If Google's `torch_tpu` is installed and a TPU is attached, it owns "tpu" and we do nothing.
Otherwise torch's spare backend slot (PrivateUse1) is named "tpu" and set up as a Python
backend (torch.utils.backend_registration): tensors on it are TpuTensors holding jax.Arrays.
Only allocation and host-copy kernels are registered at the PrivateUse1 key (every other op reaches
TpuTensor.__torch_dispatch__). Nothing here imports JAX; that happens at the first tensor.
"""

from __future__ import annotations

import importlib.util
import threading
import types

import torch

from tpu_plugins import activation, runtime

DEVICE = activation.DEVICE_NAME
_lock = threading.Lock()
_registered = False
_library = None   # keeps the torch.library registrations alive


def torch_tpu_owns_device() -> bool:
    return importlib.util.find_spec("torch_tpu") is not None and runtime.tpu_attached()


def device_count() -> int:
    count = runtime.device_count_before_jax()
    if count is not None:
        return count
    from hf_tpu.tensor import jax_devices

    return len(jax_devices())


def _device_module() -> types.ModuleType:
    """torch.tpu: what torch, transformers and accelerate ask of a device module."""
    module = types.ModuleType(f"torch.{DEVICE}", "TPU device module (tpu-plugins, JAX)")
    module.is_available = lambda: True
    module.is_initialized = lambda: True
    module._is_in_bad_fork = lambda: False
    module.device_count = device_count
    module.current_device = lambda: 0
    module.set_device = lambda device: None
    module.synchronize = _synchronize
    module.manual_seed = lambda seed: None       # random ops draw from torch's CPU generator
    module.manual_seed_all = lambda seed: None
    module.seed = lambda: None
    module.seed_all = lambda: None
    module.get_rng_state = lambda device=None: torch.get_rng_state()
    module.set_rng_state = lambda state, device=None: torch.set_rng_state(state)
    module.get_rng_state_all = lambda: [torch.get_rng_state()]
    module.set_rng_state_all = lambda states: torch.set_rng_state(states[0])
    module.empty_cache = lambda: None
    module.memory_allocated = lambda device=None: 0
    module.max_memory_allocated = lambda device=None: 0
    module.reset_peak_memory_stats = lambda device=None: None
    module.mem_get_info = _mem_get_info
    module.get_device_name = lambda device=None: runtime.current().device_kind
    module.get_amp_supported_dtype = lambda: [torch.bfloat16, torch.float16]
    module.is_bf16_supported = lambda including_emulation=True: True
    # JAX orders work on a device itself: torch-level streams and events are the host's.
    module.Stream = torch.cpu.Stream
    module.Event = torch.cpu.Event
    module.StreamContext = torch.cpu.StreamContext
    module.stream = torch.cpu.stream
    module.current_stream = torch.cpu.current_stream
    return module


def _synchronize(device=None) -> None:
    from hf_tpu.tensor import jax_devices

    import jax

    for d in jax_devices():
        jax.device_put(0, d).block_until_ready()


def _mem_get_info(device=None) -> tuple[int, int]:
    total = runtime.current().hbm_bytes_per_device or 0
    return total, total


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _DeviceGuard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    from hf_tpu.dispatch import zeros

    return zeros(tuple(size), dtype or torch.get_default_dtype(), torch.device(device).index)


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return _empty(size, dtype=dtype, device=device)


def _copy_from(source, target, non_blocking=False):
    from hf_tpu.dispatch import assign

    assign(target, source)
    return target


# Factories whose composite form fills an empty([0]) tensor through out=, which would resize it:
# a wrapper tensor's shape is fixed, so these are built on the host and moved in one copy.
_HOST_FACTORIES = (
    "arange", "arange.start", "arange.start_step", "linspace", "logspace", "randperm",
    "eye", "eye.m", "tril_indices", "triu_indices",
)


def _host_factory(op_name: str):
    packet, _, overload = op_name.partition(".")
    op = getattr(getattr(torch.ops.aten, packet), overload or "default")

    def kernel(*args, **kwargs):
        from hf_tpu.tensor import from_host

        device = torch.device(kwargs.pop("device"))
        kwargs.pop("pin_memory", None)
        host = op(*args, **{**kwargs, "device": "cpu"})
        return from_host(host, device.index)

    return kernel


def register() -> bool:
    """Name the device and set it up. Returns True when "tpu" is ours after the call."""
    global _registered, _library
    with _lock:
        if _registered:
            return True
        if torch_tpu_owns_device():
            return False
        current = torch._C._get_privateuse1_backend_name()
        if current not in ("privateuseone", DEVICE):
            raise RuntimeError(f"torch's PrivateUse1 device is already named {current!r} by another package")
        if current == "privateuseone":
            torch.utils.rename_privateuse1_backend(DEVICE)
        torch._register_device_module(DEVICE, _device_module())
        torch._C._acc.register_python_privateuseone_hook(_Hooks())
        torch._C._acc.register_python_privateuseone_device_guard(_DeviceGuard())
        if not hasattr(torch.Tensor, DEVICE):
            torch.utils.generate_methods_for_privateuse1_backend(for_storage=False)
        _library = torch.library.Library("aten", "IMPL")
        # Kernels are plain Python: TorchDynamo must call them, never trace into them.
        opaque = torch._dynamo.disable
        _library.impl("empty.memory_format", opaque(_empty), "PrivateUse1")
        _library.impl("empty_strided", opaque(_empty_strided), "PrivateUse1")
        # torch.tensor(data, device="tpu") copies below the Python dispatch key.
        _library.impl("_copy_from", opaque(_copy_from), "PrivateUse1")
        for name in _HOST_FACTORIES:
            _library.impl(name, opaque(_host_factory(name)), "PrivateUse1")
        runtime.prepare_jax()
        # Module.to("tpu") must keep each Parameter object (optimizers created before the move,
        # tied weights, Accelerate's prepare): a host tensor cannot take a TpuTensor as its
        # .data, so torch's conversion swaps the tensors' contents in place instead.
        torch.__future__.set_swap_module_params_on_conversion(True)
        _registered = True
        return True
