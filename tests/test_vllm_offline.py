"""vLLM's offline LLM API and `vllm serve` start-up on the tpu-plugins platform: tensor parallelism
on a simulated slice, prefix caching on and off, mixture-of-experts models with expert
parallelism, int8 weights (--quantization int8 and compressed-tensors checkpoints), and
configuration errors."""

import json
import subprocess
import sys

import pytest
import torch
import moe_int8_models
from conftest import REPO, clean_env, hf_greedy
from moe_int8_models import int8_rounded, token_prompts
from servers import BIN
from transformers import AutoConfig, AutoModelForCausalLM

GENERATE = """
import json, os, sys
from tpu_plugins import demo_model
from vllm import LLM, SamplingParams
if __name__ == "__main__":
    llm = LLM(model=str(demo_model.prepare()), dtype="float32", max_model_len=256, max_num_seqs=4,
              max_num_batched_tokens=64, **json.loads(sys.argv[1]))
    prompts = ["The capital of France is", "Water boils at", "The largest planet is", "Hello, my name is"] * 2
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    print("RESULT", json.dumps([list(o.outputs[0].token_ids) for o in outs]), flush=True)
"""


def run_llm(script: str, sim_devices: int, llm_kwargs: dict) -> tuple[list, str]:
    """Run a vLLM script in a fresh interpreter: (its RESULT line parsed, its whole log)."""
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(llm_kwargs)], capture_output=True, text=True,
                          timeout=600, cwd=REPO, env=clean_env(TPU_PLUGINS_DEVICE="tpu",
                                                               TPU_PLUGINS_SIM_DEVICES=str(sim_devices)))
    assert proc.returncode == 0, proc.stderr[-4000:]
    # vLLM logs to stdout too: the result is the line we mark.
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    return result, proc.stdout + proc.stderr


def generate(sim_devices: int = 1, **llm_kwargs):
    return run_llm(GENERATE, sim_devices, llm_kwargs)[0]


@pytest.fixture(scope="module")
def tp1_tokens():
    return generate()


def test_tensor_parallel_2_on_a_simulated_slice_equals_tp1(tp1_tokens):
    # SmolLM2's 9 query heads do not divide by 2: the core pads whole GQA groups (see sharding.py).
    assert generate(sim_devices=2, tensor_parallel_size=2) == tp1_tokens


def test_prefix_caching_off_gives_the_same_outputs(tp1_tokens):
    # The prompts repeat, so the default run (prefix caching on) served the repeats from cache.
    assert tp1_tokens[:4] == tp1_tokens[4:]
    assert generate(enable_prefix_caching=False) == tp1_tokens


def serve_error(*args, **env) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "vllm"), "serve", *args], capture_output=True, text=True, timeout=300,
                          env=clean_env(**env), cwd=REPO)


def test_unsupported_architecture_is_a_one_line_startup_error(tmp_path, demo_model_path):
    config = AutoConfig.for_model("gpt2", n_layer=1, n_embd=32, n_head=2, vocab_size=100)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(tmp_path)
    proc = serve_error(str(tmp_path), "--device", "tpu", "--port", "0", "--tokenizer", str(demo_model_path))
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("vllm serve: error: Unsupported architecture ['GPT2LMHeadModel']")
    assert "LlamaForCausalLM" in last and "Qwen3ForCausalLM" in last


def test_tensor_parallel_larger_than_the_chips_is_a_one_line_startup_error(demo_model_path):
    # --quantization int8 passes vLLM's own checks of the method name (our registration) to reach this one
    proc = serve_error(str(demo_model_path), "--device", "tpu", "--quantization", "int8", "--tensor-parallel-size", "4")
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        "vllm serve: error: --tensor-parallel-size 4 needs 4 chips, but 1 are visible on this host. To span several "
        "hosts add --distributed-executor-backend ray (README: Multi-host slices); on a CPU host simulate a slice "
        "with TPU_PLUGINS_SIM_DEVICES=4.")


