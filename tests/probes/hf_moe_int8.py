"""Probe: mixture-of-experts models and int8 weights (Int8Config, a compressed-tensors
checkpoint) on "tpu" against plain transformers on the CPU. Prints one JSON document.

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
# A compressed-tensors int8 checkpoint: transformers' own compressed-tensors quantizer loads it
# onto "tpu" (packed int32 values and scales on the device); generate() reads those as they are.
from ct_int8_checkpoint import write_int8_checkpoint  # noqa: E402

write_int8_checkpoint(scratch / "llama", scratch / "llama_ct", "pack-quantized")
reference = AutoModelForCausalLM.from_pretrained(scratch / "llama_ct", dtype=torch.float32).eval()
model = AutoModelForCausalLM.from_pretrained(scratch / "llama_ct", device_map="tpu", dtype=torch.float32)
# Before run(): transformers' first plain forward decompresses each layer to float weights.
loaded = sorted(f"{n}:{t.dtype}:{t.device}" for n, t in model.model.layers[0].self_attn.q_proj.named_parameters())
out["llama_compressed_tensors"] = {**run(model, reference), "q_proj_tensors": loaded}
print(json.dumps(out))
