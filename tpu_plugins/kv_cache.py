"""The paged KV cache: one page pool per layer, and a page allocator for schedulers that want one.

Layout per layer: [num_pages, page_size, 2 * kv_heads, head_dim], K and V interleaved on
axis 2 (the layout of JAX's ragged paged attention kernel), heads split over the mesh's
model axis. Which pages a sequence owns is the scheduler's business: vLLM and SGLang hand us
block ids and token slots; `PageAllocator` serves our own offline loop.
"""

from __future__ import annotations

from tpu_plugins import jax_env  # noqa: F401  (settles JAX's platform before jax is imported)

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from tpu_plugins.errors import UserError
from tpu_plugins.sharding import KV_CACHE


@dataclass(frozen=True)
class KVCacheSpec:
    num_layers: int
    num_pages: int
    page_size: int
    num_kv_heads: int     # as laid out (padded or replicated for TP)
    head_dim: int
    dtype: np.dtype

    @property
    def page_shape(self) -> tuple[int, int, int]:
        return (self.page_size, 2 * self.num_kv_heads, self.head_dim)

    @property
    def bytes_per_page(self) -> int:
        """All layers' bytes for one page, over the whole mesh."""
        return self.num_layers * int(np.prod(self.page_shape)) * np.dtype(self.dtype).itemsize

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size


def pages_for_budget(budget_bytes: int, bytes_per_page: int) -> int:
    return max(0, budget_bytes // bytes_per_page)


def allocate(spec: KVCacheSpec, mesh) -> list[jax.Array]:
    sharding = NamedSharding(mesh, KV_CACHE)
    shape = (spec.num_pages, *spec.page_shape)
    # One program makes every layer's pool, each created directly in its sharded place.
    zeros = jax.jit(lambda: [jnp.zeros(shape, spec.dtype) for _ in range(spec.num_layers)],
                    out_shardings=[sharding] * spec.num_layers)
    return zeros()


def abstract(spec: KVCacheSpec, mesh) -> list[jax.ShapeDtypeStruct]:
    shape = (spec.num_pages, *spec.page_shape)
    return [jax.ShapeDtypeStruct(shape, spec.dtype, sharding=NamedSharding(mesh, KV_CACHE))
            for _ in range(spec.num_layers)]


class PageAllocator:
    """A free list of page ids. Page 0 is never handed out: padding rows point at it."""

    def __init__(self, num_pages: int):
        if num_pages < 2:
            raise UserError(f"The KV cache has {num_pages} page(s); at least 2 are needed. Give it more memory.")
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, 0, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise MemoryError(f"asked for {n} KV pages, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def free(self, pages: list[int]) -> None:
        self._free.extend(reversed(pages))
