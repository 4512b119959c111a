"""Mixture-of-experts (Qwen3-MoE, Mixtral) from small random-weight configs against plain
transformers (fp32), the megablox kernel against XLA's ragged_dot, and expert parallelism on
a simulated 4-chip slice."""

import moe_int8_models
import numpy as np
import pytest
from conftest import hf_greedy, run_json
from moe_int8_models import MODELS, assert_engine_matches_transformers, engine_config, token_prompts

from tpu_plugins.engine import Engine
from tpu_plugins.errors import UserError
from tpu_plugins.offline import GenerationParams, OfflineGenerator

MOE_MODELS = ("qwen3_moe", "mixtral")


@pytest.fixture(scope="module", params=MOE_MODELS)
def moe_model(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return request.param, folder, moe_int8_models.save(folder, request.param)


def test_moe_model_matches_transformers(moe_model):
    name, folder, model = moe_model
    engine = Engine(engine_config(folder))
    assert engine.model_config.moe is not None and engine.moe.implementation == "reference"
    if name == "qwen3_moe":
        assert "router" not in engine.params["layers"][1] and "router" in engine.params["layers"][2]
    assert_engine_matches_transformers(engine, model, 24)


def test_live_transformers_model_weights_with_fused_experts(moe_model):
    """transformers 5 keeps experts fused in memory (gate_up_proj [E, 2I, D]); the HF path builds
    the engine from those tensors, not from the per-expert checkpoint names."""
    name, folder, model = moe_model
    state = model.state_dict()
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in state)
    weights = [(k, (lambda v=v: v.detach().numpy())) for k, v in state.items()]
    engine = Engine(engine_config(folder), weights=weights)
    batch = token_prompts()[:2]
    outs = OfflineGenerator(engine).generate(batch, GenerationParams(max_tokens=12, ignore_eos=True))
    assert [o.token_ids for o in outs] == [hf_greedy(model, p, 12, stop_at_eos=False) for p in batch]


def test_megablox_matches_ragged_dot_in_tpu_interpret_mode():
    """The Pallas kernel (TPU interpret mode on this CPU) against XLA's ragged_dot, with an empty
    group and rows past the last group (which megablox leaves unwritten)."""
    import jax.numpy as jnp

    from tpu_plugins.models import moe

    rng = np.random.default_rng(0)
    rows = jnp.asarray(rng.standard_normal((64, 64)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((4, 64, 96)), jnp.float32)
    sizes = jnp.asarray([7, 0, 30, 11], jnp.int32)          # 48 of 64 rows in groups
    row_expert = jnp.zeros(64, jnp.int32)
    ref = moe._grouped_matmul(rows, w, sizes, row_expert, moe.MoeSpec(4, 2, True, "reference"))
    got = moe._grouped_matmul(rows, w, sizes, row_expert, moe.MoeSpec(4, 2, True, "megablox", interpret=True))
    np.testing.assert_allclose(np.asarray(got)[:48], np.asarray(ref)[:48], rtol=1e-5, atol=1e-4)
    expected = np.concatenate([np.asarray(rows[a:b]) @ np.asarray(w[g]) for g, (a, b) in
                               enumerate([(0, 7), (7, 7), (7, 37), (37, 48)])])
    np.testing.assert_allclose(np.asarray(ref)[:48], expected, rtol=1e-5, atol=1e-4)


EP_RUN = """
import json, sys, tempfile, numpy as np
sys.path.insert(0, "tests")
from conftest import hf_greedy
from moe_int8_models import engine_config, save, token_prompts
from test_moe import MOE_MODELS
from tpu_plugins.engine import Engine
from tpu_plugins.offline import GenerationParams, OfflineGenerator
result = {}
for name in MOE_MODELS:
    folder = tempfile.mkdtemp()
    model = save(folder, name)
    batch = token_prompts()
    ref = [hf_greedy(model, p, 12, stop_at_eos=False) for p in batch]
    for tp, ep, impl in ((4, 2, "reference"), (4, 4, "reference"), (2, 2, "megablox")):
        engine = Engine(engine_config(folder, tensor_parallel_size=tp, expert_parallel_size=ep, moe=impl))
        layer = next(l for l in engine.params["layers"] if "router" in l)
        outs = OfflineGenerator(engine).generate(batch, GenerationParams(max_tokens=12, ignore_eos=True))
        result[f"{name} tp={tp} ep={ep} {impl}"] = {
            "equal": [o.token_ids == r for o, r in zip(outs, ref)],
            "mesh": dict(engine.mesh.shape),
            "expert_shard": list(layer["experts_gate"].addressable_shards[0].data.shape),
            "expert_shape": list(layer["experts_gate"].shape)}
print(json.dumps(result))
"""


def test_expert_parallel_on_a_simulated_slice_gives_transformers_tokens():
    result = run_json(EP_RUN, TPU_PLUGINS_SIM_DEVICES="4")
    assert len(result) == 6
    for key, r in result.items():
        assert all(r["equal"]), key
        tp, ep = int(key.split("tp=")[1].split()[0]), int(key.split("ep=")[1].split()[0])
        assert r["mesh"] == {"data": 1, "expert": ep, "model": tp // ep}, key
        experts, hidden, inter = r["expert_shape"]
        # each chip holds experts/ep whole experts' rows, intermediate split over the model axis
        assert r["expert_shard"] == [experts // ep, hidden, inter // (tp // ep)], key


def test_expert_parallel_sizes_that_do_not_fit_are_user_errors(moe_model):
    name, folder, _ = moe_model
    with pytest.raises(UserError, match="must divide tensor_parallel_size"):
        Engine(engine_config(folder, tensor_parallel_size=2, expert_parallel_size=4))
    experts = MODELS[name].get("num_experts") or MODELS[name]["num_local_experts"]
    with pytest.raises(UserError, match=f"{experts} experts do not divide"):
        Engine(engine_config(folder, tensor_parallel_size=3, expert_parallel_size=3))
    with pytest.raises(UserError, match="moe='gmm' is not one of"):
        Engine(engine_config(folder, moe="gmm"))
