"""The attention layer of every model: write this step's K/V into the paged cache, then attend.

Runs per chip under `shard_map` over the mesh's model axis, so each chip works on its own
heads and its own slice of the cache; the kernel (Pallas on TPU, our reference elsewhere)
never sees a sharded array. On TPU the K/V write is a Pallas kernel too (kv_cache_update.py);
elsewhere XLA's scatter.
"""

from __future__ import annotations

from tpu_plugins import jax_env  # noqa: F401  (settles JAX's platform before jax is imported)

import functools
from dataclasses import dataclass

import jax
from jax.sharding import PartitionSpec as P

from tpu_plugins import sharding
from tpu_plugins.kernels import ragged_attention as ra
from tpu_plugins.kernels.kv_cache_update import kv_cache_update

IMPLEMENTATIONS = ("reference", "pallas")


@dataclass(frozen=True)
class AttentionSpec:
    sm_scale: float
    sliding_window: int | None = None
    soft_cap: float | None = None
    implementation: str = "reference"
    block_sizes: ra.BlockSizes | None = None   # Pallas only; None: JAX's tuned blocks for device_kind
    device_kind: str | None = None             # the chip compiled for (jax.Device.device_kind)


def paged_attention(spec: AttentionSpec, mesh, q, k, v, kv_cache, slot_mapping, kv_lens, page_table, cu_q_lens, num_seqs):
    """q [T, H, D], k/v [T, G, D] (heads sharded) -> (out [T, H, D], updated kv_cache)."""

    def local(q, k, v, kv_cache, slot_mapping, kv_lens, page_table, cu_q_lens, num_seqs):
        kwargs = dict(sm_scale=spec.sm_scale, sliding_window=spec.sliding_window, soft_cap=spec.soft_cap)
        if spec.implementation == "pallas":
            kv_cache = kv_cache_update(kv_cache, k, v, slot_mapping)
            out = ra.pallas_ragged_paged_attention(q, kv_cache, kv_lens, page_table, cu_q_lens, num_seqs,
                                                   block_sizes=spec.block_sizes, device_kind=spec.device_kind,
                                                   **kwargs)
        else:
            kv_cache = ra.write_kv(kv_cache, k, v, slot_mapping)
            out = ra.ref_ragged_paged_attention(q, kv_cache, kv_lens, page_table, cu_q_lens, num_seqs, **kwargs)
        return out, kv_cache

    replicated = P()
    fn = jax.shard_map(
        local, mesh=mesh,
        in_specs=(sharding.HEADS, sharding.HEADS, sharding.HEADS, sharding.KV_CACHE,
                  replicated, replicated, replicated, replicated, replicated),
        out_specs=(sharding.HEADS, sharding.KV_CACHE),
        check_vma=False,
    )
    return fn(q, k, v, kv_cache, slot_mapping, kv_lens, page_table, cu_q_lens, num_seqs)
