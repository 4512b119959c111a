"""SGLang's offline `sgl.Engine` API on the TPU platform: tensor parallelism over a simulated
2-chip slice, checked against plain transformers; and the platform's start-up checks."""

import json
import subprocess
import sys

import torch
from conftest import clean_env, hf_greedy
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
