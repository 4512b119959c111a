"""Weights: Hugging Face safetensors -> the decoder's parameter pytree, sharded on the mesh.

Tensors are read one at a time from memory-mapped files, transposed to [in, out], padded for
the head layout (sharding.py), cast (or quantized to int8, quantization.py), and placed
straight onto their devices, so the host never holds a second full copy of the model (a
mixture-of-experts layer's experts are stacked per weight first: one layer's worth).
`param_shapes` gives the same tree abstractly (shapes, dtypes, shardings) for ahead-of-time
compilation with no weights at all.
"""

from __future__ import annotations

from tpu_plugins import jax_env  # noqa: F401  (settles JAX's platform before jax is imported)

import mmap
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
from jax.sharding import NamedSharding
from tqdm import tqdm

from tpu_plugins.errors import UserError
from tpu_plugins.models.config import ModelConfig
from tpu_plugins.quantization import QUANTIZED, Int8Weight, dequantize, quantize, unpack_int32
from tpu_plugins.safetensors_io import iterate_tensors
from tpu_plugins.sharding import RULES, HeadLayout, scale_rule

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# HF tensor suffix inside a layer -> our name.
LAYER_NAMES = {
    "self_attn.q_proj.weight": "q", "self_attn.k_proj.weight": "k", "self_attn.v_proj.weight": "v",
    "self_attn.o_proj.weight": "o",
    "self_attn.q_proj.bias": "q_bias", "self_attn.k_proj.bias": "k_bias", "self_attn.v_proj.bias": "v_bias",
    "self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm",
    "mlp.gate_proj.weight": "gate", "mlp.up_proj.weight": "up", "mlp.down_proj.weight": "down",
    "input_layernorm.weight": "input_norm", "post_attention_layernorm.weight": "post_attn_norm",
    "mlp.gate.weight": "router", "block_sparse_moe.gate.weight": "router",     # Qwen3-MoE, Mixtral
}
GLOBAL_NAMES = {"model.embed_tokens.weight": "embed", "model.norm.weight": "final_norm", "lm_head.weight": "lm_head"}
# One expert's projection in a checkpoint (Qwen3-MoE names, Mixtral's w1/w3/w2) -> our stacked weight.
_EXPERT = re.compile(r"^(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight(_packed|_scale|_shape)?$")
EXPERT_NAMES = {"gate_proj": "experts_gate", "w1": "experts_gate", "up_proj": "experts_up", "w3": "experts_up",
                "down_proj": "experts_down", "w2": "experts_down"}
# transformers 5 keeps a live model's experts fused: gate_up_proj [E, 2I, D], down_proj [E, D, I].
FUSED_EXPERTS = {"mlp.experts.gate_up_proj": ("experts_gate", "experts_up"), "mlp.experts.down_proj": ("experts_down",)}
# compressed-tensors stores a quantized linear as weight (int8) or weight_packed + weight_shape, and weight_scale.
_PARTS = {"": "weight", "_packed": "packed", "_scale": "scale", "_shape": "shape"}
_CT_SUFFIX = re.compile(r"^(.+\.weight)(_packed|_scale|_shape)$")


def _query_heads(w: np.ndarray, axis: int, cfg: ModelConfig, layout: HeadLayout) -> np.ndarray:
    """Query-head axis (heads * head_dim) -> (groups, q_per_group) zero-padded, flattened back."""
    if layout.groups == cfg.num_kv_heads and layout.q_per_group == cfg.q_per_kv:
        return w   # nothing to pad: keep the file view, so each host reads only its shards
    shape = w.shape[:axis] + (cfg.num_kv_heads, cfg.q_per_kv, cfg.head_dim) + w.shape[axis + 1:]
    w = w.reshape(shape)
    pad = [(0, 0)] * w.ndim
    pad[axis] = (0, layout.groups - cfg.num_kv_heads)
    pad[axis + 1] = (0, layout.q_per_group - cfg.q_per_kv)
    w = np.pad(w, pad)
    return w.reshape(w.shape[:axis] + (layout.num_heads * cfg.head_dim,) + w.shape[axis + 3:])