def test_other_device_values_are_refused(demo_model_path):
    proc = serve_error(str(demo_model_path), "--device", "cuda", TPU_PLUGINS_DEVICE="tpu")
    assert proc.returncode != 0
    assert "--device 'cuda' is not available here" in proc.stderr and "VLLM_TARGET_DEVICE=cpu" in proc.stderr


GENERATE_IDS = """
import json, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
if __name__ == "__main__":
    args = json.loads(sys.argv[1])
    prompts = args.pop("prompts")
    # a small KV pool: sized from the memory budget, a tiny model would get gigabytes of pages
    llm = LLM(max_model_len=128, max_num_seqs=4, max_num_batched_tokens=64, num_gpu_blocks_override=64, **args)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    print("RESULT", json.dumps([list(o.outputs[0].token_ids) for o in outs]), flush=True)
"""


def generate_ids(sim_devices: int = 1, **llm_kwargs):
    """(token ids per prompt, the engine's log line naming its mesh and weights)."""
    result, log = run_llm(GENERATE_IDS, sim_devices, llm_kwargs)
    return result, next(line for line in log.splitlines() if "on a mesh of" in line)


def test_qwen3_moe_with_expert_parallelism_gives_transformers_tokens(tmp_path, demo_model_path):
    """--tensor-parallel-size 2 --enable-expert-parallel on a simulated 2-chip slice."""
    model = moe_int8_models.save(tmp_path, "qwen3_moe")
    prompts = token_prompts()
    got, engine = generate_ids(sim_devices=2, model=str(tmp_path), tokenizer=str(demo_model_path), dtype="float32",
                               tensor_parallel_size=2, enable_expert_parallel=True, prompts=prompts)
    assert "{'data': 1, 'expert': 2, 'model': 1}" in engine
    assert got == [hf_greedy(model, p, 12, stop_at_eos=False) for p in prompts]


def test_mixtral_with_int8_quantization_gives_transformers_tokens_of_the_rounded_weights(tmp_path, demo_model_path):
    """--quantization int8 on a float checkpoint: transformers with each linear weight rounded
    the same way (per output channel) is the reference."""
    model = moe_int8_models.save(tmp_path, "mixtral")
    prompts = token_prompts()
    got, engine = generate_ids(model=str(tmp_path), tokenizer=str(demo_model_path), dtype="float32",
                               quantization="int8", prompts=prompts)
    assert "weights float32 + int8" in engine
    assert got == [hf_greedy(int8_rounded(model), p, 12, stop_at_eos=False) for p in prompts]


def test_compressed_tensors_int8_checkpoint_is_served_as_the_core_serves_it(tmp_path, demo_model_path):
    """vLLM detects the checkpoint's quantization itself (compressed-tensors, bf16 only in vLLM's
    checks); the tokens equal the core engine's on the same checkpoint, which test_quantization
    checks against transformers loading it."""
    from ct_int8_checkpoint import write_int8_checkpoint

    from tpu_plugins.engine import Engine, EngineConfig
    from tpu_plugins.offline import GenerationParams, OfflineGenerator

    moe_int8_models.save(tmp_path / "float", "llama")
    write_int8_checkpoint(tmp_path / "float", tmp_path / "int8", "pack-quantized")
    prompts = token_prompts()
    got, log = generate_ids(model=str(tmp_path / "int8"), tokenizer=str(demo_model_path), dtype="bfloat16",
                            prompts=prompts)
    assert "weights bfloat16 + int8" in log
    engine = Engine(EngineConfig(model=tmp_path / "int8", dtype="bfloat16", max_model_len=128, max_num_seqs=4,
                                 max_num_batched_tokens=64, progress=False))
    assert engine.quantization == "int8"
    outs = OfflineGenerator(engine).generate(prompts, GenerationParams(max_tokens=12, ignore_eos=True))
    assert got == [o.token_ids for o in outs]

