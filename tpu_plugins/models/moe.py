"""The mixture-of-experts layer: top-k routing, then the experts as grouped matmuls.

Every chip routes every token (the router is tiny and replicated), keeps the (token, expert)
pairs whose expert it holds, sorts them by expert, and runs gate, up and down as grouped
matmuls over its own experts and its own slice of each expert's intermediate. Each chip's
output is a partial sum: over its experts (expert axis) and its intermediate slice (model
axis); one all-reduce over both gives every chip the layer's output. No token is dropped, so
the result equals the dense computation whatever the routing.

The grouped matmul:
  * "megablox" (TPU): JAX's Pallas kernel (`jax.experimental.pallas.ops.tpu.megablox.gmm`).
    It visits only the row tiles of non-empty groups, so a chip's cost follows the pairs it
    holds. Rows past the groups are not written (they hold garbage), hence the masks below.
    int8 experts go through XLA's `ragged_dot` instead: megablox takes only bf16/f32 weights.
  * "reference" (elsewhere): the same visiting order in plain JAX, a loop over the (row tile,
    expert) pairs that overlap, with a trip count known only at run time. XLA:CPU lowers
    `ragged_dot` to every expert for every row (32 experts: 43x one dense matmul, measured),
    which made MoE decode on the CPU stand-in several times slower than transformers.
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


def _tile(size: int) -> int:
    """A megablox tile for a K or N dimension: the largest of 512/256/128 that divides it, else the whole."""
    for tile in (512, 256, 128):
        if size % tile == 0:
            return tile
    return size


def _grouped_matmul(rows, w, group_sizes, row_expert, spec: MoeSpec):
    """rows [M, K] sorted by expert, M a multiple of the row tile; w [E, K, N] (or Int8Weight)
    -> [M, N] float32. Rows past the groups are garbage or zero."""
    if spec.implementation == "reference":
        # Small tiles: a pair multiplies a whole tile for one expert's rows. On 2 CPU cores, 32
        # experts, K=512, N=256: 128 rows took 2.5 ms with 16-row tiles (6.9 ms with 128),
        # 2048 rows 8.3 ms with 32-row tiles (one dense matmul of the rows: 0.5 / 2.9 ms).
        return _tile_loop_matmul(rows, w, group_sizes, 16 if rows.shape[0] <= 512 else 32)
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
    raise ValueError(f"unknown MoE implementation {spec.implementation!r}")


def _tile_loop_matmul(rows, w, group_sizes, tile: int):
    """Grouped matmul as a loop over the (row tile, expert) pairs that overlap: expert g's rows
    [start_g, end_g) span tiles start_g // tile .. (end_g - 1) // tile; each pair multiplies one
    tile by one expert and keeps that expert's rows. At most tiles + experts iterations, and
    empty experts cost nothing."""
    M = rows.shape[0]
    quantized = isinstance(w, Int8Weight)
    N = (w.values if quantized else w).shape[-1]
    ends = jnp.cumsum(group_sizes)
    starts = ends - group_sizes
    first_tile = starts // tile
    pairs = jnp.where(group_sizes > 0, (ends - 1) // tile - first_tile + 1, 0)
    pair_ends = jnp.cumsum(pairs)

    def body(i, out):
        g = jnp.searchsorted(pair_ends, i, side="right")            # the expert of pair i
        t = first_tile[g] + i - (pair_ends[g] - pairs[g])            # and its row tile
        x = jax.lax.dynamic_slice_in_dim(rows, t * tile, tile)
        if quantized:
            y = jnp.dot(x, w.values[g].astype(rows.dtype), preferred_element_type=jnp.float32) * w.scale[g]
        else:
            y = jnp.dot(x, w[g], preferred_element_type=jnp.float32)
        row = t * tile + jnp.arange(tile)
        keep = (row >= starts[g]) & (row < ends[g])
        current = jax.lax.dynamic_slice_in_dim(out, t * tile, tile)
        return jax.lax.dynamic_update_slice_in_dim(out, current + jnp.where(keep[:, None], y, 0.0), t * tile, 0)

    return jax.lax.fori_loop(0, pair_ends[-1], body, jnp.zeros((M, N), jnp.float32))


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