def _kv_heads(w: np.ndarray, axis: int, cfg: ModelConfig, layout: HeadLayout) -> np.ndarray:
    """KV-head axis -> each head repeated kv_replicas times, zero groups appended, flattened back."""
    if layout.kv_replicas == 1 and layout.num_kv_heads == cfg.num_kv_heads:
        return w
    shape = w.shape[:axis] + (cfg.num_kv_heads, cfg.head_dim) + w.shape[axis + 1:]
    w = np.repeat(w.reshape(shape), layout.kv_replicas, axis=axis)
    pad = [(0, 0)] * w.ndim
    pad[axis] = (0, layout.num_kv_heads - w.shape[axis])
    w = np.pad(w, pad)
    return w.reshape(w.shape[:axis] + (layout.num_kv_heads * cfg.head_dim,) + w.shape[axis + 2:])


def transform(name: str, w: np.ndarray, cfg: ModelConfig, layout: HeadLayout) -> np.ndarray:
    """HF layout -> ours for one tensor (before the dtype cast)."""
    if name in ("q", "k", "v", "o", "gate", "up", "down", "lm_head", "router"):
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


def transform_scale(name: str, scale: np.ndarray, cfg: ModelConfig, layout: HeadLayout) -> np.ndarray:
    """A per-output-channel scale [out] laid out like its weight's output axis."""
    if name == "q":
        return _query_heads(scale, 0, cfg, layout)
    if name in ("k", "v"):
        return _kv_heads(scale, 0, cfg, layout)
    return scale


def param_shapes(cfg: ModelConfig, layout: HeadLayout) -> dict:
    """The parameter tree as {name: shape}; layers as a list of such dicts."""
    D, I, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    H, G = layout.num_heads * hd, layout.num_kv_heads * hd
    attention = {"q": (D, H), "k": (D, G), "v": (D, G), "o": (H, D), "input_norm": (D,), "post_attn_norm": (D,)}
    if cfg.family.qkv_bias:
        attention.update(q_bias=(H,), k_bias=(G,), v_bias=(G,))
    if cfg.family.qk_norm:
        attention.update(q_norm=(hd,), k_norm=(hd,))
    dense = {"gate": (D, I), "up": (D, I), "down": (I, D)}
    if cfg.moe is not None:
        E, Im = cfg.moe.num_experts, cfg.moe.intermediate_size
        sparse = {"router": (D, E), "experts_gate": (E, D, Im), "experts_up": (E, D, Im), "experts_down": (E, Im, D)}
    layers = [{**attention, **(sparse if cfg.is_moe_layer(i) else dense)} for i in range(cfg.num_layers)]
    tree = {"embed": (layout.vocab_size, D), "final_norm": (D,), "layers": layers}
    if not cfg.tie_word_embeddings:
        tree["lm_head"] = (D, layout.vocab_size)
    return tree


def abstract_params(cfg: ModelConfig, layout: HeadLayout, dtype, mesh, quantization: str | None = None) -> dict:
    """ShapeDtypeStructs with shardings: the model for AOT compilation, no weights read."""
    def leaf(name, shape):
        if quantization and name in QUANTIZED:
            scale_shape = shape[:-2] + shape[-1:]
            return Int8Weight(jax.ShapeDtypeStruct(shape, np.int8, sharding=NamedSharding(mesh, RULES[name])),
                              jax.ShapeDtypeStruct(scale_shape, np.float32, sharding=NamedSharding(mesh, scale_rule(name))))
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, RULES[name]))

    tree = param_shapes(cfg, layout)
    out = {k: leaf(k, v) for k, v in tree.items() if k != "layers"}
    out["layers"] = [{k: leaf(k, v) for k, v in layer.items()} for layer in tree["layers"]]
    return out


def _split_part(name: str) -> tuple[str, str]:
    """"x.weight_scale" -> ("x.weight", "scale"); a plain tensor name is its own "weight" part."""
    ct = _CT_SUFFIX.match(name)
    return (ct.group(1), _PARTS[ct.group(2)]) if ct else (name, "weight")


def _parse(hf_name: str) -> tuple[int | None, str, int | None, str] | None:
    """HF tensor name -> (layer, our name, expert, part), or None for tensors we do not use.
    part: weight | packed | shape | scale (compressed-tensors pieces) | fused (all experts)."""
    match = _LAYER.match(hf_name)
    if not match:
        base, part = _split_part(hf_name)
        name = GLOBAL_NAMES.get(base)
        return (None, name, None, part) if name else None
    index, suffix = int(match.group(1)), match.group(2)
    if suffix in FUSED_EXPERTS:
        return index, suffix, None, "fused"
    expert = _EXPERT.match(suffix)
    if expert:
        name = EXPERT_NAMES.get(expert.group(2))
        return (index, name, int(expert.group(1)), _PARTS[expert.group(3) or ""]) if name else None
    base, part = _split_part(suffix)
    name = LAYER_NAMES.get(base)
    return (index, name, None, part) if name else None


