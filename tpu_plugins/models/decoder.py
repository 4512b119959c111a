"""The decoder shared by Llama, Mistral, Qwen2, Qwen3, Mixtral and Qwen3-MoE, over a ragged token batch.

Parameters are a pytree of arrays stored [in, out] (see loader.py for the names); a linear
weight may be an int8 `Int8Weight` (quantization.py). One call runs every layer for a flat
batch of tokens from many sequences, writes their K/V into the paged cache and returns logits
only for the rows in `logits_indices`. A layer with a `router` is a mixture-of-experts layer
(moe.py); the others have a dense SwiGLU MLP.
"""

from __future__ import annotations

from tpu_plugins import jax_env  # noqa: F401  (settles JAX's platform before jax is imported)

import jax
import jax.numpy as jnp

from tpu_plugins.models import attention, moe as moe_layer
from tpu_plugins.models.config import ModelConfig
from tpu_plugins.models.rope import apply_rope
from tpu_plugins.quantization import matmul
from tpu_plugins.sharding import HeadLayout

ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
}


def rms_norm(x, weight, eps):
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return weight * xf.astype(x.dtype)


def _project(x, w, b=None):
    y = matmul(x, w)
    return y if b is None else y + b


def forward(params, kv_caches, batch, *, cfg: ModelConfig, layout: HeadLayout, attn: attention.AttentionSpec,
            mesh, inv_freq, moe: moe_layer.MoeSpec | None = None, all_logits: bool = False):
    """Returns (logits f32 [len(logits_indices), padded vocab], new kv_caches), and with
    `all_logits` also every token's logits [tokens, padded vocab] (for prompt log-probabilities)."""
    act = ACTIVATIONS[cfg.hf.get("hidden_act", "silu")]
    T = batch["token_ids"].shape[0]
    hd = cfg.head_dim
    x = params["embed"][batch["token_ids"]]
    new_caches = []
    for layer, cache in zip(params["layers"], kv_caches):
        h = rms_norm(x, layer["input_norm"], cfg.rms_norm_eps)
        q = _project(h, layer["q"], layer.get("q_bias")).reshape(T, layout.num_heads, hd)
        k = _project(h, layer["k"], layer.get("k_bias")).reshape(T, layout.num_kv_heads, hd)
        v = _project(h, layer["v"], layer.get("v_bias")).reshape(T, layout.num_kv_heads, hd)
        if "q_norm" in layer:
            q = rms_norm(q, layer["q_norm"], cfg.rms_norm_eps)
            k = rms_norm(k, layer["k_norm"], cfg.rms_norm_eps)
        q = apply_rope(q, batch["positions"], inv_freq)
        k = apply_rope(k, batch["positions"], inv_freq)
        out, cache = attention.paged_attention(
            attn, mesh, q, k, v, cache, batch["slot_mapping"], batch["kv_lens"], batch["page_table"],
            batch["cu_q_lens"], batch["num_seqs"])
        new_caches.append(cache)
        x = x + matmul(out.reshape(T, layout.num_heads * hd), layer["o"])
        h = rms_norm(x, layer["post_attn_norm"], cfg.rms_norm_eps)
        if "router" in layer:
            x = x + moe_layer.experts(h, layer, moe, mesh, act)
        else:
            x = x + matmul(act(matmul(h, layer["gate"])) * matmul(h, layer["up"]), layer["down"])
    if all_logits:
        token_logits = _logits(params, x, cfg, layout)
        return token_logits[batch["logits_indices"]], token_logits, new_caches
    return _logits(params, x[batch["logits_indices"]], cfg, layout), new_caches


def _logits(params, x, cfg: ModelConfig, layout: HeadLayout):
    x = rms_norm(x, params["final_norm"], cfg.rms_norm_eps)
    head = params["lm_head"] if "lm_head" in params else params["embed"].T
    logits = jnp.dot(x, head, preferred_element_type=jnp.float32)
    if cfg.final_logit_softcap:
        logits = cfg.final_logit_softcap * jnp.tanh(logits / cfg.final_logit_softcap)
    if layout.vocab_size != cfg.vocab_size:
        logits = jnp.where(jnp.arange(layout.vocab_size) < cfg.vocab_size, logits, -jnp.inf)
    return logits
