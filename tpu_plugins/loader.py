"""Weights: Hugging Face safetensors -> the decoder's parameter pytree, sharded on the mesh.

Tensors are read one at a time from memory-mapped files, transposed to [in, out], padded for
the head layout (sharding.py), cast, and placed straight onto their devices, so the host
never holds a second full copy of the model. `param_shapes` gives the same tree abstractly
(shapes, dtypes, shardings) for ahead-of-time compilation with no weights at all.
"""

from __future__ import annotations

from tpu_plugins import jax_env  # noqa: F401  (settles JAX's platform before jax is imported)

import re
from collections.abc import Callable, Iterable
from pathlib import Path

import jax
import numpy as np
from jax.sharding import NamedSharding
from tqdm import tqdm

from tpu_plugins.errors import UserError
from tpu_plugins.models.config import ModelConfig
from tpu_plugins.safetensors_io import iterate_tensors
from tpu_plugins.sharding import RULES, HeadLayout

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# HF tensor suffix inside a layer -> our name.
LAYER_NAMES = {
    "self_attn.q_proj.weight": "q", "self_attn.k_proj.weight": "k", "self_attn.v_proj.weight": "v",
    "self_attn.o_proj.weight": "o",
    "self_attn.q_proj.bias": "q_bias", "self_attn.k_proj.bias": "k_bias", "self_attn.v_proj.bias": "v_bias",
    "self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm",
    "mlp.gate_proj.weight": "gate", "mlp.up_proj.weight": "up", "mlp.down_proj.weight": "down",
    "input_layernorm.weight": "input_norm", "post_attention_layernorm.weight": "post_attn_norm",
}
GLOBAL_NAMES = {"model.embed_tokens.weight": "embed", "model.norm.weight": "final_norm", "lm_head.weight": "lm_head"}


def _query_heads(w: np.ndarray, axis: int, cfg: ModelConfig, layout: HeadLayout) -> np.ndarray:
    """Query-head axis (heads * head_dim) -> (groups, q_per_group) zero-padded, flattened back."""
    shape = w.shape[:axis] + (cfg.num_kv_heads, cfg.q_per_kv, cfg.head_dim) + w.shape[axis + 1:]
    w = w.reshape(shape)
    pad = [(0, 0)] * w.ndim
    pad[axis] = (0, layout.groups - cfg.num_kv_heads)
    pad[axis + 1] = (0, layout.q_per_group - cfg.q_per_kv)
    w = np.pad(w, pad)
    return w.reshape(w.shape[:axis] + (layout.num_heads * cfg.head_dim,) + w.shape[axis + 3:])


def _kv_heads(w: np.ndarray, axis: int, cfg: ModelConfig, layout: HeadLayout) -> np.ndarray:
    """KV-head axis -> each head repeated kv_replicas times, zero groups appended, flattened back."""
    shape = w.shape[:axis] + (cfg.num_kv_heads, cfg.head_dim) + w.shape[axis + 1:]
    w = np.repeat(w.reshape(shape), layout.kv_replicas, axis=axis)
    pad = [(0, 0)] * w.ndim
    pad[axis] = (0, layout.num_kv_heads - w.shape[axis])
    w = np.pad(w, pad)
    return w.reshape(w.shape[:axis] + (layout.num_kv_heads * cfg.head_dim,) + w.shape[axis + 2:])


def transform(name: str, w: np.ndarray, cfg: ModelConfig, layout: HeadLayout) -> np.ndarray:
    """HF layout -> ours for one tensor (before the dtype cast)."""
    if name in ("q", "k", "v", "o", "gate", "up", "down", "lm_head"):
        w = w.T
    if name in ("q", "q_bias"):
        w = _query_heads(w, w.ndim - 1, cfg, layout)
    elif name in ("k", "v", "k_bias", "v_bias"):
        w = _kv_heads(w, w.ndim - 1, cfg, layout)
    elif name == "o":
        w = _query_heads(w, 0, cfg, layout)
    elif name in ("embed", "lm_head") and layout.vocab_size != cfg.vocab_size:
        axis = 0 if name == "embed" else 1
        pad = [(0, 0), (0, 0)]
        pad[axis] = (0, layout.vocab_size - cfg.vocab_size)
        w = np.pad(w, pad)
    return w


