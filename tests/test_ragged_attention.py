"""Our jittable ragged paged attention against JAX's own reference, and the K/V write."""

import numpy as np
import pytest

from tpu_plugins import jax_env  # noqa: F401
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ref_ragged_paged_attention as jax_reference

from tpu_plugins.kernels.ragged_attention import ref_ragged_paged_attention, static_validate_inputs, write_kv


def make_case(rng, q_lens, kv_lens, *, heads=6, kv_heads=2, head_dim=16, page=4, pages_per_seq=6,
              max_seqs=6, tokens=24, dtype=jnp.float32):
    num_pages = max_seqs * pages_per_seq + 3
    kv = jnp.asarray(rng.normal(size=(num_pages, page, 2 * kv_heads, head_dim)), dtype)
    n = len(q_lens)
    cu = np.zeros(max_seqs + 1, np.int32)
    cu[1:n + 1] = np.cumsum(q_lens)
    cu[n + 1:] = cu[n]
    tables = np.zeros((max_seqs, pages_per_seq), np.int32)
    tables[:n] = rng.permutation(num_pages)[: n * pages_per_seq].reshape(n, pages_per_seq)
    lens = np.zeros(max_seqs, np.int32)
    lens[:n] = kv_lens
    q = jnp.asarray(rng.normal(size=(tokens, heads, head_dim)), dtype)
    return (q, kv, jnp.asarray(lens), jnp.asarray(tables), jnp.asarray(cu), jnp.asarray([n], jnp.int32)), int(cu[n])


CASES = {
    "mixed prefill and decode": ([5, 1, 1, 7], [9, 13, 1, 7]),
    "decode only": ([1, 1, 1, 1, 1], [3, 24, 17, 1, 9]),
    "one long prefill chunk after a cached prefix": ([20], [24]),
    "prefill from scratch": ([8, 12], [8, 12]),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("sliding_window,soft_cap", [(None, None), (5, None), (None, 4.0)])
@pytest.mark.parametrize("pages_per_block,tokens_per_block", [(1, 8), (4, 24), (8, 4)])
def test_matches_jax_reference(name, sliding_window, soft_cap, pages_per_block, tokens_per_block):
    rng = np.random.default_rng(len(name))
    args, real = make_case(rng, *CASES[name])
    kw = dict(sm_scale=0.25, sliding_window=sliding_window, soft_cap=soft_cap)
    ours = ref_ragged_paged_attention(*args, pages_per_block=pages_per_block, tokens_per_block=tokens_per_block, **kw)
    theirs = jax_reference(*args, **kw)
    np.testing.assert_allclose(np.asarray(ours[:real]), np.asarray(theirs), atol=2e-5, rtol=2e-5)
    assert not np.asarray(ours[real:]).any(), "padding rows must be zero"


@pytest.mark.parametrize("heads,kv_heads", [(8, 8), (8, 1), (9, 3)])
def test_gqa_ratios(heads, kv_heads):
    rng = np.random.default_rng(heads * 10 + kv_heads)
    args, real = make_case(rng, [3, 1, 6], [10, 5, 6], heads=heads, kv_heads=kv_heads)
    ours = ref_ragged_paged_attention(*args, sm_scale=0.3)
    np.testing.assert_allclose(np.asarray(ours[:real]), np.asarray(jax_reference(*args, sm_scale=0.3)), atol=2e-5)


def test_write_kv_places_each_token_in_its_slot_and_drops_padding():
    rng = np.random.default_rng(0)
    cache = jnp.zeros((4, 2, 4, 3), jnp.float32)   # 4 pages of 2 slots, 2 KV heads, head_dim 3
    k = jnp.asarray(rng.normal(size=(3, 2, 3)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(3, 2, 3)), jnp.float32)
    out = np.asarray(write_kv(cache, k, v, jnp.asarray([5, 0, -1], jnp.int32)))
    np.testing.assert_array_equal(out[2, 1, 0::2], np.asarray(k[0]))   # slot 5 = page 2, offset 1
    np.testing.assert_array_equal(out[2, 1, 1::2], np.asarray(v[0]))
    np.testing.assert_array_equal(out[0, 0, 0::2], np.asarray(k[1]))
    assert np.count_nonzero(out) == 2 * 2 * 2 * 3   # the padding token (-1) wrote nothing


def test_validation_names_the_problem():
    rng = np.random.default_rng(0)
    (q, kv, lens, tables, cu, n), _ = make_case(rng, [2], [2])
    with pytest.raises(ValueError, match="must be int32"):
        static_validate_inputs(q, kv, lens.astype(jnp.float32), tables, cu, n)
    with pytest.raises(ValueError, match="not a multiple of"):
        static_validate_inputs(q[:, :5], kv, lens, tables, cu, n)
    with pytest.raises(ValueError, match="sliding_window must be positive"):
        static_validate_inputs(q, kv, lens, tables, cu, n, sliding_window=0)