def _assemble(pieces: dict) -> np.ndarray | Int8Weight | None:
    """One checkpoint weight from its pieces ([out, in] HF layout), or None while some are missing."""
    if "packed" in pieces:
        if "shape" not in pieces or "scale" not in pieces:
            return None
        shape = tuple(int(n) for n in np.asarray(pieces["shape"]).reshape(-1))
        return Int8Weight(unpack_int32(pieces["packed"], shape), np.asarray(pieces["scale"], np.float32).reshape(-1))
    w = pieces.get("weight")
    if w is None:
        return None
    if w.dtype == np.int8:
        if "scale" not in pieces:
            return None
        return Int8Weight(w, np.asarray(pieces["scale"], np.float32).reshape(-1))
    return w


def _stacked(experts: dict, count: int):
    """Every expert's pieces -> one weight [experts, in, out] (int8 when every expert is), or
    None while some expert is incomplete."""
    assembled = [_assemble(experts.get(e, {})) for e in range(count)]
    if any(w is None for w in assembled):
        return None
    if all(isinstance(w, Int8Weight) for w in assembled):
        return Int8Weight(np.stack([w.values.T for w in assembled]), np.stack([w.scale for w in assembled]))
    return np.stack([dequantize(_transposed(w)) if isinstance(w, Int8Weight) else w.T for w in assembled])


def _transposed(w):
    """HF [.., out, in] -> ours [.., in, out], for a float or an int8 weight."""
    if isinstance(w, Int8Weight):
        return Int8Weight(np.swapaxes(w.values, -1, -2), w.scale)
    return np.swapaxes(w, -1, -2)


def _nbytes(pieces: dict) -> int:
    """Bytes of one weight's checkpoint tensors: {expert or None: {part: array}}."""
    return sum(a.nbytes for parts in pieces.values() for a in parts.values())


def _file_view(w: np.ndarray) -> bool:
    """True when `w` still points into a memory-mapped checkpoint file (nothing copied yet)."""
    while isinstance(w, np.ndarray):
        w = w.base
    return isinstance(w.obj if isinstance(w, memoryview) else w, mmap.mmap)


@dataclass
class LoadStats:
    """Checkpoint bytes this host read, against the bytes of the tensors it used."""

    read_bytes: int = 0
    checkpoint_bytes: int = 0

    @property
    def read_fraction(self) -> float:
        return self.read_bytes / max(self.checkpoint_bytes, 1)


class _Placer:
    """Casts or quantizes one finished weight and puts it on its devices.

    Each device's shard is cut from the weight on its own host (`jax.make_array_from_callback`),
    so a weight that is still a view of the memory-mapped file (its layout is ours up to a
    transpose) is read only where this host's devices hold it: on a multi-host slice each host
    reads its own shards. A weight that needed padding, head replication or quantizing was
    materialised whole first."""

    def __init__(self, dtype, mesh, quantization: str | None, stats: LoadStats):
        self.dtype, self.mesh, self.quantization, self.stats = dtype, mesh, quantization, stats

    def __call__(self, name: str, w, want: tuple[int, ...], hf_name: str, source_bytes: int):
        """Place one weight; `source_bytes` is what its checkpoint tensors hold (what this host
        read, unless the weight is still a view of the file and only its shards are read)."""
        self._slice_bytes, self._whole = 0, False
        placed = self._convert_and_place(name, w, want, hf_name)
        self.stats.read_bytes += source_bytes if self._whole else self._slice_bytes
        return placed

    def _convert_and_place(self, name: str, w, want: tuple[int, ...], hf_name: str):
        shape = w.values.shape if isinstance(w, Int8Weight) else w.shape
        if tuple(shape) != tuple(want):
            raise UserError(f"{hf_name} has shape {tuple(shape)} after layout, which does not fit the config "
                            f"(expected {tuple(want)}); the checkpoint and config.json disagree.")
        if isinstance(w, Int8Weight) and name not in QUANTIZED:
            w = dequantize(w)          # a checkpoint that quantized a weight we keep in float (e.g. lm_head)
        elif self.quantization == "int8" and name in QUANTIZED and not isinstance(w, Int8Weight):
            w = quantize(w)
        if isinstance(w, Int8Weight):
            return Int8Weight(self._place(w.values, np.int8, RULES[name]), self._place(w.scale, np.float32, scale_rule(name)))
        return self._place(w, self.dtype, RULES[name])

    def _place(self, w: np.ndarray, dtype, rule) -> jax.Array:
        lazy = _file_view(w)
        shards: dict = {}

        def shard(index):
            part = w[index]
            if lazy:   # replicated shards ask for the same slice once per device: count it once
                shards[tuple((s.start, s.stop, s.step) for s in index)] = part.nbytes
            return np.asarray(part, dtype)

        array = jax.make_array_from_callback(w.shape, NamedSharding(self.mesh, rule), shard)
        self._slice_bytes += sum(shards.values())
        self._whole |= not lazy
        return array


