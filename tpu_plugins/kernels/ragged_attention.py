"""Ragged paged attention: one call for any mix of prefill chunks and decodes.

Signature and cache layout follow JAX's Pallas kernel
(`jax.experimental.pallas.ops.tpu.ragged_paged_attention`):

    q           [max_num_batched_tokens, num_q_heads, head_dim]  all sequences' new tokens, flat
    kv_pages    [total_num_pages, page_size, 2 * num_kv_heads, head_dim]  K and V interleaved on axis 2
    kv_lens     i32[max_num_seqs]          KV length of each sequence after this step's tokens
    page_indices i32[max_num_seqs, pages_per_seq]  each sequence's page table
    cu_q_lens   i32[max_num_seqs + 1]      cumulative query lengths (sequence i owns q[cu[i]:cu[i+1]])
    num_seqs    i32[1]                     how many rows above are real

A query at offset j of sequence i sits at position kv_lens[i] - q_len_i + j and sees every
key at a position <= its own (and, with a sliding window W, > its own - W).

`ref_ragged_paged_attention` is ours, not JAX's: JAX's reference loops over sequences in
Python (it cannot be jitted with a dynamic batch), while ours is jittable and is the
production path on CPU (see its docstring for how it keeps prefill cheap).
"""

from __future__ import annotations

from tpu_plugins import jax_env  # noqa: F401  (settles JAX's platform before jax is imported)

import functools

import jax
import jax.numpy as jnp

MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
REF_KV_TOKENS_PER_BLOCK = 128   # cached tokens per step of the reference's context walk
REF_TOKENS_PER_BLOCK = 16


