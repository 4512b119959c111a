"""Plain transformers code on the "tpu" device: from_pretrained(device_map="tpu") and generate().

    TPU_PLUGINS_DEVICE=tpu .venv/bin/python examples/hf_transformers.py [--model PATH] [--prompt TEXT]

On a TPU host the variable is not needed. Nothing below is specific to tpu-plugins except the
device name.
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tpu_plugins import demo_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="Hugging Face model folder (default: the embedded demo model)")
    parser.add_argument("--prompt", default="What is the capital of France?")
    args = parser.parse_args()
    if not hasattr(torch, "tpu"):
        raise SystemExit('torch has no "tpu" device here: run with TPU_PLUGINS_DEVICE=tpu (or on a TPU host).')

    path = args.model or demo_model.prepare()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, device_map="tpu")
    messages = [{"role": "user", "content": args.prompt}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True).to("tpu")
    out = model.generate(**inputs, max_new_tokens=48, do_sample=False)
    print(f"model on {model.device}; output ids {out.dtype} on {out.device}")
    print(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:].cpu(), skip_special_tokens=True))


if __name__ == "__main__":
    main()
