"""`--quantization int8` for vLLM: int8 weights, one scale per output channel, quantized by the
core as it loads a float checkpoint (tpu_plugins/quantization.py).

vLLM validates a quantization name against its registry before any worker exists, so the
name is registered through vLLM's hook for out-of-tree methods, `register_quantization_config`.
The config class only answers vLLM's checks (tpu_plugins.quantization.FrameworkInt8Method);
vLLM never builds its own layers on this platform. compressed-tensors int8 checkpoints need
nothing here: vLLM detects them from config.json, and the core reads the same config and loads
the int8 tensors as they are.
"""

from __future__ import annotations

from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

from tpu_plugins.quantization import FrameworkInt8Method


class TpuInt8Config(FrameworkInt8Method, QuantizationConfig):
    pass


_REGISTERED = False


def register() -> None:
    """Idempotent; vLLM calls the platform's pre-registration hook more than once."""
    global _REGISTERED
    if not _REGISTERED:
        register_quantization_config(TpuInt8Config().get_name())(TpuInt8Config)
        _REGISTERED = True