def static_validate_inputs(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, *,
                           sliding_window=None, soft_cap=None) -> None:
    """Shape and dtype checks that need no device values; raise ValueError naming the problem."""
    if q.ndim != 3 or kv_pages.ndim != 4:
        raise ValueError(f"q must be [tokens, heads, head_dim] and kv_pages 4-D; got {q.shape} and {kv_pages.shape}.")
    _, num_q_heads, head_dim = q.shape
    _, _, combined, head_dim_kv = kv_pages.shape
    if combined % 2:
        raise ValueError(f"kv_pages axis 2 holds K and V interleaved and must be even; got {combined}.")
    if head_dim != head_dim_kv:
        raise ValueError(f"q head_dim {head_dim} differs from the cache's {head_dim_kv}.")
    if num_q_heads % (combined // 2):
        raise ValueError(f"{num_q_heads} query heads are not a multiple of {combined // 2} KV heads.")
    max_num_seqs = page_indices.shape[0]
    if kv_lens.shape != (max_num_seqs,) or cu_q_lens.shape != (max_num_seqs + 1,) or num_seqs.shape != (1,):
        raise ValueError(f"kv_lens {kv_lens.shape}, cu_q_lens {cu_q_lens.shape} and num_seqs {num_seqs.shape} "
                         f"must be ({max_num_seqs},), ({max_num_seqs + 1},) and (1,).")
    for name, arr in (("kv_lens", kv_lens), ("page_indices", page_indices), ("cu_q_lens", cu_q_lens), ("num_seqs", num_seqs)):
        if arr.dtype != jnp.int32:
            raise ValueError(f"{name} must be int32, got {arr.dtype}.")
    if sliding_window is not None and sliding_window <= 0:
        raise ValueError(f"sliding_window must be positive, got {sliding_window}.")
    if soft_cap is not None and soft_cap == 0.0:
        raise ValueError("soft_cap must not be 0.0 (use None to disable it).")


def _online_merge(state, scores, values, allowed):
    """Fold one block of scores [t, g, q, k] and values [t, k, g, d] into (max, sum, acc)."""
    m, l, acc = state
    scores = jnp.where(allowed, scores, MASK_VALUE)
    m_new = jnp.maximum(m, scores.max(axis=-1))
    p = jnp.exp(scores - m_new[..., None])
    correction = jnp.exp(m - m_new)
    return (m_new, l * correction + p.sum(axis=-1),
            acc * correction[..., None] + jnp.einsum("tgqk,tkgd->tgqd", p, values))


@functools.partial(jax.jit, static_argnames=("sm_scale", "sliding_window", "soft_cap", "pages_per_block",
                                             "tokens_per_block"))
def ref_ragged_paged_attention(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, *,
                               sm_scale: float = 1.0, sliding_window: int | None = None,
                               soft_cap: float | None = None, pages_per_block: int | None = None,
                               tokens_per_block: int = REF_TOKENS_PER_BLOCK):
    """Jittable reference in two parts, merged by an online softmax:

    * the step's own tokens attend to each other densely (their K/V are read back from their
      slots once): prefill costs T x T scores and no per-key gathers;
    * each token attends to its sequence's earlier context in the cache, walked in blocks of
      pages; tokens go in blocks of `tokens_per_block`, and each block walks only as far as its
      own longest context, so a fresh prefill does not pay for the decodes beside it.
    """
    static_validate_inputs(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs,
                           sliding_window=sliding_window, soft_cap=soft_cap)
    num_tokens, num_q_heads, head_dim = q.shape
    num_pages, page_size, combined, _ = kv_pages.shape
    num_kv_heads = combined // 2
    q_per_kv = num_q_heads // num_kv_heads
    max_num_seqs, pages_per_seq = page_indices.shape
    if pages_per_block is None:   # the same tokens per step whatever the page size (SGLang's is 1)
        pages_per_block = max(1, REF_KV_TOKENS_PER_BLOCK // page_size)
    block = min(pages_per_block, pages_per_seq)
    if pages_per_seq % block:
        page_indices = jnp.pad(page_indices, ((0, 0), (0, block - pages_per_seq % block)))
    block_tokens = block * page_size
    tb = tokens_per_block if num_tokens % tokens_per_block == 0 else num_tokens

    # Which sequence each token belongs to, its position, and its sequence's earlier context.
    t = jnp.arange(num_tokens, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(cu_q_lens[1:], t, side="right"), 0, max_num_seqs - 1).astype(jnp.int32)
    valid = t < cu_q_lens[num_seqs[0]]
    q_len = cu_q_lens[seq + 1] - cu_q_lens[seq]
    context = jnp.where(valid, kv_lens[seq] - q_len, 0)
    q_pos = context + (t - cu_q_lens[seq])

    def capped(s):
        return soft_cap * jnp.tanh(s / soft_cap) if soft_cap is not None else s

    def in_window(k_pos, q_pos):
        return k_pos > q_pos - sliding_window if sliding_window is not None else True

    qg = (q.astype(jnp.float32) * sm_scale).reshape(num_tokens, num_kv_heads, q_per_kv, head_dim)
    flat = kv_pages.reshape(num_pages * page_size, combined, head_dim)

    # Part 1: the step's tokens among themselves.
    slot = page_indices[seq, q_pos // page_size] * page_size + q_pos % page_size
    new = flat[slot].astype(jnp.float32)                                                # [T, C, D]
    k_new, v_new = new[:, 0::2], new[:, 1::2]
    scores = capped(jnp.einsum("tgqd,ugd->tgqu", qg, k_new))
    allowed = (seq[None, :] == seq[:, None]) & (q_pos[None, :] <= q_pos[:, None]) & valid[None, :]
    allowed &= in_window(q_pos[None, :], q_pos[:, None])
    init = (jnp.full((num_tokens, num_kv_heads, q_per_kv), MASK_VALUE, jnp.float32),
            jnp.zeros((num_tokens, num_kv_heads, q_per_kv), jnp.float32),
            jnp.zeros((num_tokens, num_kv_heads, q_per_kv, head_dim), jnp.float32))
    state = _dense_merge(init, scores, v_new, allowed)

    # Part 2: each token block against its sequences' cached context.
    offsets = jnp.arange(block_tokens, dtype=jnp.int32)

    def token_block(args):
        qb, seqb, posb, ctxb, (m, l, acc) = args
        first = 0 if sliding_window is None else jnp.maximum(jnp.min(posb) - sliding_window + 1, 0) // block_tokens
        last = (jnp.max(ctxb) + block_tokens - 1) // block_tokens

        def body(i, carry):
            pages = jax.lax.dynamic_slice_in_dim(page_indices, i * block, block, axis=1)[seqb]   # [tb, block]
            kv = kv_pages[pages].reshape(tb, block_tokens, combined, head_dim).astype(jnp.float32)
            k_pos = i * block_tokens + offsets
            ok = (k_pos[None, :] < ctxb[:, None]) & in_window(k_pos[None, :], posb[:, None])
            s = capped(jnp.einsum("tgqd,tkgd->tgqk", qb, kv[:, :, 0::2]))
            return _online_merge(carry, s, kv[:, :, 1::2], ok[:, None, None, :])

        return jax.lax.fori_loop(first, jnp.maximum(first, last), body, (m, l, acc))

    split = lambda x: x.reshape(num_tokens // tb, tb, *x.shape[1:])  # noqa: E731
    state = jax.lax.map(token_block, (split(qg), split(seq), split(q_pos), split(context), jax.tree.map(split, state)))
    _, l, acc = jax.tree.map(lambda x: x.reshape(num_tokens, *x.shape[2:]), state)
    out = acc / jnp.where(l == 0, 1.0, l)[..., None]
    out = jnp.where(valid[:, None, None, None], out, 0.0)
    return out.reshape(num_tokens, num_q_heads, head_dim).astype(q.dtype)


def _dense_merge(state, scores, values, allowed):
    """Part 1's merge: scores [t, g, q, u] against the step's own values [u, g, d]."""
    m, l, acc = state
    scores = jnp.where(allowed[:, None, None, :], scores, MASK_VALUE)
    m_new = jnp.maximum(m, scores.max(axis=-1))
    p = jnp.exp(scores - m_new[..., None])
    correction = jnp.exp(m - m_new)
    return (m_new, l * correction + p.sum(axis=-1),
            acc * correction[..., None] + jnp.einsum("tgqu,ugd->tgqd", p, values))


def write_kv(kv_pages, k, v, slot_mapping):
    """Scatter this step's K and V ([tokens, kv_heads, head_dim]) into their cache slots.

    slot = page * page_size + offset; a slot outside the cache (padding tokens use -1 or
    the pool size) is dropped.
    """
    num_pages, page_size, combined, head_dim = kv_pages.shape
    kv = jnp.stack([k, v], axis=2).reshape(k.shape[0], combined, head_dim).astype(kv_pages.dtype)
    flat = kv_pages.reshape(num_pages * page_size, combined, head_dim)
    slots = jnp.where(slot_mapping < 0, num_pages * page_size, slot_mapping)
    return flat.at[slots].set(kv, mode="drop").reshape(kv_pages.shape)


def tuned_block_sizes(device_kind: str, q_dtype, kv_dtype, num_q_heads: int, num_kv_heads: int, head_dim: int,
                      page_size: int, max_num_batched_tokens: int, pages_per_seq: int) -> "BlockSizes":
    """JAX's tuned (kv pages, queries) per block for a chip named by its device kind.

    JAX's own lookup reads `jax.devices()[0]`, which on a CPU host compiling ahead of time for
    a TPU topology is the CPU; here the chip comes from the caller (the mesh's devices), so AOT
    compiles the blocks the real chip would run. Defaults as JAX's: (128, 32), v4 (32, 32).
    """
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import tuned_block_sizes as table

    key = table.simplify_key((q_dtype, kv_dtype, num_q_heads, num_kv_heads, head_dim, page_size,
                              max_num_batched_tokens, pages_per_seq))
    name = " ".join(device_kind.split()[:2])
    kv_block, q_block = (32, 32) if name == "TPU v4" else table.TUNED_BLOCK_SIZES.get(name, {}).get(key, (128, 32))
    return BlockSizes(min(pages_per_seq, kv_block), min(max_num_batched_tokens, q_block))


def pallas_ragged_paged_attention(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, *,
                                  sm_scale: float = 1.0, sliding_window: int | None = None,
                                  soft_cap: float | None = None, block_sizes: "BlockSizes | None" = None,
                                  device_kind: str | None = None):
    """JAX's Pallas TPU kernel. Block sizes: the caller's, else JAX's tuned ones for `device_kind`
    (the target chip, which AOT compiling on a CPU host cannot read from jax.devices())."""
    from jax.experimental.pallas.ops.tpu import ragged_paged_attention as rpa

    if block_sizes is None:
        if device_kind is None:
            raise ValueError("pallas_ragged_paged_attention needs block_sizes or the target's device_kind.")
        block_sizes = tuned_block_sizes(device_kind, q.dtype, kv_pages.dtype, q.shape[1], kv_pages.shape[2] // 2,
                                        q.shape[2], kv_pages.shape[1], q.shape[0], page_indices.shape[1])
    return rpa.ragged_paged_attention(
        q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs,
        sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap,
        num_kv_pages_per_block=min(block_sizes.kv_pages_per_block, page_indices.shape[1]),
        num_queries_per_block=block_sizes.queries_per_block,
        vmem_limit_bytes=block_sizes.vmem_limit_bytes,
    )


from dataclasses import dataclass  # noqa: E402


@dataclass(frozen=True)
class BlockSizes:
    kv_pages_per_block: int = 16
    queries_per_block: int = 32
    vmem_limit_bytes: int = 64 * 1024 * 1024
