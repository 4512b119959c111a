"""Probe: mixture-of-experts models and int8 weights (Int8Config) on "tpu" against plain
transformers on the CPU. Prints one JSON document.

argv: a scratch folder for random models. Run with TPU_PLUGINS_DEVICE=tpu.
"""

import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import moe_int8_models  # noqa: E402
from conftest import hf_greedy  # noqa: E402
from moe_int8_models import int8_rounded, token_prompts  # noqa: E402

from hf_tpu.generation import built_engine  # noqa: E402
from hf_tpu.quantization import Int8Config, Int8Linear  # noqa: E402

scratch = Path(sys.argv[1])
prompt = token_prompts()[0]
out = {}


def run(model, reference):
    ids = torch.tensor([prompt], device="tpu")
    generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                               eos_token_id=[], pad_token_id=0)
    with torch.no_grad():   # a plain forward runs op by op, not on the engine
        logits = model(ids).logits.cpu()
        want = reference(torch.tensor([prompt])).logits
    return {"tokens_equal": generated[0, len(prompt):].cpu().tolist() == hf_greedy(reference, prompt, 12, stop_at_eos=False),
            "engine": built_engine(model).describe(), "forward_max_error": float((logits - want).abs().max())}


for name in ("qwen3_moe", "mixtral"):
    folder = scratch / name
    reference = moe_int8_models.save(folder, name)
    out[name] = run(AutoModelForCausalLM.from_pretrained(folder, device_map="tpu", dtype=torch.float32), reference)

for name in ("llama", "mixtral"):
    folder = scratch / name
    reference = moe_int8_models.save(folder, name)
    model = AutoModelForCausalLM.from_pretrained(folder, device_map="tpu", dtype=torch.float32,
                                                 quantization_config=Int8Config())
    q = model.model.layers[0].self_attn.q_proj
    out[f"{name}_int8"] = {
        **run(model, int8_rounded(reference, experts=False)),
        "q_proj": [type(q).__name__, str(q.weight.dtype), str(q.weight.device)],
        "lm_head": type(model.lm_head).__name__, "int8_linears": sum(isinstance(m, Int8Linear) for m in model.modules())}
print(json.dumps(out))