def param_shapes(cfg: ModelConfig, layout: HeadLayout) -> dict:
    """The parameter tree as {name: shape}; layers as a list of such dicts."""
    D, I, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    H, G = layout.num_heads * hd, layout.num_kv_heads * hd
    layer = {"q": (D, H), "k": (D, G), "v": (D, G), "o": (H, D), "gate": (D, I), "up": (D, I), "down": (I, D),
             "input_norm": (D,), "post_attn_norm": (D,)}
    if cfg.family.qkv_bias:
        layer.update(q_bias=(H,), k_bias=(G,), v_bias=(G,))
    if cfg.family.qk_norm:
        layer.update(q_norm=(hd,), k_norm=(hd,))
    tree = {"embed": (layout.vocab_size, D), "final_norm": (D,), "layers": [dict(layer) for _ in range(cfg.num_layers)]}
    if not cfg.tie_word_embeddings:
        tree["lm_head"] = (D, layout.vocab_size)
    return tree


def abstract_params(cfg: ModelConfig, layout: HeadLayout, dtype, mesh) -> dict:
    """ShapeDtypeStructs with shardings: the model for AOT compilation, no weights read."""
    def leaf(name, shape):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, RULES[name]))

    tree = param_shapes(cfg, layout)
    out = {k: leaf(k, v) for k, v in tree.items() if k != "layers"}
    out["layers"] = [{k: leaf(k, v) for k, v in layer.items()} for layer in tree["layers"]]
    return out


def load_params(folder: Path, cfg: ModelConfig, layout: HeadLayout, dtype, mesh, progress: bool = True,
                tensors: Iterable[tuple[str, Callable[[], np.ndarray]]] | None = None) -> dict:
    """Read, transform and place every weight; checks that nothing is missing or misshapen.

    `tensors` ((HF name, read) pairs) replaces reading `folder`: weights already in memory, such
    as a transformers model's state dict."""
    expected = param_shapes(cfg, layout)
    params: dict = {"layers": [{} for _ in range(cfg.num_layers)]}
    tensors = list(iterate_tensors(Path(folder)) if tensors is None else tensors)
    for hf_name, read in tqdm(tensors, desc="Loading weights", unit="tensor", disable=not progress):
        match = _LAYER.match(hf_name)
        if match:
            index, suffix = int(match.group(1)), match.group(2)
            name = LAYER_NAMES.get(suffix)
            if name is None or index >= cfg.num_layers or name not in expected["layers"][index]:
                continue   # tensors we do not use (e.g. rotary caches some checkpoints carry)
            slot, want = params["layers"][index], expected["layers"][index][name]
        else:
            name = GLOBAL_NAMES.get(hf_name)
            if name is None or name not in expected:
                continue
            slot, want = params, expected[name]
        w = transform(name, read(), cfg, layout)
        if w.shape != tuple(want):
            raise UserError(f"{hf_name} has shape {read().shape}, which does not fit the config "
                            f"(expected {want} after layout); the checkpoint and config.json disagree.")
        slot[name] = jax.device_put(np.asarray(w, dtype=dtype), NamedSharding(mesh, RULES[name]))
    missing = [k for k in expected if k != "layers" and k not in params]
    missing += [f"layers.{i}.{k}" for i, layer in enumerate(expected["layers"]) for k in layer if k not in params["layers"][i]]
    if missing:
        raise UserError(f"The checkpoint {folder} lacks {len(missing)} tensor(s), e.g. {missing[:3]}.")
    return params
