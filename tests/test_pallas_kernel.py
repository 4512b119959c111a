"""JAX's Pallas TPU ragged paged attention kernel, run in TPU interpret mode on the CPU, against
our reference; and the engine end to end with that kernel. See kernels/interpret_compat.py for
the two interpreter defects of JAX 0.10.2 that this needs worked around."""

import numpy as np
import pytest
from conftest import save_random_model
from test_ragged_attention import make_case

from tpu_plugins import jax_env  # noqa: F401
import jax.numpy as jnp

from tpu_plugins.engine import Engine, EngineConfig
from tpu_plugins.kernels.interpret_compat import tpu_interpret_with_ref_reshapes
from tpu_plugins.kernels.ragged_attention import BlockSizes, pallas_ragged_paged_attention, ref_ragged_paged_attention
from tpu_plugins.offline import GenerationParams, OfflineGenerator


@pytest.mark.parametrize("case", [
    dict(q_lens=[5, 1, 1, 7], kv_lens=[20, 33, 1, 7]),
    dict(q_lens=[1, 1, 1], kv_lens=[40, 17, 64], sliding_window=9),
    dict(q_lens=[16, 3], kv_lens=[16, 50], soft_cap=5.0),
])
def test_kernel_in_interpret_mode_matches_reference(case):
    case = dict(case)
    kw = dict(sm_scale=0.1, sliding_window=case.pop("sliding_window", None), soft_cap=case.pop("soft_cap", None))
    rng = np.random.default_rng(7)
    args, real = make_case(rng, case["q_lens"], case["kv_lens"], heads=4, kv_heads=2, head_dim=128, page=16,
                           pages_per_seq=4, max_seqs=4, tokens=24)
    ref = ref_ragged_paged_attention(*args, **kw)
    with tpu_interpret_with_ref_reshapes():
        out = pallas_ragged_paged_attention(*args, block_sizes=BlockSizes(2, 8, 32 * 2**20), **kw)
    np.testing.assert_allclose(np.asarray(out[:real]), np.asarray(ref[:real]), atol=2e-5, rtol=1e-5)


def test_engine_generates_the_same_through_the_kernel(tmp_path):
    save_random_model(tmp_path, "llama", vocab_size=128, hidden_size=256, intermediate_size=256, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    prompts = [[5, 9, 2, 77, 31, 4, 100], [3, 3]]
    params = GenerationParams(max_tokens=4, ignore_eos=True)
    tokens = {}
    for attention in ("reference", "pallas"):
        engine = Engine(EngineConfig(model=tmp_path, dtype="float32", max_model_len=64, max_num_seqs=2,
                                     max_num_batched_tokens=16, page_size=16, attention=attention, progress=False))
        with tpu_interpret_with_ref_reshapes():
            tokens[attention] = [o.token_ids for o in OfflineGenerator(engine).generate(prompts, params)]
    assert tokens["pallas"] == tokens["reference"]
