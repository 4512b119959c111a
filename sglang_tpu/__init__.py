"""SGLang adapter: runs `python -m sglang.launch_server --device tpu` on the tpu_plugins core.

Entry points:
  * `sglang.srt.platforms` -> `platform_plugin`: our SRTPlatform's qualified name when a TPU
    is attached, `--device tpu` is given, TPU_PLUGINS_DEVICE=tpu, or SGLANG_PLATFORM names
    this plugin; otherwise None.
  * `sglang.srt.plugins` -> `general_plugin`: registers our hooks and `--quantization int8`
    only when the platform is ours; otherwise does nothing.
"""

from __future__ import annotations

import importlib.util
import logging
import os

logger = logging.getLogger(__name__)

PLUGIN_NAME = "tpu_plugins"  # the entry point name, as SGLANG_PLATFORM spells it
PLATFORM_QUALNAME = "sglang_tpu.platform.TpuSRTPlatform"


def _requested() -> bool:
    from tpu_plugins import activation

    return activation.tpu_requested(extra_env_request=os.environ.get("SGLANG_PLATFORM", "") == PLUGIN_NAME)


def platform_plugin() -> str | None:
    try:
        if not _requested():
            return None
        if importlib.util.find_spec("sglang_tpu.platform") is None:
            # The platform and model worker land with the SGLang adapter; until then stay out.
            logger.warning("tpu-plugins: a TPU was requested, but this build has no SGLang platform yet.")
            return None
        from sglang_tpu import torchvision_compat

        torchvision_compat.install()   # before SGLang imports its model configs
        return PLATFORM_QUALNAME
    except Exception:  # a raising plugin would break every SGLang start
        logger.debug("tpu-plugins SGLang platform detection failed", exc_info=True)
        return None


def general_plugin() -> None:
    try:
        if not _requested() or importlib.util.find_spec("sglang_tpu.hooks") is None:
            return
        from sglang_tpu import hooks, quantization

        hooks.register()
        quantization.register()
    except Exception:
        logger.warning("tpu-plugins: registering SGLang hooks failed", exc_info=True)