def load_params(folder: Path, cfg: ModelConfig, layout: HeadLayout, dtype, mesh, progress: bool = True,
                tensors: Iterable[tuple[str, Callable[[], np.ndarray]]] | None = None,
                quantization: str | None = None, stats: LoadStats | None = None) -> dict:
    """Read, transform and place every weight; checks that nothing is missing or misshapen.

    `tensors` ((HF name, read) pairs) replaces reading `folder`: weights already in memory, such
    as a transformers model's state dict. `quantization="int8"` quantizes float linear weights
    as they are placed; int8 weights of a compressed-tensors checkpoint are kept as they are.
    `stats`, if given, receives the bytes this host read (see _Placer).
    A weight that arrives in several tensors (a quantized linear's values and scale, one
    expert at a time) is placed once its last piece is read."""
    expected = param_shapes(cfg, layout)
    params: dict = {"layers": [{} for _ in range(cfg.num_layers)]}
    stats = stats if stats is not None else LoadStats()
    place = _Placer(dtype, mesh, quantization, stats)
    pending: dict = {}      # (layer, name) -> {expert or None: {part: array}}
    tensors = list(iterate_tensors(Path(folder)) if tensors is None else tensors)
    for hf_name, read in tqdm(tensors, desc="Loading weights", unit="tensor", disable=not progress):
        parsed = _parse(hf_name)
        if parsed is None:
            continue   # tensors we do not use (e.g. rotary caches some checkpoints carry)
        index, name, expert, part = parsed
        if index is not None and index >= cfg.num_layers:
            continue
        want_tree = expected if index is None else expected["layers"][index]
        slot = params if index is None else params["layers"][index]
        if part == "fused":   # [E, out, in], the outputs of FUSED_EXPERTS[name] one after another
            ours = FUSED_EXPERTS[name]
            fused = np.asarray(read())
            stats.checkpoint_bytes += fused.nbytes
            for our, chunk in zip(ours, np.split(fused, len(ours), axis=1)):
                if our in want_tree:
                    slot[our] = place(our, _transposed(chunk), want_tree[our], hf_name, chunk.nbytes)
            continue
        if name not in want_tree:
            continue
        pieces = pending.setdefault((index, name), {}).setdefault(expert, {})
        pieces[part] = read()
        stats.checkpoint_bytes += pieces[part].nbytes
        if expert is None:
            w = _assemble(pieces)
            if w is None:
                continue
            source = _nbytes(pending.pop((index, name)))
            if isinstance(w, Int8Weight):
                w = Int8Weight(transform(name, w.values, cfg, layout), transform_scale(name, w.scale, cfg, layout))
            else:
                w = transform(name, w, cfg, layout)
            slot[name] = place(name, w, want_tree[name], hf_name, source)
            continue
        w = _stacked(pending[(index, name)], cfg.moe.num_experts)
        if w is not None:
            slot[name] = place(name, w, want_tree[name], hf_name, _nbytes(pending.pop((index, name))))
    missing = [k for k in expected if k != "layers" and k not in params]
    missing += [f"layers.{i}.{k}" for i, layer in enumerate(expected["layers"]) for k in layer if k not in params["layers"][i]]
    if missing:
        raise UserError(f"The checkpoint {folder} lacks {len(missing)} tensor(s), e.g. {missing[:3]}.")
    return params
