"""int8 weights for transformers models: `quantization_config=Int8Config()`.

    from hf_tpu.quantization import Int8Config
    model = AutoModelForCausalLM.from_pretrained(M, device_map="tpu", quantization_config=Int8Config())

Registered through transformers' own hooks for out-of-tree methods (`register_quantization_config`,
`register_quantizer`), under the method name "tpu_int8". Each `nn.Linear` except the LM head
(and modules the user lists in `modules_to_not_convert`) becomes an `Int8Linear` as its weight
loads: int8 values [out, in] and a float32 scale per output channel, rounded by the core's
`tpu_plugins.quantization.quantize`, so the HF path holds exactly the weights vLLM and SGLang
serve with --quantization int8. On "tpu" the int8 values stay int8 in device memory.

`generate()` on the core engine reads those int8 weights as they are (the loader's int8 path,
the same names as a compressed-tensors checkpoint: `weight` int8 + `weight_scale`), and a plain
forward runs `Int8Linear.forward` op by op. Mixture-of-experts experts, which transformers 5
keeps as fused 3-D parameters rather than `nn.Linear`, stay in the model's dtype on this path.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from transformers.core_model_loading import ConversionOps
from transformers.quantizers import HfQuantizer, register_quantization_config, register_quantizer
from transformers.quantizers.quantizers_utils import get_module_from_name, should_convert_module
from transformers.utils.quantization_config import QuantizationConfigMixin

from tpu_plugins import quantization

METHOD = quantization.HF_METHOD


class Int8Config(QuantizationConfigMixin):
    """int8 weight-only quantization, one scale per output channel, done as weights load."""

    def __init__(self, modules_to_not_convert: list[str] | None = None, **kwargs):
        self.quant_method = METHOD
        self.modules_to_not_convert = modules_to_not_convert


class Int8Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool, dtype=torch.int8):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty((out_features, in_features), dtype=dtype), requires_grad=False)
        self.weight_scale = nn.Parameter(torch.empty(out_features, dtype=torch.float32), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.linear(x, self.weight.to(x.dtype)) * self.weight_scale.to(x.dtype)
        return y if self.bias is None else y + self.bias


class Int8Quantize(ConversionOps):
    """One loaded float weight [out, in] -> its int8 values and scale, rounded by the core."""

    def __init__(self, hf_quantizer):
        self.hf_quantizer = hf_quantizer

    def convert(self, input_dict: dict, full_layer_name: str | None = None, **kwargs) -> dict:
        value = next(iter(input_dict.values()))[0]
        w = value.detach().to("cpu", torch.float32).numpy()
        q = quantization.quantize(w.T)                 # the core's rounding, on [in, out]
        values = torch.from_numpy(np.ascontiguousarray(q.values.T)).to(value.device)
        scale = torch.from_numpy(q.scale).to(value.device)
        return {full_layer_name: values, f"{full_layer_name}_scale": scale}


class Int8Quantizer(HfQuantizer):
    requires_calibration = False

    def param_needs_quantization(self, model, param_name: str, **kwargs) -> bool:
        module, name = get_module_from_name(model, param_name)
        return isinstance(module, Int8Linear) and name == "weight" and not self.pre_quantized

    def _process_model_before_weight_loading(self, model, **kwargs):
        self.modules_to_not_convert = self.get_modules_to_not_convert(
            model, self.quantization_config.modules_to_not_convert, model._keep_in_fp32_modules)
        # Quantized as it loads: the weight is created in the load dtype, then replaced by int8.
        dtype = {} if self.pre_quantized else {"dtype": None}
        for name, module in list(model.named_modules()):
            if isinstance(module, nn.Linear) and should_convert_module(name, self.modules_to_not_convert):
                with torch.device("meta"):
                    model.set_submodule(name, Int8Linear(module.in_features, module.out_features,
                                                         module.bias is not None, **dtype))

    def get_quantize_ops(self):
        return Int8Quantize(self)

    def is_serializable(self, **kwargs) -> bool:
        return True

    @property
    def is_trainable(self) -> bool:
        return False


_REGISTERED = False


def register() -> None:
    """Once per process, when transformers' quantizers load (patches.py), or on first import."""
    global _REGISTERED
    if not _REGISTERED:
        _REGISTERED = True
        register_quantization_config(METHOD)(Int8Config)
        register_quantizer(METHOD)(Int8Quantizer)


register()
