"""Hugging Face adapter: the torch "tpu" device for Transformers, Diffusers and Accelerate.

Entry point (group `torch.backends`, called by `import torch`): `torch_backend_entry`.
It must never raise (that would break `import torch` for every program in the environment)
and must not change programs that never ask for "tpu".
"""

from __future__ import annotations

import importlib.util
import logging

logger = logging.getLogger(__name__)


def torch_backend_entry() -> None:
    try:
        from tpu_plugins import activation

        if not activation.tpu_requested() or importlib.util.find_spec("hf_tpu.torch_device") is None:
            return
        from hf_tpu import torch_device

        torch_device.register()
    except Exception:
        logger.warning("tpu-plugins: registering the torch 'tpu' device failed", exc_info=True)
