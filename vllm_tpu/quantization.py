"""`--quantization int8` for vLLM: int8 weights, one scale per output channel, quantized by the
core as it loads a float checkpoint (tpu_plugins/quantization.py).

vLLM validates a quantization name against its registry before any worker exists, so the
name is registered through vLLM's hook for out-of-tree methods, `register_quantization_config`.
The config class only describes the method to vLLM's checks (activation dtypes, no config
file); vLLM never builds its own layers on this platform, so `get_quant_method` is never
asked for one. compressed-tensors int8 checkpoints need nothing here: vLLM detects them from
config.json, and the core reads the same config and loads the int8 tensors as they are.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

from tpu_plugins.quantization import METHODS

NAME = "int8"
assert NAME in METHODS


class TpuInt8Config(QuantizationConfig):
    def get_name(self) -> str:
        return NAME

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 0

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []          # quantized at load time: the checkpoint carries no quantization config

    @classmethod
    def from_config(cls, config: dict) -> "TpuInt8Config":
        return cls()

    def get_quant_method(self, layer, prefix: str):
        return None        # the core runs the model; vLLM's layers are never built here


_REGISTERED = False


def register() -> None:
    """Idempotent; vLLM calls the platform's pre-registration hook more than once."""
    global _REGISTERED
    if not _REGISTERED:
        register_quantization_config(NAME)(TpuInt8Config)
        _REGISTERED = True
