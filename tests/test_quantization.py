"""int8 weight-only quantization: the rounding, compressed-tensors checkpoints written by the
compressed_tensors library (against transformers loading the same checkpoint), quantization
at load time (against transformers running the same rounded weights), and SmolLM2 int8 vs bf16."""

import json

import moe_int8_models
import numpy as np
import pytest
import torch
from conftest import PROMPTS, chat_prompt_ids, hf_greedy
from ct_int8_checkpoint import write_int8_checkpoint
from moe_int8_models import assert_engine_matches_transformers, engine_config, int8_rounded, token_prompts
from transformers import AutoModelForCausalLM

from tpu_plugins import quantization
from tpu_plugins.engine import Engine
from tpu_plugins.errors import UserError
from tpu_plugins.offline import GenerationParams, OfflineGenerator
from tpu_plugins.quantization import Int8Weight

MODELS = ("llama", "qwen3_moe")


@pytest.fixture(scope="module", params=MODELS)
def float_model(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return request.param, folder, moe_int8_models.save(folder, request.param)


def test_rounding_is_within_half_a_step_per_output_channel():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((96, 40)).astype(np.float32) * np.linspace(0.01, 3, 40, dtype=np.float32)
    w[:, 7] = 0.0                                            # a zero-padded head's column
    q = quantization.quantize(w)
    assert q.values.dtype == np.int8 and q.scale.shape == (40,)
    assert np.abs(q.values).max() == 127 and q.scale[7] == 0
    err = np.abs(quantization.dequantize(q) - w)
    assert (err <= q.scale / 2 + 1e-7).all()


def test_unpacking_reads_compressed_tensors_packing():
    from compressed_tensors.compressors import pack_to_int32

    values = torch.randint(-128, 128, (6, 10), dtype=torch.int8)    # 10 columns: the last word is padded
    packed = pack_to_int32(values, 8).numpy()
    assert packed.shape == (6, 3)
    np.testing.assert_array_equal(quantization.unpack_int32(packed, (6, 10)), values.numpy())


@pytest.mark.parametrize("fmt", ["pack-quantized", "int-quantized"])
def test_compressed_tensors_checkpoint_matches_transformers_loading_it(float_model, fmt, tmp_path):
    """The checkpoint's int8 values and scales are served as they are: the same tokens and
    log-probabilities as transformers, which decompresses the same files on CPU."""
    name, folder, _ = float_model
    if name == "qwen3_moe" and fmt == "int-quantized":
        pytest.skip("transformers 5.19 cannot load int8 (unpacked) MoE experts to serve as the reference")
    write_int8_checkpoint(folder, tmp_path, fmt)
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    engine = Engine(engine_config(tmp_path))
    assert engine.quantization == "int8"
    layer = engine.params["layers"][0]
    assert isinstance(layer["q"], Int8Weight) and layer["q"].values.dtype == np.int8
    assert not isinstance(engine.params["embed"], Int8Weight) and not isinstance(engine.params["lm_head"], Int8Weight)
    if name == "qwen3_moe":
        assert isinstance(layer["experts_down"], Int8Weight) and not isinstance(layer["router"], Int8Weight)
    assert_engine_matches_transformers(engine, reference, 16)


def test_quantizing_at_load_matches_transformers_with_the_same_rounding(float_model):
    """--quantization int8 on a float checkpoint: transformers, given each linear weight
    rounded the same way (per output channel, to 127 steps), produces the same tokens."""
    _, folder, model = float_model
    engine = Engine(engine_config(folder, quantization="int8"))
    rounded = int8_rounded(model)
    batch = token_prompts()
    outs = OfflineGenerator(engine).generate(batch, GenerationParams(max_tokens=16, ignore_eos=True))
    assert [o.token_ids for o in outs] == [hf_greedy(rounded, p, 16, stop_at_eos=False) for p in batch]
    float_engine = Engine(engine_config(folder))

    def linear_bytes(params):
        return sum(leaf.nbytes for layer in params["layers"] for name, w in layer.items() if name in quantization.QUANTIZED
                   for leaf in (w if isinstance(w, Int8Weight) else (w,)))
    # fp32 -> int8 values plus one float32 scale per output column
    assert linear_bytes(engine.params) < 0.3 * linear_bytes(float_engine.params)


def _with_quantization_config(folder, tmp_path, qc):
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = qc
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("qc, message", [
    ({"quant_method": "awq", "bits": 4}, "quantized with 'awq'"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group"}}}},
     "group 'group_0' has weights"),
])
def test_unsupported_checkpoint_quantization_is_a_user_error(float_model, tmp_path, qc, message):
    _, folder, _ = float_model
    with pytest.raises(UserError, match=message):
        Engine(engine_config(_with_quantization_config(folder, tmp_path, qc)))


def test_unknown_quantization_method_is_a_user_error(float_model):
    _, folder, _ = float_model
    with pytest.raises(UserError, match="quantization 'int4' is not supported"):
        Engine(engine_config(folder, quantization="int4"))


def test_smollm2_int8_follows_bf16(demo_model_path):
    """The demo model (SmolLM2-135M) in bf16 and with int8 weights, teacher-forced on the same
    text: the next-token choice agrees at most positions and the logits stay close. The
    figures for the closing note come from bench/quantization_moe.py; this guards them."""
    from transformers import AutoTokenizer

    from tpu_plugins import quality

    tokenizer = AutoTokenizer.from_pretrained(demo_model_path)
    report = quality.compare(demo_model_path, [chat_prompt_ids(tokenizer, p) for p in PROMPTS],
                             baseline=dict(dtype="bfloat16"), candidate=dict(dtype="bfloat16", quantization="int8"),
                             max_tokens=16)
    assert report["top1_agreement"] >= 0.9, report
    assert report["greedy_prefix_mean"] >= 4, report
    assert report["weight_bytes_ratio"] < 0.65, report
