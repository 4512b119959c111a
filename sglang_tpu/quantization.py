"""`--quantization int8` for SGLang: int8 weights, one scale per output channel, quantized by
the core as it loads a float checkpoint (tpu_plugins/quantization.py).

SGLang checks the name twice: argparse choices, which it extends through its own hook
(`add_quantization_method_choices`), and its model config's `_verify_quantization`, which looks
the name up in `QUANTIZATION_METHODS`. That dict has no registration function, so the name
is added to it here (one named entry). The config class only answers SGLang's checks
(tpu_plugins.quantization.FrameworkInt8Method); SGLang's layers are never built on this
platform. compressed-tensors int8 checkpoints need nothing here: SGLang detects them from
config.json and the core loads the int8 tensors.
"""

from __future__ import annotations

from sglang.srt.layers.quantization.base_config import QuantizationConfig

from tpu_plugins.quantization import FrameworkInt8Method


class TpuInt8Config(FrameworkInt8Method, QuantizationConfig):
    pass


def register() -> None:
    from sglang.srt.arg_groups.choices import QUANTIZATION_CHOICES, add_quantization_method_choices
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS

    name = TpuInt8Config().get_name()
    if name not in QUANTIZATION_CHOICES:
        add_quantization_method_choices([name])
    QUANTIZATION_METHODS.setdefault(name, TpuInt8Config)
