"""int8 weight-only quantization, one scale per output channel.

A quantized weight is an `Int8Weight`: int8 values stored like the weight ([in, out], experts
[expert, in, out]) and a float32 scale per output column ([out], experts [expert, out]), so
w ~= values * scale. Activations stay in the model's dtype: the matmul reads int8 from memory
(half of bf16's bytes, which is what decode is bound by), converts it in the dot's operand
fusion and applies the scale to the output, where it is one multiply per column.

Where weights come from:
  * `quantize` turns a float checkpoint into int8 at load time (--quantization int8);
  * compressed-tensors checkpoints already hold int8 values and scales (`weight` int8, or
    `weight_packed` int32 with 4 values per word) plus `weight_scale`; `unpack_int32` and the
    loader read those as they are, without a float round trip.
Embeddings, the LM head, norms and the MoE router stay in the model's dtype, as in vLLM's
int8 schemes: they are a small share of the bytes and the most sensitive to rounding.
"""

from __future__ import annotations

from tpu_plugins import jax_env  # noqa: F401  (settles JAX's platform before jax is imported)

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tpu_plugins.errors import UserError

METHODS = ("int8",)
# The quant_method a transformers model quantized by hf_tpu's Int8Config records in its config:
# the same tensors as a compressed-tensors checkpoint (weight int8 + weight_scale).
HF_METHOD = "tpu_int8"
QUANTIZED = frozenset({"q", "k", "v", "o", "gate", "up", "down", "experts_gate", "experts_up", "experts_down"})


class Int8Weight(NamedTuple):
    values: jax.Array | np.ndarray    # int8, the weight's shape
    scale: jax.Array | np.ndarray     # float32, the weight's shape without the input axis


def check_method(method: str | None) -> str | None:
    if method in (None, "", "none"):
        return None
    if method not in METHODS:
        raise UserError(f"quantization {method!r} is not supported; supported: {', '.join(METHODS)} "
                        "(int8 weights, one scale per output channel), or none.")
    return method


class FrameworkInt8Method:
    """What vLLM's and SGLang's QuantizationConfig interfaces ask of "int8" (the same methods in
    both): a method the core quantizes at load, for bf16/f32 activations, with no config file in
    the checkpoint and no layers of the framework's own (the core runs the model). Each adapter
    mixes this into its framework's base class."""

    def get_name(self) -> str:
        return "int8"

    def get_supported_act_dtypes(self) -> list:
        import torch

        return [torch.bfloat16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 0

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []

    @classmethod
    def from_config(cls, config: dict):
        return cls()

    def get_quant_method(self, layer, prefix: str):
        return None

    def get_scaled_act_names(self) -> list[str]:
        return []


def quantize(w: np.ndarray) -> Int8Weight:
    """Symmetric per-output-channel int8 of a weight stored [..., in, out]: each column's
    largest magnitude maps to 127. All-zero columns (padding heads) get scale 0."""
    w = np.asarray(w, np.float32)
    absmax = np.abs(w).max(axis=-2)
    scale = absmax / 127.0
    safe = np.where(scale > 0, scale, 1.0)
    values = np.clip(np.rint(w / np.expand_dims(safe, -2)), -127, 127).astype(np.int8)
    return Int8Weight(values, scale.astype(np.float32))


def dequantize(w: Int8Weight) -> np.ndarray:
    return np.asarray(w.values, np.float32) * np.expand_dims(np.asarray(w.scale, np.float32), -2)


def unpack_int32(packed: np.ndarray, shape: tuple[int, int], num_bits: int = 8) -> np.ndarray:
    """compressed-tensors' pack-quantized layout -> signed ints: each int32 holds 32/num_bits
    values along the input axis, lowest bits first, stored offset by 2**(num_bits-1)."""
    per_word = 32 // num_bits
    words = np.asarray(packed).astype(np.uint32)
    shifts = (np.arange(per_word, dtype=np.uint32) * num_bits)
    values = (words[..., None] >> shifts) & np.uint32((1 << num_bits) - 1)
    values = values.reshape(*words.shape[:-1], words.shape[-1] * per_word)[..., : shape[-1]]
    return (values.astype(np.int32) - (1 << (num_bits - 1))).astype(np.int8)


def matmul(x, w):
    """x @ w for a plain or an int8 weight (2-D), in x's dtype."""
    if isinstance(w, Int8Weight):
        y = jnp.dot(x, w.values.astype(x.dtype), preferred_element_type=jnp.float32)
        return (y * w.scale).astype(x.dtype)
    return x @ w


def checkpoint_method(hf_config: dict) -> str | None:
    """The quantization a checkpoint's config.json declares, as the loader serves it: "int8" for
    compressed-tensors int8 weights with one scale per output channel, None for a float
    checkpoint; any other scheme is refused with what is supported."""
    qc = hf_config.get("quantization_config") or hf_config.get("compression_config")
    if not qc:
        return None
    method = qc.get("quant_method", "?")
    if method == HF_METHOD:
        return "int8"
    supported = ("supported: float checkpoints (optionally quantized at load with int8) and compressed-tensors "
                 "checkpoints with int8 weights, symmetric, one scale per output channel (W8A16, W8A8)")
    if method != "compressed-tensors":
        raise UserError(f"This checkpoint is quantized with {method!r}, which tpu-plugins cannot serve; {supported}.")
    formats = qc.get("format")
    for name, group in (qc.get("config_groups") or {}).items():
        w = group.get("weights") or {}
        fmt = group.get("format") or formats
        ok = (w.get("num_bits") == 8 and w.get("type") == "int" and w.get("symmetric", True)
              and w.get("strategy") == "channel" and not w.get("dynamic", False)
              and fmt in ("pack-quantized", "int-quantized", "naive-quantized"))
        if not ok:
            raise UserError(f"compressed-tensors group {name!r} has weights {w} in format {fmt!r}; {supported}.")
    return "int8"
