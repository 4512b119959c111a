"""vLLM adapter: runs `vllm serve MODEL --device tpu` on the tpu_plugins core.

Entry point (group `vllm.platform_plugins`): `platform_plugin` returns our Platform's
qualified name when a TPU is attached, `--device tpu` is on the command line, or
TPU_PLUGINS_DEVICE=tpu; otherwise None, so vLLM behaves as if we were not installed.
An out-of-tree plugin that activates wins over vLLM's built-in TPU platform.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

PLATFORM_QUALNAME = "vllm_tpu.platform.TpuPlatform"


def platform_plugin() -> str | None:
    try:
        from tpu_plugins import activation

        if not activation.tpu_requested():
            return None
        # Our runner speaks the V1 model-runner scheduler contract (see model_runner.py).
        os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
        # vLLM's engine-core process must agree, whatever its command line.
        os.environ.setdefault("TPU_PLUGINS_DEVICE", "tpu")
        return PLATFORM_QUALNAME
    except Exception:  # a raising plugin would break every vLLM start
        logger.debug("tpu-plugins vLLM platform detection failed", exc_info=True)
        return None
