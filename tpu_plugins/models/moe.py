"""The mixture-of-experts layer: top-k routing, then the experts as grouped matmuls.

Every chip routes every token (the router is tiny and replicated), keeps the (token, expert)
pairs whose expert it holds, sorts them by expert, and runs gate, up and down as grouped
matmuls over its own experts and its own slice of each expert's intermediate. Each chip's
output is a partial sum: over its experts (expert axis) and its intermediate slice (model
axis); one all-reduce over both gives every chip the layer's output. No token is dropped, so
the result equals the dense computation whatever the routing.

The grouped matmul:
  * "megablox": JAX's Pallas TPU kernel (`jax.experimental.pallas.ops.tpu.megablox.gmm`).
    It visits only the row tiles of non-empty groups, so a chip's cost follows the pairs it
    holds. Rows past the groups are not written (they hold garbage), hence the masks below.
  * "reference": `jax.lax.ragged_dot`, XLA's own grouped matmul, used off TPU and for int8
    experts (megablox takes only bf16/f32 weights; ragged_dot reads the int8 weights and
    converts them in the dot's operand fusion, which keeps int8's bandwidth saving).
On a CPU the Pallas kernel runs in TPU interpret mode (`interpret`), which is how the two are
tested against each other.
"""

from __future__ import annotations

from tpu_plugins import jax_env  # noqa: F401  (settles JAX's platform before jax is imported)

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from tpu_plugins.mesh import EXPERT
from tpu_plugins.quantization import Int8Weight
from tpu_plugins.sharding import RULES, TP, scale_rule

IMPLEMENTATIONS = ("reference", "megablox")
EXPERT_WEIGHTS = ("experts_gate", "experts_up", "experts_down")


@dataclass(frozen=True)
class MoeSpec:
    num_experts: int
    top_k: int
    norm_topk_prob: bool
    implementation: str = "reference"
    interpret: bool = False          # megablox in TPU interpret mode (CPU tests)


def route(x, router, spec: MoeSpec):
    """x [T, D], router [D, E] -> (weights f32 [T, k], expert ids int32 [T, k]): softmax over
    every expert in float32, the k largest, renormalised if the model asks for it."""
    logits = jnp.dot(x, router, preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    weights, ids = jax.lax.top_k(probs, spec.top_k)
    if spec.norm_topk_prob:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, ids.astype(jnp.int32)


def _tile(size: int, largest: int = 512) -> int:
    """A tile for a kernel dimension: the largest of 512/256/128 that divides it, else the whole."""
    for tile in (largest, 256, 128):
        if tile <= largest and size % tile == 0:
            return tile
    return size


def _grouped_matmul(rows, w, group_sizes, row_expert, spec: MoeSpec):
    """rows [M, K] sorted by expert, w [E, K, N] (or Int8Weight) -> [M, N] float32."""
    if isinstance(w, Int8Weight):
        out = jax.lax.ragged_dot(rows, w.values.astype(rows.dtype), group_sizes,
                                 preferred_element_type=jnp.float32)
        return out * w.scale[row_expert]
    if spec.implementation == "megablox":
        from jax.experimental.pallas import tpu as pltpu
        from jax.experimental.pallas.ops.tpu.megablox import gmm

        m, k = rows.shape
        tiling = (min(128, m), _tile(k), _tile(w.shape[2]))
        return gmm(rows, w, group_sizes, preferred_element_type=jnp.float32, tiling=tiling,
                   interpret=pltpu.InterpretParams() if spec.interpret else False)
    return jax.lax.ragged_dot(rows, w, group_sizes, preferred_element_type=jnp.float32)


def _row_tile(pairs: int) -> int:
    """Rows are padded to whole megablox m-tiles: 128, or a power of two for small batches."""
    return 128 if pairs >= 128 else max(16, 1 << (pairs - 1).bit_length())   # 16: bf16 sublane packing


def experts(x, layer, spec: MoeSpec, mesh, act):
    """x [T, D] (replicated) -> the MoE layer's output [T, D] in x's dtype."""
    k = spec.top_k

    def local(x, router, gate, up, down):
        T, D = x.shape
        values = gate.values if isinstance(gate, Int8Weight) else gate
        local_experts = values.shape[0]
        weights, ids = route(x, router, spec)
        first = jax.lax.axis_index(EXPERT) * local_experts
        local_ids = (ids - first).reshape(-1)                                  # [T*k]
        held = (local_ids >= 0) & (local_ids < local_experts)
        key = jnp.where(held, local_ids, local_experts)                        # not ours: sorted last
        order = jnp.argsort(key, stable=True)
        group_sizes = jnp.bincount(key, length=local_experts + 1)[:local_experts].astype(jnp.int32)
        tile = _row_tile(T * k)
        rows_total = -(-T * k // tile) * tile
        token_of_row = jnp.zeros(rows_total, jnp.int32).at[: T * k].set((order // k).astype(jnp.int32))
        row_key = jnp.full(rows_total, local_experts, jnp.int32).at[: T * k].set(key[order])
        row_weight = jnp.zeros(rows_total, jnp.float32).at[: T * k].set(weights.reshape(-1)[order])
        row_expert = jnp.minimum(row_key, local_experts - 1)
        rows = x[token_of_row]
        g = _grouped_matmul(rows, gate, group_sizes, row_expert, spec)
        u = _grouped_matmul(rows, up, group_sizes, row_expert, spec)
        hidden = (act(g) * u).astype(x.dtype)
        out = _grouped_matmul(hidden, down, group_sizes, row_expert, spec)
        # Rows of other chips' experts and padding rows hold garbage in megablox: select, never multiply.
        out = jnp.where((row_key < local_experts)[:, None], out * row_weight[:, None], 0.0)
        combined = jnp.zeros((T, D), jnp.float32).at[token_of_row].add(out)
        return jax.lax.psum(combined, TP).astype(x.dtype)

    def spec_of(name):
        w = layer[name]
        return Int8Weight(RULES[name], scale_rule(name)) if isinstance(w, Int8Weight) else RULES[name]

    fn = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), *(spec_of(n) for n in EXPERT_WEIGHTS)),
                       out_specs=P(), check_vma=False)
    return fn(x, layer["router"], *(layer[n] for n in EXPERT_WEIGHTS))
