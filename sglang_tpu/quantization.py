"""`--quantization int8` for SGLang: int8 weights, one scale per output channel, quantized by
the core as it loads a float checkpoint (tpu_plugins/quantization.py).

SGLang checks the name twice: argparse choices, which it extends through its own hook
(`add_quantization_method_choices`), and its model config's `_verify_quantization`, which looks
the name up in `QUANTIZATION_METHODS`. That dict has no registration function, so the name
is added to it here (one named entry; the config class only answers SGLang's checks, since
SGLang's layers are never built on this platform). compressed-tensors int8 checkpoints need
nothing here: SGLang detects them from config.json and the core loads the int8 tensors.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.quantization.base_config import QuantizationConfig

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
        return []

    @classmethod
    def from_config(cls, config: dict) -> "TpuInt8Config":
        return cls()

    def get_quant_method(self, layer, prefix: str):
        return None

    def get_scaled_act_names(self) -> list[str]:
        return []


def register() -> None:
    from sglang.srt.arg_groups.choices import QUANTIZATION_CHOICES, add_quantization_method_choices
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS

    if NAME not in QUANTIZATION_CHOICES:
        add_quantization_method_choices([NAME])
    QUANTIZATION_METHODS.setdefault(NAME, TpuInt8Config)
