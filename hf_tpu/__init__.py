"""Hugging Face adapter: the torch "tpu" device for Transformers, Diffusers and Accelerate.

Entry point (group `torch.backends`, called by `import torch`): `torch_backend_entry`.
It must never raise (that would break `import torch` for every program in the environment)
and must not change programs that never ask for "tpu": it acts only when a TPU is attached or
the user opted in (TPU_PLUGINS_DEVICE=tpu, `--device tpu`), or when a program calls `enable()`.

Layout: tensor.py (TpuTensor), dispatch.py (aten ops -> JAX), torchax_ops.py (the lowering
table), torch_device.py (the device and torch.tpu), dynamo_backend.py (torch.compile backend
"tpu"), generation.py (generate() on the core engine), memory.py (device_map="auto"),
placement.py (device-map checks), quantization.py (int8 weights: Int8Config), patches.py (where
transformers / accelerate are wrapped).
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def torch_backend_entry() -> None:
    try:
        from tpu_plugins import activation

        if activation.tpu_requested():
            enable()
    except Exception:
        logger.warning("tpu-plugins: registering the torch 'tpu' device failed", exc_info=True)


def enable() -> bool:
    """Set up the "tpu" device now (also without TPU_PLUGINS_DEVICE). True when it is ours."""
    from hf_tpu import patches, torch_device
    from tpu_plugins import settings

    if not torch_device.register():
        return False
    patches.install()
    # Accelerate picks its device from its own list (CUDA, XPU, NPU, ...) or this variable:
    # asked-for TPUs are where Accelerator() and Trainer run, unless the user chose otherwise.
    settings.default_accelerate_device(torch_device.DEVICE)
    return True
