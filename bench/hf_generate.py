"""transformers `generate()` on "tpu" against plain torch on the CPU, same prompts, one run.

SmolLM2-135M-Instruct in float32, greedy, 64 new tokens per sequence (EOS ignored), batch 1
and batch 8 (left-padded prompts of 40 to 120 tokens). Three ways: `device_map="tpu"` with the
fast path (generate on the core engine; here JAX's CPU backend stands in for the TPU), the same
model op by op (`hf_tpu.generation.op_by_op()`: transformers' own loop, one JAX call per torch
op), and the model on torch's CPU. Each is run once untimed first (compilation, caches), then
timed; tok/s counts new tokens per second of wall time.
Last line: hf_tpu_tok_s=<x> torch_cpu_tok_s=<y> ratio=<x/y> (the fast path, both batches).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TPU_PLUGINS_DEVICE", "tpu")   # before torch: the "tpu" device registers at import
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from common import prompt_token_ids  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from hf_tpu.generation import op_by_op  # noqa: E402
from tpu_plugins import demo_model  # noqa: E402


def batch_inputs(tokenizer, prompts: list[list[int]], device: str) -> dict:
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id or 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}


def timed_generate(model, inputs, new_tokens: int) -> tuple[float, torch.Tensor]:
    kwargs = dict(max_new_tokens=new_tokens, do_sample=False, eos_token_id=[], pad_token_id=0)
    model.generate(**inputs, **kwargs)                      # untimed: compilation and caches
    start = time.perf_counter()
    out = model.generate(**inputs, **kwargs)
    return time.perf_counter() - start, out.cpu()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--skip-op-by-op", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)

    path = demo_model.prepare()
    tokenizer = AutoTokenizer.from_pretrained(path)
    cpu = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tpu = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, device_map="tpu")
    totals = {"fast": [0, 0.0], "cpu": [0, 0.0]}
    print(f"{'batch':>5} {'path':>22} {'seconds':>8} {'tok/s':>8} {'vs torch cpu':>12}  same tokens as cpu")
    for batch in args.batches:
        prompts = prompt_token_ids(tokenizer, batch, 40, 120, seed=batch)
        tokens = batch * args.new_tokens
        cpu_s, cpu_out = timed_generate(cpu, batch_inputs(tokenizer, prompts, "cpu"), args.new_tokens)
        fast_s, fast_out = timed_generate(tpu, batch_inputs(tokenizer, prompts, "tpu"), args.new_tokens)
        rows = [("torch cpu", cpu_s, cpu_out), ("tpu fast path (engine)", fast_s, fast_out)]
        if not args.skip_op_by_op:
            with op_by_op():
                slow_s, slow_out = timed_generate(tpu, batch_inputs(tokenizer, prompts, "tpu"), args.new_tokens)
            rows.append(("tpu op by op", slow_s, slow_out))
        for name, seconds, out in rows:
            same = bool((out == cpu_out).all())
            print(f"{batch:>5} {name:>22} {seconds:>8.2f} {tokens / seconds:>8.1f} {cpu_s / seconds:>11.2f}x  {same}")
        totals["fast"][0] += tokens
        totals["fast"][1] += fast_s
        totals["cpu"][0] += tokens
        totals["cpu"][1] += cpu_s
    x = totals["fast"][0] / totals["fast"][1]
    y = totals["cpu"][0] / totals["cpu"][1]
    print(f"hf_tpu_tok_s={x:.2f} torch_cpu_tok_s={y:.2f} ratio={x / y:.2f}")


if __name__ == "__main__":
    main()
