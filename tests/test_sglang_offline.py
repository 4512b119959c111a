"""SGLang's offline `sgl.Engine` API on the TPU platform: tensor parallelism over a simulated
2-chip slice, mixture-of-experts models with expert parallelism and int8 weights, checked
against plain transformers; and the platform's start-up checks."""

import json
import subprocess
import sys

import moe_int8_models
import torch
from conftest import clean_env, hf_greedy
from moe_int8_models import int8_rounded, token_prompts
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = ["The capital of France is", "Three colours of the rainbow are"]

ENGINE_SCRIPT = """
import json, sys
import sglang as sgl

if __name__ == "__main__":
    llm = sgl.Engine(model_path=sys.argv[1], device="tpu", tp_size=2, dtype="float32", context_length=256,
                     max_total_tokens=2048, max_running_requests=4, chunked_prefill_size=64, log_level="error")
    prompts = json.loads(sys.argv[2])
    outs = llm.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 16,
                                                            "ignore_eos": True})
    info = llm.get_server_info()
    llm.shutdown()
    print(json.dumps({"ids": [o["output_ids"] for o in outs], "device": info["device"]}))
"""


def test_offline_engine_with_tensor_parallelism_equals_transformers(demo_model_path, tmp_path):
    tok = AutoTokenizer.from_pretrained(demo_model_path)
    model = AutoModelForCausalLM.from_pretrained(demo_model_path, dtype=torch.float32).eval()
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    script = tmp_path / "offline.py"
    script.write_text(ENGINE_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(demo_model_path), json.dumps(prompts)],
                          capture_output=True, text=True, timeout=600,
                          env=clean_env(TPU_PLUGINS_DEVICE="tpu", TPU_PLUGINS_SIM_DEVICES="2"))
    assert proc.returncode == 0, proc.stderr[-5000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["device"] == "tpu"
    for ids, out in zip(prompts, result["ids"]):
        assert out == hf_greedy(model, ids, 16, stop_at_eos=False)


def test_unsupported_dtype_ends_launch_server_with_one_line(demo_model_path):
    proc = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--model-path", str(demo_model_path),
                           "--device", "tpu", "--dtype", "float16", "--port", "1"],
                          capture_output=True, text=True, timeout=300, env=clean_env())
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        "sglang.launch_server: error: --dtype float16 is not supported on TPU; use bfloat16, float32 or auto.")


ENGINE_IDS_SCRIPT = """
import json, sys
import sglang as sgl

if __name__ == "__main__":
    kwargs, prompts = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    llm = sgl.Engine(device="tpu", context_length=128, max_total_tokens=1024, max_running_requests=4,
                     chunked_prefill_size=64, log_level="info", **kwargs)
    outs = llm.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 12,
                                                            "ignore_eos": True})
    llm.shutdown()
    print(json.dumps([o["output_ids"] for o in outs]))
"""


def engine_ids(tmp_path, prompts, sim_devices=1, **kwargs):
    script = tmp_path / "engine_ids.py"
    script.write_text(ENGINE_IDS_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), json.dumps(kwargs), json.dumps(prompts)],
                          capture_output=True, text=True, timeout=600,
                          env=clean_env(TPU_PLUGINS_DEVICE="tpu", TPU_PLUGINS_SIM_DEVICES=str(sim_devices)))
    assert proc.returncode == 0, proc.stderr[-5000:]
    engine_line = next(line for line in (proc.stdout + proc.stderr).splitlines() if "on a mesh of" in line)
    return json.loads(proc.stdout.strip().splitlines()[-1]), engine_line


def test_mixtral_with_expert_parallelism_and_int8_gives_transformers_tokens_of_the_rounded_weights(
        tmp_path, demo_model_path):
    """--tp-size 2 --ep-size 2 --quantization int8 on a simulated 2-chip slice; the reference is
    transformers with each linear weight rounded the same way (per output channel)."""
    model = moe_int8_models.save(tmp_path / "model", "mixtral")
    prompts = token_prompts()
    got, engine = engine_ids(tmp_path, prompts, sim_devices=2, model_path=str(tmp_path / "model"),
                             tokenizer_path=str(demo_model_path), dtype="float32", tp_size=2, ep_size=2,
                             quantization="int8")
    assert "{'data': 1, 'expert': 2, 'model': 1}, weights float32 + int8" in engine
    assert got == [hf_greedy(int8_rounded(model), p, 12, stop_at_eos=False) for p in prompts]


def test_qwen3_moe_compressed_tensors_int8_checkpoint_gives_transformers_tokens(tmp_path, demo_model_path):
    """SGLang detects the compressed-tensors checkpoint itself; transformers decompressing the same
    files on CPU is the reference."""
    from ct_int8_checkpoint import write_int8_checkpoint

    moe_int8_models.save(tmp_path / "float", "qwen3_moe")
    write_int8_checkpoint(tmp_path / "float", tmp_path / "int8", "pack-quantized")
    reference = AutoModelForCausalLM.from_pretrained(tmp_path / "int8", dtype=torch.float32).eval()
    prompts = token_prompts()
    got, engine = engine_ids(tmp_path, prompts, model_path=str(tmp_path / "int8"),
                             tokenizer_path=str(demo_model_path), dtype="float32")
    assert "Qwen3MoeForCausalLM" in engine and "weights float32 + int8" in engine
    assert got == [hf_greedy(reference, p, 12, stop_at_eos=False) for p in prompts]


def test_expert_parallel_size_that_does_not_divide_tp_is_a_one_line_error(demo_model_path):
    # --quantization int8 passes SGLang's argparse choices (extended by our plugin) to reach this check
    proc = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--model-path", str(demo_model_path),
                           "--device", "tpu", "--quantization", "int8", "--tp-size", "2", "--ep-size", "4",
                           "--port", "1"],
                          capture_output=True, text=True, timeout=300, env=clean_env())
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        "sglang.launch_server: error: --ep-size 4 must divide --tp-size 2: the experts are split over 4 of the "
        "2 tensor-parallel chips.")
